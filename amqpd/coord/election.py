"""Leader election and fencing for the warren, decided by etcd.

Theory of operation. Every key lives under ``prefix`` (``/amqpd/warren`` by default):

``leader``
    The active node's record (name, epoch, addresses), attached to a lease of
    ``lease_ttl`` seconds that the active renews. A takeover is one etcd transaction whose
    first guard is ``create_revision(leader) == 0``: the key must not exist, so of two
    nodes racing for it, etcd lets exactly one win. When the active dies its lease runs
    out and etcd deletes the key; when it stops gracefully it revokes the lease, and the
    key goes at once.
``epoch``
    A counter that every takeover increments in the same transaction, guarded by its
    ``mod_revision`` (compare-and-swap): no two leaderships ever share an epoch, and the
    replication log orders its history by (epoch, sequence).
``state``
    What the active last said about its log: its epoch, its last durable sequence number
    and its in-sync standbys with the sequence each has made durable. Only the active
    writes it, in a transaction guarded by ``lease(leader) == its lease``, so a deposed
    active cannot overwrite it. It has no lease: it outlives the active on purpose, since
    it is how a standby proves, after the active is gone, that it holds every confirmed
    record. A takeover guards ``mod_revision(state)`` too and rewrites it (the new active
    is then the only in-sync member), so eligibility and takeover are one atomic step.
``nodes/<name>``, ``alive/<name>``
    Each node's own status (role, epoch, log position, lag, addresses, a wall-clock
    stamp), rewritten when it changes, and its presence under a lease of three
    ``lease_ttl`` that it keeps alive, for ``/api/nodes`` and ``amqpctl cluster_status``;
    informational only.

The in-sync rule (Kafka's ISR, LavinMQ's etcd election): a node may take the leader key
only when ``state`` is absent (nothing was ever active under this prefix), names it as
the last active, or lists it as in-sync with a durable sequence at or below its own.

Fencing. The active renews its lease every ``lease_ttl / 6`` seconds, each call with a
deadline of the same length, from a thread of its own (:mod:`amqpd.coord.lease`: a busy
event loop, e.g. a takeover loading a large backlog, cannot delay a renewal). etcd
cannot expire the lease before ``lease_ttl`` seconds after the last renewal that
succeeded was *sent* (it restarts the TTL when it receives it, which is later). So the
active, by its own monotonic clock, fences itself ``fence_after`` seconds after that
send (two thirds of the TTL by default): it stops accepting publishes and closes its
clients with 320 CONNECTION_FORCED. The remaining
third is the margin for the fence itself to run (the loop's timer, or the lease thread's
report when the loop was busy); by the time any standby can hold the
key, the old active has stopped taking publishes. A fenced node then goes back to being
a candidate: it follows whoever holds the key (``become_standby``), or takes it again
with a new epoch if it is still eligible and nobody else is.

What this module needs from the broker is the small :class:`NodeHooks` protocol, so the
state machine is tested against a real etcd with a stand-in node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from amqpd.coord.etcd import Compare, EtcdClient, EtcdError, Get, KeyValue, Put
from amqpd.coord.lease import LeaseKeeper

log = logging.getLogger("amqpd.coord.election")

# seconds between rewrites of an unchanged node record (its lag figures and stamp)
RECORD_REFRESH = 10.0

# roles, as /api/nodes, /health/* and metrics report them
CANDIDATE = "candidate"  # deciding (start-up, or after losing leadership)
PROMOTING = "promoting"  # holds the key, finishing the log before accepting clients
ACTIVE = "active"
STANDBY = "standby"
FENCED = "fenced"  # was active, could not renew in time: accepts nothing
STOPPED = "stopped"
ROLE_CODES = {CANDIDATE: 0, ACTIVE: 1, STANDBY: 2, PROMOTING: 3, FENCED: 4, STOPPED: 5}


@dataclass(frozen=True)
class LeaderInfo:
    """The record under the leader key: who is active, since which epoch, where."""

    node: str
    epoch: int
    amqp: str = ""  # host:port clients use (the close reason on a standby names it)
    http: str = ""
    replication: str = ""  # host:port of its replication listener (standbys follow it)

    @classmethod
    def from_kv(cls, kv: KeyValue) -> LeaderInfo:
        data = kv.json()
        return cls(str(data["node"]), int(data["epoch"]), str(data.get("amqp", "")),
                   str(data.get("http", "")), str(data.get("replication", "")))


class NodeHooks(Protocol):
    """What the election asks of the node it runs for (amqpd/coord/warren.py adapts the
    broker; the unit tests use a stand-in)."""

    async def become_active(self, epoch: int) -> None:
        """Took the key: finish applying the log, open for clients (may take a while;
        the lease is renewed meanwhile)."""

    async def become_standby(self, leader: LeaderInfo) -> None:
        """Follow ``leader`` (cut any tail it never had, then catch up)."""

    def fence(self, reason: str) -> None:
        """Stop accepting publishes and close clients with 320, now (synchronous)."""

    def log_position(self) -> tuple[int, int]:
        """(epoch, last durable sequence number) of the local log."""

    def insync_standbys(self) -> dict[str, int]:
        """On the active: in-sync standby name -> the sequence it has made durable."""

    def insync_recorded(self, names: set[str]) -> None:
        """On the active: etcd now records ``names`` as the in-sync set (confirms may stop
        waiting for a standby only after this)."""

    def status(self) -> dict[str, Any]:
        """Extra fields for this node's record (lag, connected, ...)."""


@dataclass
class ElectionSettings:
    node_name: str
    prefix: str = "/amqpd/warren"
    lease_ttl: float = 3.0
    fence_after: float = 0.0  # 0 = two thirds of lease_ttl
    poll_interval: float = 0.0  # 0 = min(0.5, lease_ttl / 6)
    addresses: dict[str, str] = field(default_factory=dict)  # amqp, http, replication

    def __post_init__(self) -> None:
        if self.lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive")
        if not self.fence_after:
            self.fence_after = self.lease_ttl * 2 / 3
        if not 0 < self.fence_after < self.lease_ttl:
            raise ValueError("fence_after must be between 0 and lease_ttl")
        if not self.poll_interval:
            self.poll_interval = min(0.5, self.lease_ttl / 6)


class Election:
    """One node's side of the election; ``start()`` runs it until ``stop()``."""

    def __init__(self, client: EtcdClient, hooks: NodeHooks, settings: ElectionSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.etcd = client
        self.hooks = hooks
        self.settings = settings
        self.clock = clock
        p = settings.prefix.rstrip("/")
        self.leader_key = f"{p}/leader"
        self.epoch_key = f"{p}/epoch"
        self.state_key = f"{p}/state"
        self.nodes_prefix = f"{p}/nodes/"
        self.alive_prefix = f"{p}/alive/"
        self.role = CANDIDATE
        self.epoch = 0  # the epoch this node last led or followed
        self.leader: LeaderInfo | None = None
        self.lease_id = 0
        self._keeper: LeaseKeeper | None = None  # renews the lease while leading
        self._fence_at = 0.0  # fence_at and renewed_at while no keeper runs
        self._renewed_at = 0.0
        self.takeovers = 0
        self.fences = 0
        self.last_error = ""
        self.not_eligible = ""  # why this node may not take the key now ("" = it may)
        self._task: asyncio.Task[None] | None = None
        self._fence_timer: asyncio.TimerHandle | None = None
        self._published_state: dict[str, Any] | None = None
        self._wake = asyncio.Event()
        self._record_written: dict[str, Any] | None = None
        self._record_at = 0.0
        self._presence = 0  # the lease of alive/<name>
        self._granted: set[int] = set()  # leader leases this process was granted
        self._defer_until = 0.0  # monotonic: no takeover before (a restart's grace)

    # ------------------------------------------------------------------ public
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="warren-election")

    @property
    def fence_at(self) -> float:
        """Monotonic: fence if not renewed by then (the lease thread moves it)."""
        keeper = self._keeper
        return keeper.fence_at if keeper is not None else self._fence_at

    @property
    def renewed_at(self) -> float:
        """Monotonic send time of the last successful renewal."""
        keeper = self._keeper
        return keeper.renewed_at if keeper is not None else self._renewed_at

    def wake(self) -> None:
        """Run the next step now (the in-sync set changed: record it without waiting for
        the poll)."""
        self._wake.set()

    def holds_lease(self) -> bool:
        """True while this node leads and its lease cannot have run out."""
        return self.role == ACTIVE and self.clock() < self.fence_at

    async def stop(self) -> None:
        """Graceful stop: stop accepting publishes, then revoke the lease so a standby
        takes over at once (no wait for the lease to run out)."""
        was_leading = self.role in (ACTIVE, PROMOTING)
        self.role = STOPPED
        self._stop_keeper()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._cancel_fence_timer()
        if was_leading:
            self.hooks.fence("node is stopping; handing over")
        if self.lease_id:
            try:
                await self.etcd.revoke(self.lease_id, timeout=self.settings.lease_ttl / 3)
                log.info("warren: lease revoked; a standby can take over now")
            except EtcdError as exc:
                log.warning("warren: could not revoke the lease (%s); it runs out in %ss",
                            exc, self.settings.lease_ttl)
            self.lease_id = 0
        with contextlib.suppress(EtcdError):
            await self._publish_node(timeout=self.settings.lease_ttl / 3)
        if self._presence:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(self._presence, timeout=self.settings.lease_ttl / 3)
            self._presence = 0

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        interval = self.settings.poll_interval
        while self.role != STOPPED:
            try:
                await self._step()
                self.last_error = ""
            except asyncio.CancelledError:
                raise
            except EtcdError as exc:
                if self.last_error != str(exc):
                    log.warning("warren: etcd: %s", exc)
                self.last_error = str(exc)
            except Exception as exc:
                log.exception("warren: election step failed")
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)

    async def _step(self) -> None:
        timeout = self.settings.poll_interval * 2
        if self.role in (ACTIVE, PROMOTING):
            await self._publish_state(timeout)
            await self._publish_node(timeout)
            return
        kv = await self.etcd.get(self.leader_key, timeout=timeout)
        if kv is not None:
            leader = LeaderInfo.from_kv(kv)
            if leader.node == self.settings.node_name:
                await self._release_own_key(kv.lease, leader.epoch, timeout)
                return
            if self.role != STANDBY or self.leader != leader:
                await self._follow(leader)
            await self._publish_node(timeout)
            return
        if self.clock() < self._defer_until:  # an in-sync standby goes first
            await self._publish_node(timeout)
            return
        if await self._try_takeover(timeout):
            return
        await self._publish_node(timeout)

    async def _release_own_key(self, lease: int, epoch: int, timeout: float) -> None:
        """The leader key names this node, but this node does not lead: let it go now
        rather than wait for its lease. Either this process held it before it fenced
        itself (its revoke did not reach etcd, e.g. etcd was down and restarted with the
        lease), or an earlier run of this node did, killed and restarted within the
        lease. In the second case this node then waits a few polls before trying to
        take the key itself, so that the standby, which was waiting for exactly this
        key to go, takes over as docs/warren.md says; this node then follows it. If the
        standby may not (not in sync) or is gone, this node takes the key after the
        wait."""
        if lease in self._granted:
            log.warning("warren: the leader key still names this node under the lease it "
                        "held before it fenced itself (epoch %d); revoking it", epoch)
        else:
            grace = max(3 * self.settings.poll_interval, 1.0)
            log.warning("warren: the leader key names this node from an earlier run "
                        "(epoch %d); revoking its lease, and leaving the key to an in-sync "
                        "standby for %.1fs", epoch, grace)
            self._defer_until = self.clock() + grace
        await self.etcd.revoke(lease, timeout=timeout)

    async def _follow(self, leader: LeaderInfo) -> None:
        log.info("warren: %s is active (epoch %d); following it as a standby",
                 leader.node, leader.epoch)
        self.leader = leader
        self.epoch = leader.epoch
        self.role = STANDBY
        await self.hooks.become_standby(leader)

    # ------------------------------------------------------------------ takeover
    def eligible(self, state: dict[str, Any] | None) -> str:
        """"" when this node may take the key given the active's last ``state``, else
        why not (the in-sync rule, in the module docstring)."""
        if state is None:
            return ""
        me = self.settings.node_name
        if state.get("node") == me:
            return ""
        _, seq = self.hooks.log_position()
        insync = state.get("insync") or {}
        if me not in insync:
            return (f"not in the in-sync set {sorted(insync)} that {state.get('node')} "
                    f"published at epoch {state.get('epoch')}")
        if seq < int(insync[me]):
            return (f"local log ends at {seq}, before the {insync[me]} this node had "
                    "acknowledged: it lost data")
        return ""

    async def _try_takeover(self, timeout: float) -> bool:
        epoch_kv = await self.etcd.get(self.epoch_key, timeout=timeout)
        state_kv = await self.etcd.get(self.state_key, timeout=timeout)
        state = state_kv.json() if state_kv is not None else None
        why = self.eligible(state)
        if why != self.not_eligible:
            if why:
                log.warning("warren: no active node, and this one may not take over: %s",
                            why)
            self.not_eligible = why
        if why:
            return False
        current = int(epoch_kv.value) if epoch_kv is not None else 0
        new_epoch = current + 1
        ttl = math.ceil(self.settings.lease_ttl)
        sent = self.clock()
        lease = await self.etcd.grant(ttl, timeout=timeout)
        self._granted.add(lease.id)
        leader = LeaderInfo(self.settings.node_name, new_epoch,
                            **{k: v for k, v in self.settings.addresses.items()
                               if k in ("amqp", "http", "replication")})
        _, seq = self.hooks.log_position()
        new_state = {"node": self.settings.node_name, "epoch": new_epoch, "seq": seq,
                     "insync": {}}
        try:
            result = await self.etcd.txn(
                [Compare("create", self.leader_key, "==", 0),
                 Compare("mod", self.epoch_key, "==",
                         epoch_kv.mod_revision if epoch_kv else 0),
                 Compare("mod", self.state_key, "==",
                         state_kv.mod_revision if state_kv else 0)],
                [Put(self.leader_key, json.dumps(asdict(leader)), lease.id),
                 Put(self.epoch_key, str(new_epoch)),
                 Put(self.state_key, json.dumps(new_state))],
                [Get(self.leader_key)], timeout=timeout)
        except EtcdError:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(lease.id, timeout=timeout)
            raise
        if not result.succeeded:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(lease.id, timeout=timeout)
            log.info("warren: another node took the leader key first")
            return False
        # ours: the lease counts from before the grant was sent, as any renewal does
        self.lease_id = lease.id
        self.epoch = new_epoch
        self.leader = leader
        self.role = PROMOTING
        self.takeovers += 1
        self._published_state = new_state
        self._keeper = LeaseKeeper(self.etcd.endpoints, lease.id, self.settings.lease_ttl,
                                   self.settings.fence_after, sent, self.clock,
                                   asyncio.get_running_loop(), self._lease_lost).start()
        self._arm_fence_timer()
        log.info("warren: took the leader key at epoch %d (lease %x, ttl %ds); promoting",
                 new_epoch, lease.id, ttl)
        try:
            await self.hooks.become_active(new_epoch)
        except Exception as exc:
            log.exception("warren: promotion failed; giving the key back")
            self._lose(f"promotion failed: {exc}")
            return True
        if self.role == PROMOTING:  # not fenced while promoting
            self.role = ACTIVE
            log.info("warren: active at epoch %d", new_epoch)
        return True

    # ------------------------------------------------------------------ leading
    def _arm_fence_timer(self) -> None:
        """The loop's own check at ``fence_at``: it re-arms itself while the lease thread
        keeps moving ``fence_at`` forward, and fences once it has not."""
        self._cancel_fence_timer()
        delay = max(self.fence_at - self.clock(), 0.0)
        self._fence_timer = asyncio.get_running_loop().call_later(delay, self._fence_due)

    def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            self._fence_at, self._renewed_at = keeper.fence_at, keeper.renewed_at
            keeper.stop()

    def _lease_lost(self, reason: str) -> None:
        """The lease thread's report, on the loop."""
        if self.role in (ACTIVE, PROMOTING):
            self._lose(reason)

    def _cancel_fence_timer(self) -> None:
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None

    def _fence_due(self) -> None:
        self._fence_timer = None
        if self.role not in (ACTIVE, PROMOTING):
            return
        if self.fence_at > self.clock():  # renewed meanwhile (or a timer fired early)
            self._arm_fence_timer()
            return
        self._lose(f"lease not renewed for {self.clock() - self.renewed_at:.2f}s "
                   f"(ttl {self.settings.lease_ttl}s)")

    def _lose(self, reason: str) -> None:
        """Stop leading now: fence first (publishes stop), then tidy up in the background."""
        if self.role not in (ACTIVE, PROMOTING):
            return
        log.error("warren: fencing this node: %s", reason)
        self.role = FENCED
        self.fences += 1
        self._cancel_fence_timer()
        self.hooks.fence(reason)
        self._stop_keeper()
        lease, self.lease_id = self.lease_id, 0
        self.leader = None
        if lease:
            asyncio.get_running_loop().create_task(self._revoke_quietly(lease))
        # a fenced node becomes a candidate on the next step: follow, or take over again
        asyncio.get_running_loop().call_soon(self._after_fence)

    def _after_fence(self) -> None:
        if self.role == FENCED:
            self.role = CANDIDATE
            self._wake.set()

    async def _revoke_quietly(self, lease: int) -> None:
        with contextlib.suppress(EtcdError):
            await self.etcd.revoke(lease, timeout=self.settings.lease_ttl / 3)

    async def _publish_state(self, timeout: float) -> None:
        """The active's log position and in-sync set, when they changed (guarded by our
        lease: a deposed active cannot write it)."""
        if self.role != ACTIVE:
            return
        _epoch, seq = self.hooks.log_position()
        insync = {k: int(v) for k, v in self.hooks.insync_standbys().items()}
        state = {"node": self.settings.node_name, "epoch": self.epoch, "seq": seq,
                 "insync": insync}
        previous = self._published_state
        if previous is not None and previous.get("insync", {}).keys() == insync.keys() and \
                previous.get("epoch") == self.epoch and seq - int(previous.get("seq", 0)) \
                < 10_000 and all(insync[k] - int(previous["insync"][k]) < 10_000
                                 for k in insync):
            return  # the set is the same and positions moved little: nothing to say
        result = await self.etcd.txn(
            [Compare("lease", self.leader_key, "==", self.lease_id)],
            [Put(self.state_key, json.dumps(state))], timeout=timeout)
        if result.succeeded:
            if previous is None or previous.get("insync", {}).keys() != insync.keys():
                log.info("warren: in-sync standbys now %s", sorted(insync) or "none")
            self._published_state = state
            self.hooks.insync_recorded(set(insync))
        else:
            self._lose("the leader key is no longer ours")

    async def _publish_node(self, timeout: float) -> None:
        """This node's record under ``nodes/<name>``, rewritten only when something other
        than its lag figures changed, or every ``RECORD_REFRESH`` seconds (each write is
        an etcd revision, kept until etcd compacts), and its presence under
        ``alive/<name>``, attached to a lease that keep-alives (no revisions) renew."""
        epoch, seq = self.hooks.log_position()
        record = {"node": self.settings.node_name, "role": self.role, "epoch": self.epoch,
                  "log_epoch": epoch, "seq": seq, "leader": self.leader.node
                  if self.leader else None, **self.settings.addresses,
                  **self.hooks.status()}
        steady = {k: v for k, v in record.items() if k not in ("seq", "replication")}
        now = self.clock()
        if steady != self._record_written or now - self._record_at >= RECORD_REFRESH:
            record["updated"] = time.time()
            await self.etcd.put(self.nodes_prefix + self.settings.node_name,
                                json.dumps(record), timeout=timeout)
            self._record_written, self._record_at = steady, now
        if self.role == STOPPED:
            return
        if self._presence and await self.etcd.keepalive(self._presence, timeout) > 0:
            return
        lease = await self.etcd.grant(math.ceil(self.settings.lease_ttl * 3), timeout)
        await self.etcd.put(self.alive_prefix + self.settings.node_name, "1", lease.id,
                            timeout=timeout)
        self._presence = lease.id

    async def nodes(self, timeout: float = 1.0) -> list[dict[str, Any]]:
        """Every node's last record (for /api/nodes and amqpctl cluster_status), with
        ``alive``: whether its presence lease still runs."""
        kvs = await self.etcd.get_prefix(self.nodes_prefix, timeout=timeout)
        alive = {kv.key.decode(errors="replace").rpartition("/")[2]
                 for kv in await self.etcd.get_prefix(self.alive_prefix, timeout=timeout)}
        out = []
        for kv in kvs:
            with contextlib.suppress(ValueError):
                record = kv.json()
                record["alive"] = record.get("node") in alive
                out.append(record)
        return out


__all__ = ["ACTIVE", "CANDIDATE", "FENCED", "PROMOTING", "ROLE_CODES", "STANDBY", "STOPPED",
           "Election", "ElectionSettings", "LeaderInfo", "NodeHooks"]
