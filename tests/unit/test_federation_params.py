"""Federation without sockets: upstream validation/defaults, sets, loop rules, names."""

from __future__ import annotations

import pytest

from amqpd.broker.message import Message
from amqpd.broker.parameters import ParameterStore
from amqpd.protocol import codec
from amqpd.protocol.errors import PreconditionFailed
from plugins.federation import params
from plugins.federation.exchange_link import upstream_queue_name, upstream_vhost
from plugins.federation.headers import ROUTING_HEADER, prepend, should_forward
from plugins.federation.params import Upstream, resolve, strip_credentials
from plugins.federation.upstream_exchange import FederationUpstreamExchange


def store() -> ParameterStore:
    s = ParameterStore()
    s.register(params.UPSTREAM, params.validate_upstream)
    s.register(params.UPSTREAM_SET, params.validate_upstream_set)
    return s


def test_defaults_are_3_10_8_code() -> None:
    up = Upstream.from_value("u", {"uri": "amqp://h"})
    assert (up.reconnect_delay, up.prefetch_count, up.max_hops, up.ack_mode) == (
        5.0, 1000, 1, "on-confirm")
    assert up.trust_user_id is False and up.expires is None and up.message_ttl is None
    assert up.consumer_tag == "federation-link-u"
    assert Upstream.from_value("u", {"uri": ["amqp://a", "amqp://b"]}).uris == (
        "amqp://a", "amqp://b")


@pytest.mark.parametrize("value", [
    {},  # uri is mandatory
    {"uri": "http://h"},
    {"uri": []},
    {"uri": "amqp://h", "ack-mode": "sometimes"},
    {"uri": "amqp://h", "max-hops": 0},
    {"uri": "amqp://h", "prefetch-count": "10"},
    {"uri": "amqp://h", "trust-user-id": "yes"},
    {"uri": "amqp://h", "no-such-key": 1},
    "amqp://h",
])
def test_invalid_upstreams_are_refused(value: object) -> None:
    with pytest.raises(ValueError):
        store().set(params.UPSTREAM, "/", "u", value)


def test_accepted_keys() -> None:
    store().set(params.UPSTREAM, "/", "u", {
        "uri": ["amqp://a", "amqps://b"], "exchange": "x", "queue": "q", "max-hops": 3,
        "expires": 1000, "message-ttl": 0, "prefetch-count": 10, "reconnect-delay": 1.5,
        "ack-mode": "no-ack", "trust-user-id": True, "consumer-tag": "t",
        "resource-cleanup-mode": "never", "bind-nowait": False, "channel-use-mode": "single",
        "ha-policy": "all"})


def test_resolve_single_set_and_all() -> None:
    s = store()
    s.set(params.UPSTREAM, "/", "a", {"uri": "amqp://a", "max-hops": 1})
    s.set(params.UPSTREAM, "/", "b", {"uri": "amqp://b"})
    s.set(params.UPSTREAM, "other", "c", {"uri": "amqp://c"})
    s.set(params.UPSTREAM_SET, "/", "s", [{"upstream": "a", "max-hops": 4},
                                         {"upstream": "missing"}])
    assert [u.name for u in resolve(s, "/", {"federation-upstream": "a"})] == ["a"]
    assert [u.name for u in resolve(s, "/", {"federation-upstream-set": "all"})] == ["a", "b"]
    (member,) = resolve(s, "/", {"federation-upstream-set": "s"})
    assert member.name == "a" and member.max_hops == 4 and member.uris == ("amqp://a",)
    assert resolve(s, "/", {"federation-upstream": "nope"}) == []
    assert [u.name for u in resolve(s, "/", {"federation-upstream-pattern": "^b"})] == ["b"]
    assert resolve(s, "/", None) == []
    with pytest.raises(ValueError):
        s.set(params.UPSTREAM_SET, "/", "all", [])
    with pytest.raises(ValueError):
        s.set(params.UPSTREAM_SET, "/", "x", [{"upstream": "a", "uri": "amqp://no"}])


def test_strip_credentials() -> None:
    assert strip_credentials("amqp://user:secret@host:5673/vh?heartbeat=5") == \
        "amqp://host:5673/vh"
    assert strip_credentials("amqps://u@h") == "amqps://h"


def test_should_forward_hops_and_loops() -> None:
    assert should_forward(None, 1, "me", "/")
    assert should_forward({"other": 1}, 1, "me", "/")
    one = prepend(None, ROUTING_HEADER, {"cluster-name": "a", "vhost": "/"})
    assert not should_forward(one, 1, "me", "/")  # hop limit
    assert should_forward(one, 2, "me", "/")
    assert not should_forward(one, 5, "a", "/")  # came from there: a loop
    assert should_forward(one, 5, "a", "other-vhost")  # same cluster, other vhost
    two = prepend(one, ROUTING_HEADER, {"cluster-name": "b", "vhost": "/"})
    assert [t["cluster-name"] for t in two[ROUTING_HEADER]] == ["b", "a"]


def test_upstream_queue_naming() -> None:
    assert upstream_queue_name("x", "/", "down", "/", "x") == "federation: x -> down"
    assert upstream_queue_name("x", "/", "down", "/", "y") == "federation: x -> down:y"
    assert upstream_queue_name("x", "/", "down", "v", "y") == "federation: x -> down:v:y"
    assert upstream_vhost("amqp://h") == "/" and upstream_vhost("amqp://h/%2F") == "/"
    assert upstream_vhost("amqp://h/prod") == "prod"


def _msg(headers: dict[str, object] | None) -> Message:
    props = codec.encode_properties({"headers": headers} if headers else {})
    return Message("x", "k", props, b"")


def test_upstream_exchange_type_filters() -> None:
    args = {"x-max-hops": 1, "x-downstream-name": "down", "x-downstream-vhost": "/",
            "x-internal-purpose": "federation"}
    ex = FederationUpstreamExchange("/", "federation: x -> down A", durable=True,
                                    auto_delete=True, internal=True, arguments=args)
    ex._dests[("queue", "q", "", "")] = "Q"
    assert list(ex.route(_msg(None), "any")) == ["Q"]
    one = prepend(None, ROUTING_HEADER, {"cluster-name": "elsewhere", "vhost": "/"})
    assert list(ex.route(_msg(one), "any")) == []  # max-hops 1 reached
    with pytest.raises(PreconditionFailed):
        FederationUpstreamExchange("/", "bad", arguments={"x-downstream-name": "d"})
