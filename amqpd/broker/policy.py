"""Policies: per-vhost rules that set queue and exchange options by name pattern.

RabbitMQ's model, kept exactly: a policy has a name, a regular expression ``pattern``
matched (unanchored, like Erlang's ``re:run``) against queue or exchange names, an
``apply-to`` of ``all``/``queues``/``exchanges``, an integer ``priority`` and a
``definition`` of keys. Of the policies that match an object, the one with the highest
priority applies, whole: definitions are never merged.

How a policy key combines with the matching x-argument is RabbitMQ 3.10's choice per key
(``rabbit_queue_type_util:args_policy_lookup``): the *lower* value wins for message-ttl,
expires, max-length and max-length-bytes; the *argument* wins for dead-letter-exchange,
dead-letter-routing-key, overflow and alternate-exchange. max-priority is argument-only.

:class:`PolicyStore` is the API the AMQP side, the HTTP API (``/api/policies``) and
definitions import all use; it validates definitions, re-applies policies to existing
queues and exchanges whenever a policy changes, and asks the broker to persist them.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.exchange import Exchange
    from amqpd.broker.queue_type import QueueType
    from amqpd.broker.vhost import VHost
    from amqpd.server import Broker

APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")
# what each apply-to matches: a kind (queues, exchanges) and, for queues, their type
# (amqpd has classic and quorum queues; a streams policy matches nothing)
_APPLY_KIND = {"all": ("all", None), "queues": ("queues", None),
               "exchanges": ("exchanges", None), "classic_queues": ("queues", "classic"),
               "quorum_queues": ("queues", "quorum"), "streams": ("none", None)}
OVERFLOW_VALUES = ("drop-head", "reject-publish", "reject-publish-dlx")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_neg_int(key: str, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise PreconditionFailed(f"{key} must be a non-negative integer, got {value!r}")


def _pos_int(key: str, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise PreconditionFailed(f"{key} must be an integer greater than 0, got {value!r}")


def _string(key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise PreconditionFailed(f"{key} must be a string, got {value!r}")


def _overflow(key: str, value: Any) -> None:
    if value not in OVERFLOW_VALUES:
        raise PreconditionFailed(
            f"{key} must be one of {', '.join(OVERFLOW_VALUES)}, got {value!r}"
        )


def _either(first: str, second: str) -> Callable[[str, Any], None]:
    """A key taking one of two words (RabbitMQ 3.10's ha-sync-mode, ha-promote-on-*)."""
    def check(key: str, value: Any) -> None:
        if value not in (first, second):
            raise PreconditionFailed(f'{key} must be "{first}" or "{second}", got {value!r}')
    return check


def _any(key: str, value: Any) -> None:
    """Keys owned by other subsystems (mirroring, federation...) validate themselves."""


#: policy key -> validator. Other subsystems add theirs with :func:`register_policy_key`.
POLICY_KEYS: dict[str, Callable[[str, Any], None]] = {
    "message-ttl": _non_neg_int,
    "expires": _pos_int,
    "max-length": _non_neg_int,
    "max-length-bytes": _non_neg_int,
    "overflow": _overflow,
    "dead-letter-exchange": _string,
    "dead-letter-routing-key": _string,
    "alternate-exchange": _string,
    # recognised by RabbitMQ 3.10 and owned elsewhere (or inert here)
    "ha-mode": _any,
    "ha-params": _any,
    "ha-sync-mode": _either("manual", "automatic"),
    "ha-sync-batch-size": _pos_int,
    "ha-promote-on-shutdown": _either("always", "when-synced"),
    "ha-promote-on-failure": _either("always", "when-synced"),
    "queue-master-locator": _any,
    "queue-mode": _any,
    "queue-version": _any,
    "federation-upstream": _any,
    "federation-upstream-set": _any,
    "delivery-limit": _any,
    "max-in-memory-length": _any,
    "max-in-memory-bytes": _any,
    "max-age": _any,
    "stream-max-segment-size-bytes": _any,
}


def register_policy_key(key: str, validator: Callable[[str, Any], None]) -> None:
    """Let another subsystem own a policy key (its validator raises PreconditionFailed)."""
    POLICY_KEYS[key] = validator


@dataclass(slots=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    regex: re.Pattern[str]
    apply_to: str
    definition: dict[str, Any]
    priority: int

    def applies_to(self, kind: str, name: str, queue_type: str = "classic") -> bool:
        applies, of_type = _APPLY_KIND[self.apply_to]
        if applies != "all" and applies != kind:
            return False
        if of_type is not None and of_type != queue_type:
            return False
        return self.regex.search(name) is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "vhost": self.vhost,
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to,
            "definition": dict(self.definition),
            "priority": self.priority,
        }


def validate_definition(definition: Any) -> dict[str, Any]:
    if not isinstance(definition, dict):
        raise PreconditionFailed(f"definition must be a dictionary: {definition!r}")
    if not definition:
        raise PreconditionFailed("no policy provided")
    unknown = sorted(k for k in definition if k not in POLICY_KEYS)
    if unknown:
        raise PreconditionFailed(f"{unknown} are not recognised policy settings")
    for key, value in definition.items():
        POLICY_KEYS[key](key, value)
    return dict(definition)


class PolicyStore:
    """``broker.policies``: set/clear/list policies and keep objects' ``.policy`` current."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._by_vhost: dict[str, dict[str, Policy]] = {}
        # observers (federation): called after a policy was (re)applied to a queue or exchange
        self.on_applied: list[Callable[[VHost, QueueType | Exchange], None]] = []

    # ------------------------------------------------------------------ public API
    def set(self, vhost: str, name: str, pattern: str, definition: dict[str, Any],
            priority: int = 0, apply_to: str = "all") -> None:
        if not isinstance(name, str) or not name:
            raise PreconditionFailed("policy name must be a non-empty string")
        if not isinstance(pattern, str):
            raise PreconditionFailed(f"pattern must be a string, got {pattern!r}")
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise PreconditionFailed(
                f"{pattern!r} is not a valid regular expression: {exc}") from None
        if apply_to not in APPLY_TO:
            raise PreconditionFailed(
                f"apply-to must be one of {', '.join(APPLY_TO)}; got {apply_to!r}")
        if not _is_int(priority):
            raise PreconditionFailed(f"priority must be an integer, got {priority!r}")
        if vhost not in self.broker.vhosts:
            raise PreconditionFailed(f"no vhost '{vhost}'")
        definition = self.validate(definition)
        self._by_vhost.setdefault(vhost, {})[name] = Policy(
            vhost, name, pattern, regex, apply_to, definition, priority)
        self._reapply(vhost)
        self.changed()

    def clear(self, vhost: str, name: str) -> None:
        """Remove a policy; clearing one that does not exist is not an error."""
        policies = self._by_vhost.get(vhost)
        if not policies or policies.pop(name, None) is None:
            return
        self._reapply(vhost)
        self.changed()

    def drop_vhost(self, vhost: str) -> None:
        """Forget a deleted vhost's policies (RabbitMQ deletes them with the vhost)."""
        if self._by_vhost.pop(vhost, None):
            self.changed()

    def validate(self, definition: Any) -> dict[str, Any]:
        """Check a definition's keys and values (operator policies allow fewer)."""
        return validate_definition(definition)

    def changed(self) -> None:
        """Persist: policies travel in the definitions file."""
        self.broker.definitions_changed()

    def get(self, vhost: str, name: str) -> dict[str, Any] | None:
        policy = self._by_vhost.get(vhost, {}).get(name)
        return policy.to_json() if policy is not None else None

    def list(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Policies in RabbitMQ's JSON shape (``/api/policies``, definitions export)."""
        vhosts = [vhost] if vhost is not None else sorted(self._by_vhost)
        out: builtins.list[dict[str, Any]] = []
        for vh in vhosts:
            for name in sorted(self._by_vhost.get(vh, {})):
                out.append(self._by_vhost[vh][name].to_json())
        return out

    def load(self, items: builtins.list[dict[str, Any]]) -> None:
        """Restore policies from a definitions document (invalid entries raise)."""
        for item in items:
            self.set(item["vhost"], item["name"], item["pattern"], item["definition"],
                     priority=item.get("priority", 0), apply_to=item.get("apply-to", "all"))

    # ------------------------------------------------------------------ matching
    def match(self, vhost: str, kind: str, name: str,
              queue_type: str = "classic") -> Policy | None:
        """The policy that applies to a queue (kind 'queues') or exchange ('exchanges')."""
        best: Policy | None = None
        for policy in self._by_vhost.get(vhost, {}).values():
            if policy.applies_to(kind, name, queue_type) and (
                    best is None or policy.priority > best.priority
                    or (policy.priority == best.priority and policy.name < best.name)):
                best = policy
        return best

    def apply(self, vhost: VHost, obj: QueueType | Exchange) -> None:
        """Set ``obj.policy`` (and ``obj.policy_name``) from the matching policy."""
        from amqpd.broker.exchange import Exchange

        kind = "exchanges" if isinstance(obj, Exchange) else "queues"
        queue_type = obj.type_name if kind == "queues" else "classic"
        policy = self.match(vhost.name, kind, obj.name, queue_type)
        obj.policy = dict(policy.definition) if policy is not None else None
        setattr(obj, "policy_name", policy.name if policy is not None else None)  # noqa: B010
        for cb in self.on_applied:
            cb(vhost, obj)

    def _reapply(self, vhost_name: str) -> None:
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is None:
            return
        for ex in list(vhost.exchanges.values()):
            self.broker.apply_policies_to(vhost, ex)
        for q in list(vhost.queues.values()):
            self.broker.apply_policies_to(vhost, q)


# ---------------------------------------------------------------------- effective values
def _min(arg: Any, pol: Any) -> Any:
    if arg is None:
        return pol
    if pol is None:
        return arg
    return min(arg, pol)


@dataclass(slots=True)
class QueueOptions:
    """A queue's extension settings after combining x-arguments and its policy."""

    message_ttl: int | None = None
    expires: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None
    single_active_consumer: bool = False

    @property
    def any(self) -> bool:
        return (self.message_ttl is not None or self.expires is not None
                or self.max_length is not None or self.max_length_bytes is not None
                or self.dead_letter_exchange is not None or bool(self.max_priority)
                or self.single_active_consumer)


def queue_options(arguments: dict[str, Any], policy: dict[str, Any] | None) -> QueueOptions:
    pol = policy or {}
    args = arguments

    def arg(key: str) -> Any:
        value = args.get(key)
        return value if _is_int(value) or isinstance(value, str | bool) else None

    overflow = arg("x-overflow") or pol.get("overflow") or "drop-head"
    dlx = arg("x-dead-letter-exchange")
    if dlx is None:
        dlx = pol.get("dead-letter-exchange")
    dlrk = arg("x-dead-letter-routing-key")
    if dlrk is None:
        dlrk = pol.get("dead-letter-routing-key")
    max_priority = arg("x-max-priority")
    return QueueOptions(
        message_ttl=_min(arg("x-message-ttl"), pol.get("message-ttl")),
        expires=_min(arg("x-expires"), pol.get("expires")),
        max_length=_min(arg("x-max-length"), pol.get("max-length")),
        max_length_bytes=_min(arg("x-max-length-bytes"), pol.get("max-length-bytes")),
        overflow=overflow,
        dead_letter_exchange=dlx,
        dead_letter_routing_key=dlrk,
        max_priority=max_priority if _is_int(max_priority) and max_priority > 0 else None,
        single_active_consumer=args.get("x-single-active-consumer") is True,
    )


def alternate_exchange(arguments: dict[str, Any], policy: dict[str, Any] | None) -> str | None:
    """The argument wins over the policy (``rabbit_policy:get_arg``)."""
    ae = arguments.get("alternate-exchange")
    if isinstance(ae, str):
        return ae
    ae = (policy or {}).get("alternate-exchange")
    return ae if isinstance(ae, str) else None


__all__ = [
    "POLICY_KEYS", "Policy", "PolicyStore", "QueueOptions", "alternate_exchange",
    "queue_options", "register_policy_key", "validate_definition",
]
