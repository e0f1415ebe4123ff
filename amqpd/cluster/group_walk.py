"""The reconciliation's walk over the queues a group kind leads (quorum queues:
:mod:`amqpd.cluster.quorum_group`, streams: :mod:`amqpd.cluster.stream_group`): each
queue of the kind here with its leading object, whose set-up is started where there is
none yet."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

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


ESTABLISH_RETRY: Final = 0.1  # seconds between a declare's tries to set its group up
ESTABLISH_PATIENCE: Final = 30.0  # seconds a declare's group set-up is tried at most


async def establish_for_declare(groups: Any, vh: VHost, q: QueueType,
                                refusal: Callable[[float], BaseException]) -> None:
    """``groups._establish`` until this node leads the group of ``q``, tried again every
    :data:`ESTABLISH_RETRY` s: the record of a queue of this name deleted a moment ago
    (here or on another node) may still be in etcd, and etcd may time out once. Given
    up after :data:`ESTABLISH_PATIENCE` s with ``refusal(patience)`` raised (the
    definitions' own bound answers the declare first), or as soon as the queue is no
    longer ``q``.

    The group stays in ``groups.establishing`` across each pause: a reconciliation's
    ``_establish`` started in one (:func:`lead_or_establish`) would run beside the next
    try; one of the two leads, and the other reads the record naming this node and
    takes it up as a restart's (term + 1; a stream's second epoch) while the node leads
    the term before (CI saw such a stream record: epochs ``[[18, 0], [19, 0]]``)."""
    ident = (vh.name, q.name)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ESTABLISH_PATIENCE
    try:
        while True:
            groups.establishing.add(ident)
            await groups._establish(vh, q)  # (discards ident from establishing)
            groups.establishing.add(ident)
            if vh.queues.get(q.name) is not q or ident in groups.leading:
                return
            if loop.time() >= deadline:
                raise refusal(ESTABLISH_PATIENCE)
            await asyncio.sleep(ESTABLISH_RETRY)
    finally:
        groups.establishing.discard(ident)


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


__all__ = ["ESTABLISH_PATIENCE", "ESTABLISH_RETRY", "establish_for_declare",
           "lead_or_establish", "led_queues"]
