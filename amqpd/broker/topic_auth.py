"""Topic permissions (RabbitMQ 3.10's topic authorisation, internal backend).

Per (user, vhost, exchange) two regular expressions, ``write`` and ``read``, matched
against routing keys of **topic exchanges** only:

* publishing to a topic exchange needs ``write`` to match the message's routing key;
* binding to a topic exchange (queue.bind, queue.unbind, exchange.bind and unbind, with
  the topic exchange as source) needs ``read`` to match the binding key.

With no topic permission for that user, vhost and exchange, everything is allowed (as
in RabbitMQ). Patterns are searched unanchored and ``""`` means ``^$``, as for
ordinary permissions. ``{username}`` and ``{vhost}`` in a pattern are replaced before
matching. ``{client_id}`` is replaced only when the connection has a client id in its
variable map; RabbitMQ 3.10 builds that map for MQTT and STOMP connections only, never
for AMQP 0-9-1 clients (checked against 3.10.8: a ``client_id`` client property does
not count), so for amqpd's AMQP clients it stays literal, as there.

A refusal is 403 ACCESS_REFUSED with RabbitMQ's text:
``access to topic 'RK' in exchange 'X' in vhost 'V' refused for user 'U'``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from amqpd.protocol.errors import AccessRefused

_COMPILED: dict[str, re.Pattern[str]] = {}


def _pattern(text: str) -> re.Pattern[str]:
    compiled = _COMPILED.get(text)
    if compiled is None:
        if len(_COMPILED) > 4096:
            _COMPILED.clear()
        compiled = _COMPILED[text] = re.compile(text or "^$")
    return compiled


def expand(pattern: str, variables: Mapping[str, str]) -> str:
    """Replace ``{name}`` for every variable known for the connection."""
    for name, value in variables.items():
        pattern = pattern.replace("{" + name + "}", value)
    return pattern


def find(entries: list[dict[str, Any]], user: str, vhost: str,
         exchange: str) -> dict[str, Any] | None:
    for entry in entries:
        if entry.get("user") == user and entry.get("vhost") == vhost \
                and entry.get("exchange") == exchange:
            return entry
    return None


def check(entries: list[dict[str, Any]], user: str, vhost: str, exchange: str,
          routing_key: str, permission: str,
          variables: Mapping[str, str] | None = None) -> None:
    """Raise AccessRefused unless ``permission`` ("write" or "read") allows the key."""
    entry = find(entries, user, vhost, exchange)
    if entry is None:
        return
    known = {"username": user, "vhost": vhost, **(variables or {})}
    pattern = expand(str(entry.get(permission, "")), known)
    try:
        allowed = _pattern(pattern).search(routing_key) is not None
    except re.error:
        allowed = False  # a pattern that does not compile allows nothing
    if not allowed:
        raise AccessRefused(
            f"access to topic '{routing_key}' in exchange '{exchange}' in vhost '{vhost}' "
            f"refused for user '{user}'")


def put(entries: list[dict[str, Any]], user: str, vhost: str, exchange: str, write: str,
        read: str) -> bool:
    """Set (replace) one topic permission; True if it existed."""
    old = find(entries, user, vhost, exchange)
    if old is not None:
        old.update(write=write, read=read)
        return True
    entries.append({"user": user, "vhost": vhost, "exchange": exchange, "write": write,
                    "read": read})
    return False


def remove(entries: list[dict[str, Any]], user: str, vhost: str,
           exchange: str | None = None) -> int:
    """Remove the user's topic permissions in ``vhost`` (one exchange, or all)."""
    keep = [e for e in entries if not (
        e.get("user") == user and e.get("vhost") == vhost
        and (exchange is None or e.get("exchange") == exchange))]
    gone = len(entries) - len(keep)
    entries[:] = keep
    return gone


__all__ = ["check", "expand", "find", "put", "remove"]
