"""Raw header editing on the link's hot path: x-received-from is prepended, every other
property and header value is kept byte for byte."""

from __future__ import annotations

import pytest

from amqpd.protocol import codec
from plugins.federation.headers import (
    ROUTING_HEADER,
    RawHeaders,
    first_hop_redelivered,
    forward_ok,
    prepend_raw,
)
from plugins.shovel import methods

HOP = {"uri": "amqp://up/%2F", "exchange": "x", "redelivered": False,
       "cluster-name": "up", "vhost": "/"}


def _raw(**props: object) -> bytes:
    return codec.encode_properties(props)


@pytest.mark.parametrize("props", [
    {},
    {"delivery_mode": 2, "message_id": "m1"},
    {"content_type": "text/plain", "content_encoding": "gzip", "priority": 3,
     "headers": {"a": "b", "n": 5}, "timestamp": 1_700_000_000, "user_id": "guest"},
])
def test_prepend_keeps_the_other_properties(props: dict[str, object]) -> None:
    raw = _raw(**props)
    h = RawHeaders.parse(raw)
    assert h.decoded(ROUTING_HEADER) is None
    prepend_raw(h, ROUTING_HEADER, HOP)
    out = codec.decode_properties(h.encode())
    expected = codec.decode_properties(raw)
    expected["headers"] = {**(expected.get("headers") or {}), ROUTING_HEADER: [HOP]}
    assert out == expected


def test_existing_hops_kept_byte_for_byte_and_new_one_first() -> None:
    # a long (l) in a header and in the previous hop: a decode/encode would shrink them
    old_hop = methods.field_value({"cluster-name": "far", "vhost": "/", "hops": 7})
    array = b"A" + len(old_hop).to_bytes(4, "big") + old_hop
    table = b"\x05count" + methods.field_value(5) + bytes((len(ROUTING_HEADER),)) \
        + ROUTING_HEADER.encode() + array
    raw = (1 << 13).to_bytes(2, "big") + len(table).to_bytes(4, "big") + table
    h = RawHeaders.parse(raw)
    assert h.decoded(ROUTING_HEADER) == [{"cluster-name": "far", "vhost": "/", "hops": 7}]
    prepend_raw(h, ROUTING_HEADER, HOP)
    out = h.encode()
    assert b"\x05countl" + (5).to_bytes(8, "big") in out
    assert old_hop in out
    decoded = codec.decode_properties(out)["headers"][ROUTING_HEADER]
    assert decoded[0] == HOP and decoded[1]["cluster-name"] == "far"


def test_forward_ok_is_should_forward() -> None:
    assert forward_ok(None, 1, "down", "/")
    assert not forward_ok([HOP], 1, "down", "/")  # max-hops reached
    assert forward_ok([HOP], 2, "down", "/")
    assert not forward_ok([{**HOP, "cluster-name": "down"}], 5, "down", "/")  # a loop


def test_garbage_is_refused() -> None:
    raw = (1 << 13).to_bytes(2, "big") + (9).to_bytes(4, "big") + b"\x01kZ" + b"\x00" * 6
    with pytest.raises(ValueError):
        RawHeaders.parse(raw)


def test_queue_link_counts_visits_and_keeps_other_hops() -> None:
    from types import SimpleNamespace

    from plugins.federation.queue_link import QueueLink
    from plugins.shovel.seen import Seen
    from plugins.shovel.wire import Delivery

    link = object.__new__(QueueLink)
    link.uri = "amqp://up/%2F"
    link.name = "work"
    link.upstream = SimpleNamespace(queue="work", exchange=None)  # type: ignore[assignment]
    link.seen = Seen()  # forwarded-before window, normally made by the link's __init__
    first = RawHeaders.parse(_raw(headers={"CC": ["x"], "keep": 1}))
    link._headers(Delivery(1, False, "ex", "rk", b"", b""), first)
    h1 = codec.decode_properties(first.encode())["headers"]
    assert h1[ROUTING_HEADER] == [{"uri": "amqp://up/%2F", "queue": "work",
                                   "redelivered": False, "visit-count": 1}]
    assert h1["x-original-exchange"] == "ex" and h1["x-original-routing-key"] == "rk"
    assert h1["x-original-cc"] == ["x"] and "CC" not in h1 and h1["keep"] == 1
    # back through the same upstream, after a hop elsewhere: counted, the other hop kept
    other = {"uri": "amqp://elsewhere/%2F", "queue": "work", "visit-count": 1}
    again = RawHeaders.parse(_raw(headers={ROUTING_HEADER: [other, h1[ROUTING_HEADER][0]]}))
    link._headers(Delivery(2, True, "", "work", b"", b""), again)
    h2 = codec.decode_properties(again.encode())["headers"]
    assert h2[ROUTING_HEADER][0]["visit-count"] == 2 and h2[ROUTING_HEADER][0]["redelivered"]
    assert h2[ROUTING_HEADER][1] == other
    assert "x-original-exchange" not in h2


def test_first_hop_redelivered_marks_only_the_links_own_hop() -> None:
    older = {**HOP, "uri": "amqp://older/%2F", "redelivered": False}
    h = RawHeaders.parse(_raw(delivery_mode=2, headers={"k": "v",
                                                        ROUTING_HEADER: [older]}))
    prepend_raw(h, ROUTING_HEADER, HOP)
    out = codec.decode_properties(first_hop_redelivered(h.encode()))
    assert out["delivery_mode"] == 2
    assert out["headers"]["k"] == "v"
    assert out["headers"][ROUTING_HEADER] == [{**HOP, "redelivered": True}, older]


@pytest.mark.parametrize("raw", [_raw(), _raw(headers={"k": "v"}),
                                 _raw(headers={ROUTING_HEADER: "not an array"})])
def test_first_hop_redelivered_leaves_messages_without_a_hop(raw: bytes) -> None:
    assert first_hop_redelivered(raw) == raw
