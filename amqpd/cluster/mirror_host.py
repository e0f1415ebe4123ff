"""What the parts of :class:`amqpd.cluster.mirror.Mirrors` share (issue 28's split of
mirror.py): the state ``Mirrors.__init__`` sets and the methods one part calls on
another, declared once so each part (:mod:`~amqpd.cluster.mirror_adopt`,
:mod:`~amqpd.cluster.mirror_frames`, :mod:`~amqpd.cluster.mirror_failover`) is
type-checked on its own. Declarations only, besides what :class:`NodePart` sets up.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from amqpd.cluster.node_part import NodePart

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, QueueType, VHost
    from amqpd.cluster.mirror_copy import MirrorCopy
    from amqpd.cluster.mirror_leading import Leading
    from amqpd.cluster.mirror_map import CopyMap
    from amqpd.cluster.mirror_state import CommitGate, Ident
    from amqpd.cluster.mirror_store import ReplicatingStore


class MirrorsHost(NodePart):
    """The state and cross-part methods of a ``Mirrors`` (or ``QuorumGroups``)."""

    RECORD: str
    NO_TAKE_OVER: str
    api: BrokerAPI
    gate: CommitGate
    store: ReplicatingStore
    leading: dict[Ident, Leading]
    by_rid: dict[tuple[str, int], Leading]
    next_rid: int
    copies: dict[tuple[str, int], MirrorCopy]  # (leader, rid) -> copy
    copy_of: dict[Ident, MirrorCopy]
    records: dict[Ident, dict[str, Any]]  # the mirror records, as last read
    promoting: dict[Ident, asyncio.Task[None]]
    promotions: int
    _ack_due: set[MirrorCopy]
    _tasks: list[asyncio.Task[None]]
    _checks: set[asyncio.Task[None]]  # failover_kept's etcd reads

    if TYPE_CHECKING:
        def record_key(self, ident: Ident) -> str: ...
        def request_sync(self, vhost: str, name: str, action: str) -> bool: ...
        def _lead(self, vh: VHost, q: QueueType) -> Leading: ...
        def stop_leading(self, lead: Leading, delete_record: bool) -> None: ...
        def adopts(self, type_name: str) -> bool: ...
        def _adopt_retired(self) -> None: ...
        def _new_map(self, ident: Ident, leader: str) -> CopyMap | None: ...
        def _end_copy(self, copy: MirrorCopy) -> None: ...
        def _up(self, node: str) -> bool: ...


__all__ = ["MirrorsHost"]
