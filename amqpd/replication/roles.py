"""RoleHooks: what a warren node does when it becomes active, standby, or is fenced.

The hooks are the seam between *deciding* a role (static configuration here; etcd
election in ``amqpd/replication/election`` code that calls the same hooks) and *being*
in it. Every hook is idempotent enough to be called by an election loop:

``start_as_active(epoch)``   open the store (recovery), record the epoch in the history,
                             serve replication and AMQP clients
``start_as_standby(addr, epoch)``  follow the active at ``addr``; no AMQP listener, no
                             store open (the HTTP API still answers)
``promote(epoch)``           standby -> active: stop following (everything received is
                             fsync'd), then ``start_as_active`` (recovery = a restart)
``demote_and_follow(addr, epoch)``  active -> standby: ``fence()``, close the store,
                             forget the in-memory state, follow ``addr`` (the follower
                             cuts our unconfirmed tail if the new active says so)
``fence()``                  stop accepting publishes: AMQP listeners closed, clients
                             closed with 320 CONNECTION_FORCED, replication stopped
                             (waiting confirms are nacked)

What the etcd election (amqpd/coord/warren.py, cluster code that reaches the broker only
through its public API and these hooks) calls: ``take_over(epoch)`` (from any role: a
standby promotes with every recovered message redelivered, a fenced node starts over
from its log), ``follow(addr, epoch)`` (start as, or demote to, a standby),
``log_end()``, and ``open_door()`` / ``close_door()`` (a standby's AMQP port that only
tells clients where the active is).

Static roles (``role = "active" | "standby"``, no etcd): the active starts at the epoch
of its history (1 on a fresh data directory); the standby follows ``peers[0]``;
``amqpctl promote`` (POST /api/replication/promote) promotes it to the next epoch by
hand. There is no automatic failover then, and the node says so at start.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqpd.config import host_port
from amqpd.replication.epochs import EpochHistory
from amqpd.replication.follower import ReplicationFollower
from amqpd.replication.source import ReplicationSource
from amqpd.store.tail import scan_tail

if TYPE_CHECKING:
    from amqpd.config import ReplicationConfig
    from amqpd.server import Broker

log = logging.getLogger("amqpd.replication")


class RoleError(Exception):
    """A role change that cannot be made now (e.g. promoting an active)."""


class RoleHooks:
    """Role changes of one broker process (see the module docstring)."""

    def __init__(self, broker: Broker) -> None:
        config = broker.settings.replication
        assert config is not None
        self.broker = broker
        self.config: ReplicationConfig = config
        self.log_dir = Path(broker.settings.data_dir) / "log"
        self.history = EpochHistory(self.log_dir)
        self.role = "starting"  # starting | active | standby | fenced
        self.source: ReplicationSource | None = None
        self.follower: ReplicationFollower | None = None
        self.epoch = self.history.last_epoch
        self._door: list[asyncio.base_events.Server] = []  # a standby's refusing listener
        # start_as_active awaits (the store opens in slices): a fence asked meanwhile is
        # carried out the moment the node is active, never skipped as "not active yet"
        self._activating = False
        self._fence_asked = False

    @property
    def active_address(self) -> str:
        return self.follower.active_addr if self.follower is not None else ""

    async def start(self) -> None:
        """Take the configured static role (``auto`` is left to the election)."""
        c = self.config
        if not self.broker.settings.persistence:
            # load_settings refuses this too; a Settings built by hand reaches here
            raise ValueError("replication needs persistence = true (it ships the log; "
                             "the in-memory store has none)")
        if c.role == "auto":
            log.info("replication: role decided through etcd %s", ",".join(c.etcd))
            await self.broker.start_http()
            return
        log.warning("replication: STATIC role %r without etcd: there is NO AUTOMATIC "
                    "FAILOVER; promote the standby by hand with `amqpctl promote`", c.role)
        if c.role == "active":
            await self.start_as_active(max(self.history.last_epoch, 1))
        else:
            await self.start_as_standby(c.peers[0], self.history.last_epoch)

    async def start_as_active(self, epoch: int) -> None:
        if self.role == "active":
            return
        if epoch < self.history.last_epoch:
            raise RoleError(f"epoch {epoch} is older than this node's "
                            f"{self.history.last_epoch}")
        if epoch > self.history.last_epoch:
            tail = scan_tail(self.log_dir, repair=True)
            self.history.begin(epoch, tail.last_seq + 1)
            log.warning("replication: epoch %d begins at sequence %d", epoch,
                        tail.last_seq + 1)
        self.epoch = epoch
        self._activating, self._fence_asked = True, False
        try:
            await self._activate(epoch)
        finally:
            self._activating = False
        if self._fence_asked:
            log.warning("replication: fenced while taking over; fencing now")
            await self.fence()

    async def _activate(self, epoch: int) -> None:
        broker = self.broker
        await broker.open_store()
        store: Any = broker.store
        self.source = ReplicationSource(store, self.config, self.history, epoch)
        await self.source.start()
        await broker.serve_clients()
        await broker.start_http()
        broker.announce()
        await broker.start_plugins()
        self.role = "active"
        log.warning("replication: this node (%s) is ACTIVE at epoch %d",
                    self.config.node_name, epoch)
        if broker.on_ready is not None:
            broker.on_ready(broker)

    async def start_as_standby(self, active_addr: str, epoch: int) -> None:
        await self.broker.start_http()
        if self.follower is not None:
            if self.follower.active_addr == active_addr:
                return
            await self.follower.stop()
        self.follower = ReplicationFollower(self.log_dir, self.config, self.history)
        self.follower.start(active_addr)
        self.role = "standby"
        self.epoch = max(epoch, self.history.last_epoch)
        log.warning("replication: this node (%s) is a STANDBY following %s",
                    self.config.node_name, active_addr)

    async def promote(self, epoch: int | None = None) -> int:
        """Standby -> active at ``epoch`` (default: the next one); returns the epoch."""
        if self.role == "active":
            raise RoleError("this node is already active")
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None
        new = epoch if epoch is not None else self.history.last_epoch + 1
        log.warning("replication: promoting this node to active at epoch %d", new)
        await self.start_as_active(new)
        return new

    async def demote_and_follow(self, active_addr: str, epoch: int) -> None:
        if self.role == "active":
            await self.fence()
        broker = self.broker
        broker.close_store()
        broker.reset_state()
        await self.start_as_standby(active_addr, epoch)

    async def take_over(self, epoch: int) -> None:
        """The election's word: this node is the active at ``epoch``, whatever it was."""
        broker = self.broker
        if self.role == "fenced":
            # lost the lease, nobody else took it, and we take it back at a new epoch:
            # start over from the log as a restarted process would
            broker.close_store()
            broker.reset_state()
        if self.follower is not None:
            # the old active may have delivered any message and died before its delivery
            # marks reached us: every recovered message comes back redelivered
            broker.takeover_redelivers = True
            try:
                await self.promote(epoch)  # stops following once all received is durable
            finally:
                broker.takeover_redelivers = False
        else:
            await self.start_as_active(epoch)

    async def follow(self, active_addr: str, epoch: int) -> None:
        """The election's word: follow the active at ``active_addr`` (a first role, or a
        demotion)."""
        if self.role == "starting":
            await self.start_as_standby(active_addr, epoch)
        else:
            await self.demote_and_follow(active_addr, epoch)

    def log_end(self) -> tuple[int, int]:
        """(epoch, last sequence) of this node's log while it neither serves nor follows
        (read from the files)."""
        return int(self.history.last_epoch), int(scan_tail(self.log_dir).last_seq)

    async def open_door(self) -> None:
        """A standby listens on its AMQP port only to tell clients where the active is:
        each connection is closed with 320 and a reason naming it (Session.authenticate
        asks the warren's ``refusal()``). Closed again before this node serves clients."""
        s = self.broker.settings
        if self._door or not s.port:
            return
        from amqpd.transport import AMQPProtocol

        loop = asyncio.get_running_loop()
        broker = self.broker
        for host in (["0.0.0.0"] if s.bind == "" else [s.bind]):
            try:
                self._door.append(await loop.create_server(
                    lambda: AMQPProtocol(broker), host=host, port=s.port,
                    reuse_address=True))
            except OSError as exc:
                log.warning("warren: standby cannot listen on %s to redirect clients: %s",
                            host_port(host, s.port), exc)

    def close_door(self) -> None:
        """A client still in its handshake there will be served: the node is taking over."""
        door, self._door = self._door, []
        for server in door:
            server.close()

    async def fence(self) -> None:
        if self.role != "active":
            if self._activating:
                self._fence_asked = True
            return
        self.role = "fenced"
        log.warning("replication: FENCED: no more publishes; closing client connections")
        broker = self.broker
        for plugin in broker.plugins.values():  # shovels, federation: the active's work
            try:
                await plugin.stop()
            except Exception:
                log.exception("plugin %s failed to stop", plugin.name)
        await broker.close_clients("fenced: this node is no longer the active")
        if self.source is not None:
            await self.source.stop()
            self.source = None

    async def stop(self) -> None:
        """Broker shutdown."""
        if self.source is not None:
            await self.source.stop()
            self.source = None
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None

    def status(self) -> dict[str, Any]:
        """Figures for /api/replication, /api/nodes and metrics."""
        out: dict[str, Any] = {"node": self.config.node_name, "role": self.role,
                               "epoch": self.epoch, "mode": self.config.mode,
                               "static": self.config.role != "auto",
                               "history": [list(e) for e in self.history.entries]}
        store: Any = self.broker.store
        if self.source is not None and store is not None:
            src = self.source
            out["last_seq"] = src.last_seq
            out["listen_port"] = src.port
            out["insync_count"] = src.insync_count()
            out["min_insync_standbys"] = src.gate.minimum if src.gate else 0
            out["left_insync_total"] = src.left_insync
            out["nacked_total"] = src.gate.nacked if src.gate else 0
            out["auth_failures_total"] = src.auth_failures
            out["lane_frames_total"] = src.lane_frames
            if src.gate is not None:
                out["commits_ahead_total"] = src.gate.ahead
                out["commits_waited_total"] = src.gate.released
                out["commits_waited_seconds_total"] = round(src.gate.waited_s, 6)
            out["standbys"] = [s.__dict__ for s in src.standbys()]
        if self.follower is not None:
            f = self.follower
            self.epoch = max(self.epoch, f.epoch)  # the active's, learnt on WELCOME
            out.update(epoch=self.epoch, active=f.active_addr, active_name=f.active_name,
                       connected=f.connected, last_seq=f.last_seq, active_seq=f.active_seq,
                       durable_seq=f.durable_seq, standby_ack=f.config.standby_ack,
                       lag_records=f.lag_records, lag_seconds=round(f.lag, 3),
                       bytes_received=f.bytes_received, refused=f.refused)
        return out
