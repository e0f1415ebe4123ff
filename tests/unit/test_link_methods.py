"""The link client's own method encoding: any UTF-8 name, integers as 64-bit longs, and
no change to pamqp for the rest of the process (issue 18: the federation plugin used to
patch pamqp's name patterns and integer encoder process-wide)."""

from __future__ import annotations

import re

import pytest
from pamqp import commands, constants, encode
from pamqp import frame as pframe

from plugins.shovel import methods


def test_names_pamqp_refuses_are_encoded() -> None:
    name = "federation: x -> down"
    frame = methods.queue_declare(5, name, False, True, False, False, {"x-max-hops": 1})
    _, channel, method = pframe.unmarshal(frame)
    assert channel == 5
    assert isinstance(method, commands.Queue.Declare)
    assert method.queue == name and method.durable and not method.passive
    assert method.arguments == {"x-max-hops": 1}
    # and the integer went out as a long ('l', 8 bytes), as RabbitMQ's clients send it
    assert b"x-max-hopsl" + (1).to_bytes(8, "big") in frame


@pytest.mark.parametrize("frame,expected", [
    (methods.queue_bind(1, "q", "e", "k", None),
     commands.Queue.Bind(queue="q", exchange="e", routing_key="k")),
    (methods.queue_delete(1, "q"), commands.Queue.Delete(queue="q")),
    (methods.exchange_declare(1, "e", "fanout", True, True, False, True, None),
     commands.Exchange.Declare(exchange="e", exchange_type="fanout", passive=True,
                               durable=True, internal=True)),
    (methods.exchange_delete(1, "e"), commands.Exchange.Delete(exchange="e")),
    (methods.exchange_bind(1, "d", "s", "k", None, unbind=False),
     commands.Exchange.Bind(destination="d", source="s", routing_key="k")),
    (methods.exchange_bind(1, "d", "s", "k", None, unbind=True),
     commands.Exchange.Unbind(destination="d", source="s", routing_key="k")),
    (methods.basic_consume(1, "q", "tag", True, None),
     commands.Basic.Consume(queue="q", consumer_tag="tag", no_ack=True)),
    (methods.basic_cancel(1, "tag"), commands.Basic.Cancel(consumer_tag="tag")),
])
def test_plain_methods_match_pamqp_byte_for_byte(frame: bytes, expected: object) -> None:
    assert frame == pframe.marshal(expected, 1)  # type: ignore[arg-type]


def test_tables_round_trip() -> None:
    value = {"s": "text", "i": -5, "big": 1 << 40, "f": 1.5, "t": True, "n": None,
             "a": [1, "x", {"k": 2}], "nested": {"deep": [False]}}
    _, _, method = pframe.unmarshal(methods.queue_declare(1, "q", False, False, False, False,
                                                          value))
    assert isinstance(method, commands.Queue.Declare)
    assert method.arguments == value


def test_overlong_name_refused() -> None:
    with pytest.raises(ValueError):
        methods.queue_delete(1, "x" * 256)


def test_loading_federation_leaves_pamqp_alone() -> None:
    import plugins.federation
    import plugins.federation.exchange_link
    import plugins.federation.queue_link  # noqa: F401

    assert isinstance(constants.DOMAIN_REGEX["exchange-name"], re.Pattern)
    assert not constants.DOMAIN_REGEX["exchange-name"].fullmatch("federation: x -> y")
    assert encode.table_integer(1)[:1] == b"b"
    with pytest.raises(ValueError):
        commands.Queue.Declare(queue="federation: x -> down")
