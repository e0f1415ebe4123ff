"""Shovel definitions: RabbitMQ 3.10.8's keys, legacy spellings, defaults and error texts.

A definition arrives as the JSON value of a ``shovel`` runtime parameter (HTTP API,
``amqpctl set_parameter``, definitions import) or as a ``[[shovels]]`` table of the config
file. :func:`validate` refuses what RabbitMQ refuses, with RabbitMQ's texts
(``rabbit_shovel_parameters`` and ``rabbit_parameter_validation``); :func:`parse` turns an
accepted value into a :class:`ShovelDef` with every default filled in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# legacy spelling -> modern key (both are accepted; the modern one wins if both are given)
LEGACY = {
    "prefetch-count": "src-prefetch-count",
    "delete-after": "src-delete-after",
    "publish-properties": "dest-publish-properties",
    "add-forward-headers": "dest-add-forward-headers",
    "add-timestamp-header": "dest-add-timestamp-header",
}

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
PROTOCOLS = ("amqp091", "amqp10")
# basic properties dest-publish-properties may override (headers are not supported)
PUBLISH_PROPERTIES = (
    "content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
    "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id",
    "cluster_id",
)


@dataclass
class ShovelDef:
    name: str
    vhost: str
    type: str  # "dynamic" | "static"
    src_uris: list[str]
    dest_uris: list[str]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = "#"
    src_queue_args: dict[str, Any] | None = None
    src_consumer_args: dict[str, Any] = field(default_factory=dict)
    prefetch_count: int = 1000
    delete_after: str | int = "never"  # "never" | "queue-length" | N
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    dest_queue: str | None = None
    dest_queue_args: dict[str, Any] = field(default_factory=dict)
    publish_properties: dict[str, Any] = field(default_factory=dict)
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    ack_mode: str = "on-confirm"
    reconnect_delay: float = 1.0


def _fmt(value: Any) -> str:
    """Erlang's ~p, near enough: strings in quotes, everything else as JSON."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    return json.dumps(value)


def _string(key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{key} should be a string, actually was {_fmt(value)}")


def _number(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} should be a number, actually was {_fmt(value)}")


def _boolean(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key} should be a boolean, actually was {_fmt(value)}")


def _table(key: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{key} should be a JSON object, actually was {_fmt(value)}")


def _enum(options: tuple[str, ...]) -> Any:
    def check(key: str, value: Any) -> None:
        if value not in options:
            raise ValueError(f"{key} should be one of {list(options)}, actually was "
                             f"{_fmt(value)}")
    return check


def _uri(key: str, value: Any) -> None:
    uris = value if isinstance(value, list) else [value]
    if not uris or not all(isinstance(u, str) for u in uris):
        raise ValueError(f"{key} should be a string or a list of strings, actually was "
                         f"{_fmt(value)}")
    for u in uris:
        parts = urlsplit(u)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f'{{error, {{unable_to_parse_uri, "{u}"}}}}: '
                             f"{key} must be an amqp:// or amqps:// URI")


def _delete_after(key: str, value: Any) -> None:
    if value in ("never", "queue-length"):
        return
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return
    raise ValueError(f'{key} should be number, "never" or "queue-length", actually was '
                     f"{_fmt(value)}")


def _prefetch(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} should be a number, actually was {_fmt(value)}")


def _properties(key: str, value: Any) -> None:
    _table(key, value)
    for k in value:
        if k not in PUBLISH_PROPERTIES:
            raise ValueError(f"{key}: unsupported basic property {k!r}"
                             + (" (headers are not supported)" if k == "headers" else ""))


# key -> (checker, mandatory)
VALIDATION: dict[str, tuple[Any, bool]] = {
    "src-uri": (_uri, True),
    "src-protocol": (_enum(PROTOCOLS), False),
    "src-exchange": (_string, False),
    "src-exchange-key": (_string, False),
    "src-queue": (_string, False),
    "src-queue-args": (_table, False),
    "src-consumer-args": (_table, False),
    "src-prefetch-count": (_prefetch, False),
    "src-delete-after": (_delete_after, False),
    "dest-uri": (_uri, True),
    "dest-protocol": (_enum(PROTOCOLS), False),
    "dest-exchange": (_string, False),
    "dest-exchange-key": (_string, False),
    "dest-queue": (_string, False),
    "dest-queue-args": (_table, False),
    "dest-publish-properties": (_properties, False),
    "dest-add-forward-headers": (_boolean, False),
    "dest-add-timestamp-header": (_boolean, False),
    "ack-mode": (_enum(ACK_MODES), False),
    "reconnect-delay": (_number, False),
}


def normalise(value: Any) -> dict[str, Any]:
    """Modern spellings only; a modern key beats its legacy twin."""
    if not isinstance(value, dict):
        raise ValueError(f"shovel definition should be a JSON object, actually was "
                         f"{_fmt(value)}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        modern = LEGACY.get(str(k), str(k))
        if modern != k and modern in value:
            continue
        out[modern] = v
    return out


def validate(vhost: str, name: str, value: Any) -> None:
    """Raise ValueError with RabbitMQ's text if RabbitMQ would refuse this definition."""
    d = normalise(value)
    if "src-exchange" not in d and "src-queue" not in d:
        raise ValueError("Must specify 'src-exchange' or 'src-queue'")
    if "src-exchange" in d and "src-queue" in d:
        raise ValueError("Cannot specify 'src-exchange' and 'src-queue'")
    if "dest-exchange" in d and "dest-queue" in d:
        raise ValueError("Cannot specify 'dest-exchange' and 'dest-queue'")
    if isinstance(d.get("src-delete-after"), int) and d.get("ack-mode") == "no-ack":
        raise ValueError("Cannot specify 'no-ack' and numerical 'delete-after'")
    for key, (check, mandatory) in VALIDATION.items():
        if key not in d:
            if mandatory:
                raise ValueError(f'Key "{key}" not found in {name}')
            continue
        check(key, d[key])
    unknown = sorted(k for k in d if k not in VALIDATION)
    if unknown:
        raise ValueError(f"Unrecognised terms {unknown} in {name}")
    for side in ("src", "dest"):
        protocol = d.get(f"{side}-protocol", "amqp091")
        if protocol != "amqp091":
            raise ValueError(f'Unsupported protocol: "{protocol}" '
                             "(amqpd speaks amqp091 only)")


def parse(vhost: str, name: str, value: Any, type_: str = "dynamic") -> ShovelDef:
    validate(vhost, name, value)
    d = normalise(value)

    def uris(v: Any) -> list[str]:
        return list(v) if isinstance(v, list) else [v]

    return ShovelDef(
        name=name, vhost=vhost, type=type_,
        src_uris=uris(d["src-uri"]), dest_uris=uris(d["dest-uri"]),
        src_queue=d.get("src-queue"), src_exchange=d.get("src-exchange"),
        src_exchange_key=d.get("src-exchange-key", "#"),
        src_queue_args=d.get("src-queue-args"),
        src_consumer_args=dict(d.get("src-consumer-args") or {}),
        prefetch_count=int(d.get("src-prefetch-count", 1000)),
        delete_after=d.get("src-delete-after", "never"),
        dest_exchange=d.get("dest-exchange"), dest_exchange_key=d.get("dest-exchange-key"),
        dest_queue=d.get("dest-queue"),
        dest_queue_args=dict(d.get("dest-queue-args") or {}),
        publish_properties=dict(d.get("dest-publish-properties") or {}),
        add_forward_headers=bool(d.get("dest-add-forward-headers", False)),
        add_timestamp_header=bool(d.get("dest-add-timestamp-header", False)),
        ack_mode=d.get("ack-mode", "on-confirm"),
        reconnect_delay=float(d.get("reconnect-delay", 1)),
    )


def redact(uri: str) -> str:
    """The URI without its credentials (for status and x-shovelled headers)."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
