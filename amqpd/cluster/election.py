"""One election round of a replicated queue whose leader was lost (issues 16 and 28):
the one implementation under mirrored queues (:mod:`amqpd.cluster.mirror_failover`)
and quorum queues (:mod:`amqpd.cluster.quorum_failover`).

A round, on every node holding a copy whose leader the view says is not running:

1. read the queue's record (``mirrors/...`` or the group record) from etcd; it is
   decided already when the record is gone, names another leader, or the leader runs
   again (a paused node, in a minority, never takes part);
2. the :class:`Ballot` of the queue's kind says whether this copy stands at all, and
   what it offers; the offer goes under
   ``{root}/{Ballot.DIRECTORY}/{vhost}/{queue}/{record revision}/{node}``, so the offers
   of one round are those made against the same record;
3. the offers are read until every member the ballot expects offered, or
   :data:`ELECTION_WAIT` passed;
4. the pure replica core chooses (:mod:`amqpd.cluster.replica_core`: the ballot's
   :class:`~amqpd.cluster.replica_core.PromotionPolicy` over the offers read); the
   winner takes over through its ballot (one etcd transaction guarded by the
   revisions of the queue's definition and its record: never two leaders); the
   others wait up to :data:`WINNER_WAIT` for the record to name another leader, else
   the round is undecided and the caller runs another.

What differs between the kinds -- who may stand, what an offer is, whose offers are
awaited, the promotion policy, the take-over -- is the ballot's; the round itself is
here once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Protocol, TypeVar

from amqpd.cluster.mirror_state import Ident, key_part
from amqpd.cluster.replica_core import Candidate, PromotionPolicy
from amqpd.cluster.takeover_txn import names_this_node, take_over_txn
from amqpd.coord.etcd import Compare, EtcdError, Put

if TYPE_CHECKING:
    from amqpd.cluster.mirror_copy import MirrorCopy
    from amqpd.cluster.node import Cluster
    from amqpd.coord.etcd import EtcdClient

ELECTION_WAIT: Final = 2.0  # seconds a candidate waits for the other candidates
WINNER_WAIT: Final = 5.0  # seconds a loser waits for the winner's record


class Elector(Protocol):
    """What a round needs of the node's replica groups (``Mirrors``, ``QuorumGroups``)."""

    cluster: Cluster
    etcd: EtcdClient
    root: str
    node: str

    @property
    def leading(self) -> Mapping[Ident, Any]: ...

    def record_key(self, ident: Ident) -> str: ...

    async def _finish_late_take_over(self, ident: Ident, copy: MirrorCopy,
                                     rec: dict[str, Any], rec_rev: int) -> bool: ...


H = TypeVar("H")


class Ballot(Generic[H]):
    """One round's rules for one kind of replicated queue (a subclass per kind), for
    its ``host`` (the node's part in that kind, whose state the rules read). The
    offers read so far are :attr:`candidates` (node -> its offer)."""

    DIRECTORY: ClassVar[str]  # the etcd directory of the offers

    def __init__(self, host: H, ident: Ident, copy: MirrorCopy,
                 rec: dict[str, Any]) -> None:
        self.host = host
        self.ident = ident
        self.copy = copy
        self.rec = rec
        self.candidates: dict[str, Candidate] = {}

    @property
    def offers(self) -> dict[str, int]:
        """Node -> the position it offers (what the round waits for and logs)."""
        return {n: c.position for n, c in self.candidates.items()}

    def stand(self) -> bool | None:
        """Before offering: None to stand, else the round's result (True: decided)."""
        return None

    def offer(self) -> str:
        """What this node offers (the value of its key)."""
        raise NotImplementedError

    def take(self, node: str, value: bytes) -> None:
        """One offer read from etcd."""
        raise NotImplementedError

    def expected(self) -> list[str]:
        """The nodes whose offers the round waits for (up to :data:`ELECTION_WAIT`)."""
        raise NotImplementedError

    def promotion(self) -> PromotionPolicy:
        """The kind's promotion rule (from the record read)."""
        raise NotImplementedError

    def standing(self) -> list[Candidate]:
        """The offers the choice is among (all read, unless the kind filters)."""
        return list(self.candidates.values())

    def awaited(self) -> list[str]:
        """Members that must offer before anyone else may win (see the core)."""
        return []

    def choose(self) -> str | None:
        """The winner of the offers read, or None: the replica core decides."""
        return self.promotion().choose(self.standing(), self.awaited())

    async def undecided(self) -> bool | None:
        """No winner: the round's result, or None to go on as a round another node won."""
        return False

    def announce(self, winner: str | None) -> None:
        """Log the round's outcome."""

    async def take_over(self, rec_rev: int, prefix: str) -> bool:
        """This node won: lead the queue (True: decided)."""
        raise NotImplementedError


async def election_round(elector: Elector, ident: Ident, copy: MirrorCopy,
                         ballot_for: Callable[[dict[str, Any]], Ballot[Any]]) -> bool:
    """One round (module docstring) for ``copy``, whose leader was lost; ``ballot_for``
    makes the round's ballot from the record read. True when it is decided (promoted
    here, elsewhere, or not possible)."""
    view = elector.cluster
    if view.paused:
        return False  # a paused node (minority) never takes a queue over
    etcd = elector.etcd
    key = elector.record_key(ident)
    kv = await etcd.get(key)
    if kv is None:
        return True
    rec = json.loads(kv.value)
    if rec.get("leader") == elector.node and ident not in elector.leading:
        return await elector._finish_late_take_over(ident, copy, rec, kv.mod_revision)
    if rec.get("leader") != copy.leader or view.is_running(copy.leader):
        return True  # somebody took over, or the leader is back
    ballot = ballot_for(rec)
    decided = ballot.stand()
    if decided is not None:
        return decided
    prefix = f"{elector.root}/{ballot.DIRECTORY}/{key_part(ident[0])}/" \
             f"{key_part(ident[1])}/{kv.mod_revision}/"
    await etcd.put(prefix + elector.node, ballot.offer())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ELECTION_WAIT
    while True:
        for c in await etcd.get_prefix(prefix):
            ballot.take(c.key.decode()[len(prefix):], c.value)
        if all(n in ballot.offers for n in ballot.expected()) or loop.time() > deadline:
            break
        await asyncio.sleep(0.05)
    winner = ballot.choose()
    if winner is None:
        result = await ballot.undecided()
        if result is not None:
            return result
    ballot.announce(winner)
    if winner == elector.node:
        return await ballot.take_over(kv.mod_revision, prefix)
    end = loop.time() + WINNER_WAIT
    while loop.time() < end:
        now = await etcd.get(key)
        if now is None or json.loads(now.value).get("leader") != copy.leader:
            return True
        await asyncio.sleep(0.1)
    return False  # the chosen one did not take over: another round


async def claim(elector: Elector, ident: Ident, copy: MirrorCopy, rec_rev: int,
                new_rec: dict[str, Any]) -> tuple[dict[str, Any], int] | bool:
    """The winner's take-over: one etcd transaction that makes this node the queue's
    leader in its definition (the catalogue's ``node``) and writes ``new_rec`` as its
    record, guarded by the definition's revision and the record's (``rec_rev``, the
    one the round read): never two leaders. The definition item written and the
    transaction's revision; True when there is nothing to take over (the definition
    is gone or names another leader already); False when a guard failed (another
    round decides)."""
    from amqpd.cluster.definitions import KIND_QUEUE

    vhost, name = ident
    etcd = elector.etcd
    defs_key = elector.cluster.mirror.etcd_key(KIND_QUEUE, f"{vhost}\x00{name}")
    kv = await etcd.get(defs_key)
    if kv is None:
        return True
    item = json.loads(kv.value)
    if item.get("node") != copy.leader:
        return True
    item["node"] = elector.node
    revision = await take_over_txn(
        etcd,
        [Compare("mod", defs_key, "==", kv.mod_revision),
         Compare("mod", elector.record_key(ident), "==", rec_rev)],
        [Put(defs_key, json.dumps(item, separators=(",", ":"))),
         Put(elector.record_key(ident), json.dumps(new_rec))],
        f"queue '{name}' in vhost '{vhost}'")
    if revision is None:
        return False
    return item, revision


async def late_claim(elector: Elector, ident: Ident, rec: dict[str, Any],
                     log: logging.Logger) -> dict[str, Any] | None:
    """The record names this node, which does not lead the queue: a take-over of this
    node's that etcd applied after it stopped waiting (amqpd.cluster.takeover_txn).
    The queue's definition item when it names this node too (the caller finishes the
    take-over, so the messages its copy holds are served), else None (the round is
    decided). ``log``: the kind's logger, for the line that says so."""
    from amqpd.cluster.definitions import KIND_QUEUE

    defs_key = elector.cluster.mirror.etcd_key(KIND_QUEUE, f"{ident[0]}\x00{ident[1]}")
    dkv = await elector.etcd.get(defs_key)
    if dkv is None or not names_this_node(rec, dkv.value, elector.node):
        return None
    log.warning("queue '%s' in vhost '%s': etcd names this node its leader (a take-over "
                "applied after its answer was lost); taking it over now", ident[1],
                ident[0])
    item: dict[str, Any] = json.loads(dkv.value)
    return item


async def clear_offers(etcd: EtcdClient, prefix: str) -> None:
    """The round's offers go once it is decided (best effort: etcd may be away)."""
    with contextlib.suppress(EtcdError):
        for c in await etcd.get_prefix(prefix):
            await etcd.delete(c.key)


__all__ = ["ELECTION_WAIT", "WINNER_WAIT", "Ballot", "Elector", "claim", "clear_offers",
           "election_round", "late_claim"]
