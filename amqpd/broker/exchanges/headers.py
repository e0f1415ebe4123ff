"""headers: match on message headers, ``x-match`` = all (default) or any.

As in RabbitMQ, binding arguments whose names start with ``x-`` take no part in the match
(``x-match`` itself included); ``all-with-x``/``any-with-x`` include them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from amqpd.broker.exchange import Binding, Destination, Exchange, register_exchange_type
from amqpd.broker.message import Message
from amqpd.protocol.errors import PreconditionFailed

_MODES = ("all", "any", "all-with-x", "any-with-x")
_MISSING = object()


def _norm(value: Any) -> Any:
    """The value as RabbitMQ compares it: strings and byte arrays are the same binaries,
    a boolean never equals a number (Erlang's ``true`` is not ``1``)."""
    if isinstance(value, bool):
        return (bool, value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    return value


def _matches(mode: str, spec: dict[str, Any], headers: dict[str, Any]) -> bool:
    with_x = mode.endswith("-with-x")
    items = [(k, v) for k, v in spec.items()
             if k != "x-match" and (with_x or not k.startswith("x-"))]
    if mode.startswith("all"):
        for key, want in items:
            got = headers.get(key, _MISSING)
            if got is _MISSING:
                return False
            if want is not None and _norm(got) != _norm(want):  # void matches presence
                return False
        return True
    for key, want in items:
        got = headers.get(key, _MISSING)
        if got is not _MISSING and (want is None or _norm(got) == _norm(want)):
            return True
    return False


@register_exchange_type
class HeadersExchange(Exchange):
    type_name = "headers"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self._bindings: dict[
            tuple[str, str, str, str], tuple[str, dict[str, Any], Destination]
        ] = {}
        super().__init__(*args, **kwargs)

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        mode = arguments.get("x-match", "all")
        if isinstance(mode, bytes):
            mode = mode.decode()
        if mode not in _MODES:
            raise PreconditionFailed(
                f"Invalid x-match field value {mode!r}; "
                "expected all, any, all-with-x, or any-with-x"
            )

    def add_binding(self, binding: Binding) -> None:
        mode = binding.arguments.get("x-match", "all")
        if isinstance(mode, bytes):
            mode = mode.decode()
        self._bindings[binding.key] = (mode, binding.arguments, binding.destination)

    def remove_binding(self, binding: Binding) -> None:
        self._bindings.pop(binding.key, None)

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        if not self._bindings:
            return ()
        headers = message.headers
        return [dest for mode, spec, dest in self._bindings.values()
                if _matches(mode, spec, headers)]
