"""Message properties between RabbitMQ's management JSON and AMQP property bytes."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Any

from amqpd.broker.api import codec
from amqpd.http.core import bad_request

_STR_PROPS = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
              "message_id", "type", "user_id", "app_id", "cluster_id")


def encode_json_properties(props: Any) -> bytes:
    """``{"delivery_mode": 2, "headers": {...}}`` (as POSTed to .../publish) to bytes."""
    if props is None or props == "":
        props = {}
    if not isinstance(props, dict):
        raise bad_request("properties must be a JSON object")
    out: dict[str, Any] = {}
    for key, value in props.items():
        if key in _STR_PROPS:
            if not isinstance(value, str):
                raise bad_request(f"property {key} must be a string")
            out[key] = value
        elif key in ("delivery_mode", "priority"):
            try:
                out[key] = int(value)
            except (TypeError, ValueError):
                raise bad_request(f"property {key} must be an integer") from None
            if not 0 <= out[key] <= 255:
                raise bad_request(f"property {key} out of range")
        elif key == "timestamp":
            try:
                out[key] = dt.datetime.fromtimestamp(int(value), dt.UTC)
            except (TypeError, ValueError, OverflowError, OSError):
                raise bad_request("property timestamp must be an integer") from None
        elif key == "headers":
            if not isinstance(value, dict):
                raise bad_request("property headers must be a JSON object")
            out[key] = value
        else:
            raise bad_request(f"unknown property {key}")
    try:
        return codec.encode_properties(out)
    except Exception as exc:
        raise bad_request(f"cannot encode properties: {exc}") from None


def decode_json_properties(raw: bytes) -> dict[str, Any]:
    try:
        props = codec.decode_properties(raw)
    except Exception:
        return {}
    return {k: _plain(v) for k, v in props.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return int(value.timestamp())
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def decode_payload(payload: Any, encoding: Any) -> bytes:
    if not isinstance(payload, str):
        raise bad_request("payload must be a string")
    if encoding in (None, "string"):
        return payload.encode()
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("payload is not valid base64") from None
    raise bad_request("payload_encoding must be 'string' or 'base64'")


def encode_payload(body: bytes, encoding: str, truncate: int | None) -> tuple[str, str]:
    if truncate is not None:
        body = body[:truncate]
    if encoding == "auto":
        try:
            return body.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(body).decode(), "base64"
