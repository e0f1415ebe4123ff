"""Vhost and user limits, as RabbitMQ 3.10 keeps and enforces them.

* vhost limits ``max-connections`` and ``max-queues`` are the runtime parameter
  ``vhost-limits/<vhost>/limits`` (as in RabbitMQ, so they travel in definitions'
  ``parameters`` and in ``/api/parameters`` too), shown by ``/api/vhost-limits``;
* user limits ``max-connections`` and ``max-channels`` belong to the user (definitions'
  ``users[].limits``), shown by ``/api/user-limits``.

A negative value means "no limit"; 0 refuses everything (RabbitMQ's semantics). The
errors are RabbitMQ's, recorded against 3.10.8:

* connection.open over a vhost's max-connections: 530 ``access to vhost 'V' refused for
  user 'U': connection limit (N) is reached``;
* over a user's max-connections: 530 ``connection refused for user 'U': user connection
  limit (N) is reached``;
* channel.open over a user's max-channels (all their connections together): 530
  ``number of channels opened for user 'U' has reached the maximum allowed user limit
  of (N)``;
* queue.declare of a new queue over max-queues: 406 ``cannot declare queue 'Q': queue
  limit in vhost 'V' (N) is reached`` (checked by ``BrokerAPI.declare_queue`` for every
  caller; ``PUT /api/queues`` answers it as 400 ``bad_request`` with the same text, as
  RabbitMQ's management API does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.protocol.errors import NotAllowed, PreconditionFailed

if TYPE_CHECKING:
    from amqpd.server import Broker
    from amqpd.session import Session

COMPONENT = "vhost-limits"
VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")


def validate(value: Any, allowed: tuple[str, ...]) -> dict[str, int]:
    """A limits object as RabbitMQ accepts it; ValueError with its words otherwise."""
    if not isinstance(value, dict):
        raise ValueError("limits must be a JSON object")
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise ValueError(f"Unrecognised terms {unknown} in limits")
    out = {}
    for key, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{key} should be a number, actually was {v!r}")
        out[key] = v
    return out


def register(broker: Broker) -> None:
    """Make ``vhost-limits`` a known runtime-parameter component."""
    def check(_vhost: str, name: str, value: Any) -> None:
        if name != "limits":
            raise ValueError(f"vhost limits are named 'limits', not '{name}'")
        validate(value, VHOST_LIMITS)

    broker.parameters.register(COMPONENT, check)


def vhost_limits(broker: Broker, vhost: str) -> dict[str, int]:
    value = broker.parameters.get(COMPONENT, vhost, "limits")
    return value if isinstance(value, dict) else {}


def user_limits(broker: Broker, user: str) -> dict[str, int]:
    return broker.parameters.user_limits.get(user, {})


def _limit(limits: dict[str, int], key: str) -> int:
    value = limits.get(key, -1)
    return value if isinstance(value, int) else -1


def check_connection(broker: Broker, session: Session, vhost: str) -> None:
    """At connection.open, before the session counts as open."""
    user = session.username
    limit = _limit(vhost_limits(broker, vhost), "max-connections")
    if limit >= 0:
        n = sum(1 for s in broker.sessions if s.vhost is not None and s.vhost.name == vhost)
        if n >= limit:
            raise NotAllowed(f"access to vhost '{vhost}' refused for user '{user}': "
                             f"connection limit ({limit}) is reached", 10, 40)
    limit = _limit(user_limits(broker, user), "max-connections")
    if limit >= 0:
        n = sum(1 for s in broker.sessions if s.username == user)
        if n >= limit:
            raise NotAllowed(f"connection refused for user '{user}': user connection "
                             f"limit ({limit}) is reached", 10, 40)


def check_channel(broker: Broker, session: Session) -> None:
    """At channel.open (the new channel not counted yet)."""
    user = session.username
    limit = _limit(user_limits(broker, user), "max-channels")
    if limit < 0:
        return
    n = sum(len(s.channels) for s in broker.sessions if s.username == user)
    if n >= limit:
        raise NotAllowed(f"number of channels opened for user '{user}' has reached the "
                         f"maximum allowed user limit of ({limit})", 20, 10)


def check_queue(broker: Broker, vhost: str, queue_count: int, name: str) -> None:
    """Before a *new* queue is declared."""
    limit = _limit(vhost_limits(broker, vhost), "max-queues")
    if limit >= 0 and queue_count >= limit:
        raise PreconditionFailed(f"cannot declare queue '{name}': queue limit in vhost "
                                 f"'{vhost}' ({limit}) is reached")


__all__ = ["COMPONENT", "USER_LIMITS", "VHOST_LIMITS", "check_channel", "check_connection",
           "check_queue", "register", "user_limits", "validate", "vhost_limits"]
