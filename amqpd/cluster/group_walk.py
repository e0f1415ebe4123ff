"""The reconciliation's walk over the queues a group kind leads (quorum queues:
:mod:`amqpd.cluster.quorum_group`, streams: :mod:`amqpd.cluster.stream_group`): each
queue of the kind here with its leading object, whose set-up is started where there is
none yet."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.broker.api import QueueType, VHost
    from amqpd.cluster.mirror_state import Ident


def lead_or_establish(groups: Any, vh: VHost, q: QueueType) -> Any:
    """The leading object of ``groups`` (QuorumGroups, StreamGroups) for queue ``q``
    here, or None: there is none yet (one replaced with its queue is stopped), and the
    group's set-up (``groups._establish``) is started unless it runs already."""
    ident = (vh.name, q.name)
    lead = groups.leading.get(ident)
    if lead is not None and lead.q is not q:
        groups.stop_leading(lead, delete_record=False)
        lead = None
    if lead is None and ident not in groups.establishing:
        groups.establishing.add(ident)
        groups._spawn(groups._establish(vh, q))
    return lead


def led_queues(groups: Any, wanted: Callable[[QueueType], bool], seen: set[Ident]
               ) -> Iterator[tuple[VHost, QueueType, Any]]:
    """Every queue here that ``wanted`` picks, with its leading object in ``groups``
    (:func:`lead_or_establish`); a queue without one yet is passed over. Each picked
    queue is added to ``seen``, so the caller can stop leading the ones gone."""
    for vh in groups.broker.vhosts.values():
        for q in list(vh.queues.values()):
            if not wanted(q):
                continue
            seen.add((vh.name, q.name))
            lead = lead_or_establish(groups, vh, q)
            if lead is not None:
                yield vh, q, lead


__all__ = ["lead_or_establish", "led_queues"]
