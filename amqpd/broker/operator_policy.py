"""Operator policies: limits an operator imposes on queues whatever users declare.

RabbitMQ 3.10's model: an operator policy matches queues by pattern and priority like
a policy, but it *caps* rather than sets: for each of its keys the effective value is the
lower of the operator policy's and what the queue's arguments and user policy give
(``rabbit_policy:merge_operator_definitions``). Only numeric limits are allowed here:
``expires``, ``message-ttl``, ``max-length``, ``max-length-bytes`` (RabbitMQ also
accepts ``max-in-memory-*`` and ``delivery-limit``, which have no meaning for amqpd's
classic queues; they are refused rather than silently ignored).

RabbitMQ does not put operator policies in a definitions export; amqpd keeps them in
``operator_policies.json`` in the data directory (written atomically on each change),
so they survive a restart as RabbitMQ's do. Managed at ``/api/operator-policies``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqpd.broker.policy import PolicyStore, QueueOptions, _non_neg_int, _pos_int
from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.server import Broker

OPERATOR_KEYS = {"expires": _pos_int, "message-ttl": _non_neg_int,
                 "max-length": _non_neg_int, "max-length-bytes": _non_neg_int}
_OPTION = {"expires": "expires", "message-ttl": "message_ttl", "max-length": "max_length",
           "max-length-bytes": "max_length_bytes"}
FILE_NAME = "operator_policies.json"


class OperatorPolicyStore(PolicyStore):
    """``broker.operator_policies``; the same matching as policies, its own keys."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.path: Path | None = None  # set once the data directory is known

    def validate(self, definition: Any) -> dict[str, Any]:
        if not isinstance(definition, dict) or not definition:
            raise PreconditionFailed("no policy provided")
        unknown = [(k, v) for k, v in definition.items() if k not in OPERATOR_KEYS]
        if unknown:
            raise PreconditionFailed(f"{unknown} are not recognised policy settings")
        for key, value in definition.items():
            OPERATOR_KEYS[key](key, value)
        return dict(definition)

    def changed(self) -> None:
        if self.path is None:
            return
        from amqpd.store.definitions import DefinitionsStore

        DefinitionsStore(self.path).save({"operator_policies": self.list()})

    def restore(self, data_dir: Path) -> None:
        """Load the saved operator policies (at boot, after vhosts exist)."""
        import json

        self.path = data_dir / FILE_NAME
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        path, self.path = self.path, None  # no rewrite while loading
        try:
            self.load([p for p in saved.get("operator_policies", [])
                       if p.get("vhost") in self.broker.vhosts])
        finally:
            self.path = path


def cap(opts: QueueOptions, definition: dict[str, Any] | None) -> QueueOptions:
    """Lower ``opts`` to the operator policy's limits."""
    for key, value in (definition or {}).items():
        attr = _OPTION.get(key)
        if attr is None:
            continue
        current = getattr(opts, attr)
        if current is None or value < current:
            setattr(opts, attr, value)
    return opts


def effective_definition(policy: dict[str, Any] | None,
                         operator: dict[str, Any] | None) -> dict[str, Any]:
    """What ``/api/queues`` shows as ``effective_policy_definition``."""
    out = dict(policy or {})
    for key, value in (operator or {}).items():
        mine = out.get(key)
        out[key] = value if not isinstance(mine, int) or value < mine else mine
    return out


__all__ = ["OPERATOR_KEYS", "OperatorPolicyStore", "cap", "effective_definition"]
