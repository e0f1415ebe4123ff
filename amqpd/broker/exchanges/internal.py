"""Store keys that belong to an exchange rather than a queue.

A delayed exchange's held messages and a deduplication exchange's disk cache live in the
shared log under an internal key, ``"<vhost>\\x00<prefix><exchange>"``, which no client
can declare as a queue (``amq.`` names are reserved). Recovery finds every key with its
live records; this module names those keys and finds the exchange a key belongs to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqpd.broker.exchange import Exchange
    from amqpd.server import Broker


def store_key(vhost: str, prefix: str, exchange: str) -> str:
    return f"{vhost}\x00{prefix}{exchange}"


def owner(broker: Broker, key: str, prefix: str) -> tuple[bool, Exchange | None]:
    """Whether ``key`` is one of ``prefix``'s keys, and the exchange it names (None when
    that exchange no longer exists)."""
    vhost_name, _, name = key.partition("\x00")
    if not name.startswith(prefix):
        return False, None
    vhost = broker.vhosts.get(vhost_name)
    return True, vhost.exchanges.get(name[len(prefix):]) if vhost is not None else None


__all__ = ["owner", "store_key"]
