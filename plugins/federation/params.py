"""Federation upstreams and upstream sets: validation, defaults, and resolution.

Keys and defaults are RabbitMQ 3.10.8's as coded (``rabbit_federation_parameters``,
``rabbit_federation_upstream``), not as the later docs describe them: reconnect-delay
is 5 seconds, prefetch-count 1000, max-hops 1, ack-mode on-confirm. Unknown keys are
refused, as ``rabbit_parameter_validation:proplist`` does.

A policy names one upstream (``federation-upstream``), a set
(``federation-upstream-set``; the implicit set ``all`` is every upstream of the vhost), or
a regular expression over upstream names (``federation-upstream-pattern``).
:func:`resolve` turns a policy definition into the list of :class:`Upstream` values
that the links of one exchange or queue use.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.broker.api import ParameterStore

UPSTREAM = "federation-upstream"
UPSTREAM_SET = "federation-upstream-set"
UPSTREAM_PATTERN = "federation-upstream-pattern"
ACK_MODES = ("on-confirm", "on-publish", "no-ack")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _uri(key: str, value: Any) -> None:
    uris = value if isinstance(value, list) else [value]
    if not uris:
        raise ValueError(f"{key} should be a URI or a non-empty list of URIs")
    for uri in uris:
        if not isinstance(uri, str):
            raise ValueError(f"{key} should be a string or a list of strings, got {uri!r}")
        scheme = urllib.parse.urlsplit(uri).scheme
        if scheme not in ("amqp", "amqps"):
            raise ValueError(f"{key}: {uri!r} is not an amqp:// or amqps:// URI")


def _string(key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{key} should be a string, actually was {value!r}")


def _non_neg(key: str, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{key} should be a non-negative integer, actually was {value!r}")


def _pos(key: str, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{key} should be a positive integer, actually was {value!r}")


def _number(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{key} should be a non-negative number, actually was {value!r}")


def _bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key} should be a boolean, actually was {value!r}")


def _one_of(*choices: str) -> Any:
    def check(key: str, value: Any) -> None:
        if value not in choices:
            raise ValueError(f"{key} should be one of {', '.join(choices)}, got {value!r}")
    return check


#: every key a federation-upstream value may carry, with its check (3.10.8's list)
UPSTREAM_KEYS: dict[str, Any] = {
    "uri": _uri,
    "exchange": _string,
    "queue": _string,
    "consumer-tag": _string,
    "prefetch-count": _pos,
    "reconnect-delay": _number,
    "max-hops": _pos,
    "expires": _pos,
    "message-ttl": _non_neg,
    "trust-user-id": _bool,
    "ack-mode": _one_of(*ACK_MODES),
    "ha-policy": _string,
    "bind-nowait": _bool,
    "resource-cleanup-mode": _one_of("default", "never"),
    "channel-use-mode": _one_of("multiple", "single"),
    "queue-type": _one_of("classic", "quorum"),
}


def validate_upstream(_vhost: str, _name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"federation-upstream should be a JSON object, got {value!r}")
    unknown = sorted(k for k in value if k not in UPSTREAM_KEYS)
    if unknown:
        raise ValueError(f"Unrecognised terms {unknown} in federation-upstream")
    if "uri" not in value:
        raise ValueError("Key \"uri\" not found in federation-upstream")
    for key, item in value.items():
        UPSTREAM_KEYS[key](key, item)


def validate_upstream_set(_vhost: str, name: str, value: Any) -> None:
    if name == "all":
        raise ValueError("upstream set name 'all' is reserved (it means every upstream)")
    if not isinstance(value, list):
        raise ValueError(f"federation-upstream-set should be a list, got {value!r}")
    for item in value:
        if not isinstance(item, dict):
            raise ValueError(f"upstream set members should be objects, got {item!r}")
        if "upstream" not in item:
            raise ValueError("Key \"upstream\" not found in federation-upstream-set member")
        _string("upstream", item["upstream"])
        for key, member_value in item.items():
            if key == "upstream":
                continue
            if key not in UPSTREAM_KEYS or key == "uri":
                raise ValueError(f"Unrecognised terms ['{key}'] in federation-upstream-set")
            UPSTREAM_KEYS[key](key, member_value)


def validate_policy_upstream(key: str, value: Any) -> None:
    from amqpd.broker.api import PreconditionFailed

    if not isinstance(value, str) or not value:
        raise PreconditionFailed(f"{key} should be a non-empty string, got {value!r}")
    if key == UPSTREAM_PATTERN:
        try:
            re.compile(value)
        except re.error as exc:
            raise PreconditionFailed(f"{key}: {value!r} is not a regular expression: {exc}"
                                     ) from None


@dataclass(frozen=True)
class Upstream:
    """One upstream as a link uses it: the parameter with defaults filled in."""

    name: str
    uris: tuple[str, ...]
    exchange: str | None = None
    queue: str | None = None
    prefetch_count: int = 1000
    reconnect_delay: float = 5.0
    max_hops: int = 1
    expires: int | None = None
    message_ttl: int | None = None
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    consumer_tag: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_value(cls, name: str, value: dict[str, Any]) -> Upstream:
        uri = value["uri"]
        uris = tuple(uri) if isinstance(uri, list) else (uri,)
        return cls(
            name=name,
            uris=uris,
            exchange=value.get("exchange"),
            queue=value.get("queue"),
            prefetch_count=value.get("prefetch-count", 1000),
            reconnect_delay=float(value.get("reconnect-delay", 5)),
            max_hops=value.get("max-hops", 1),
            expires=value.get("expires"),
            message_ttl=value.get("message-ttl"),
            ack_mode=value.get("ack-mode", "on-confirm"),
            trust_user_id=value.get("trust-user-id", False),
            consumer_tag=value.get("consumer-tag", f"federation-link-{name}"),
            raw=dict(value),
        )

    def with_overrides(self, overrides: dict[str, Any]) -> Upstream:
        merged = {**self.raw, **{k: v for k, v in overrides.items() if k != "upstream"}}
        return replace(Upstream.from_value(self.name, merged))


def strip_credentials(uri: str) -> str:
    """The URI as shown in status and ``x-received-from``: no user, no password."""
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def resolve(params: ParameterStore, vhost: str,
            definition: dict[str, Any] | None) -> list[Upstream]:
    """The upstreams a policy definition federates from (empty if none or unknown)."""
    if not definition:
        return []
    single = definition.get(UPSTREAM)
    set_name = definition.get(UPSTREAM_SET)
    pattern = definition.get(UPSTREAM_PATTERN)
    if isinstance(single, str):
        value = params.get(UPSTREAM, vhost, single)
        return [Upstream.from_value(single, value)] if isinstance(value, dict) else []
    if isinstance(pattern, str):
        regex = re.compile(pattern)
        return [Upstream.from_value(item["name"], item["value"])
                for item in params.list(UPSTREAM, vhost)
                if isinstance(item["value"], dict) and regex.search(item["name"])]
    if not isinstance(set_name, str):
        return []
    if set_name == "all":
        return [Upstream.from_value(item["name"], item["value"])
                for item in params.list(UPSTREAM, vhost) if isinstance(item["value"], dict)]
    members = params.get(UPSTREAM_SET, vhost, set_name)
    out: list[Upstream] = []
    for member in members if isinstance(members, list) else []:
        value = params.get(UPSTREAM, vhost, member.get("upstream"))
        if isinstance(value, dict):
            out.append(Upstream.from_value(member["upstream"], value).with_overrides(member))
    return out
