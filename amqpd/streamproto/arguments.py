"""Stream creation arguments as the stream protocol names them (create, and RabbitMQ's
super-stream creation), turned into the queue arguments of ``x-queue-type: stream``.

The protocol carries every value as a string (``max-length-bytes=1000``); the HTTP API
and amqpctl may pass numbers too. Keys the map does not know are ignored, as RabbitMQ's
plugin ignores them; a value of the wrong kind is refused (:class:`BadArgument`), so the
caller answers with its own refusal (PRECONDITION_FAILED on 5552, 400 over HTTP).
"""

from __future__ import annotations

from typing import Any

from amqpd.broker.stream import TYPE_NAME

# the argument -> the queue argument and its type
CREATE_ARGUMENTS: dict[str, tuple[str, type]] = {
    "max-length-bytes": ("x-max-length-bytes", int),
    "max-age": ("x-max-age", str),
    "stream-max-segment-size-bytes": ("x-stream-max-segment-size-bytes", int),
    "initial-cluster-size": ("x-initial-cluster-size", int),
    "queue-leader-locator": ("x-queue-leader-locator", str),
}


class BadArgument(ValueError):
    """An argument whose value is not of its kind (the message names both)."""


def queue_arguments(args: dict[str, Any]) -> dict[str, Any]:
    """The queue arguments (``x-queue-type: stream`` and the known keys) for ``args``."""
    out: dict[str, Any] = {"x-queue-type": TYPE_NAME}
    for key, value in args.items():
        known = CREATE_ARGUMENTS.get(key)
        if known is None:
            continue
        qkey, kind = known
        if kind is int:
            if isinstance(value, bool) or not (
                    isinstance(value, int)
                    or (isinstance(value, str) and value.lstrip("-").isdigit())):
                raise BadArgument(f"{key}={value!r} is not an integer")
            out[qkey] = int(value)
        elif isinstance(value, str):
            out[qkey] = value
        else:
            raise BadArgument(f"{key}={value!r} is not a string")
    return out


__all__ = ["CREATE_ARGUMENTS", "BadArgument", "queue_arguments"]
