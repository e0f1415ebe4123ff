"""The warren beside a broker: runs the etcd election (``role = "auto"``) and answers
what the health checks, ``/api/nodes``, ``amqpctl cluster_status`` and the metrics ask:
which role this node has, whether it holds the lease and takes publishes, whether it is
an in-sync standby, and what the other nodes last said.

The broker's role changes go through the hooks of the replication layer
(:class:`amqpd.replication.roles.RoleHooks`: ``take_over``, ``follow``, ``fence``, the
standby's door); this module only decides *when*, from what etcd says, and adapts the
replication layer's state to the election's :class:`~amqpd.coord.election.NodeHooks`.
Everything else it reads about the node comes through the public broker API
(:class:`amqpd.broker.api.BrokerAPI`): this is cluster code, and the import-linter
contract in pyproject.toml keeps it off the broker's internals.

With a static role (``role = "active"`` or ``"standby"``, no etcd) there is no election:
the role is the broker's, and nothing fails over by itself (``amqpctl promote``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from amqpd.config import host_port
from amqpd.coord.election import (
    ACTIVE,
    CANDIDATE,
    PROMOTING,
    ROLE_CODES,
    STANDBY,
    Election,
    ElectionSettings,
    LeaderInfo,
)
from amqpd.coord.etcd import EtcdClient, EtcdError

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.config import ReplicationConfig
    from amqpd.replication.roles import RoleHooks

log = logging.getLogger("amqpd.coord.warren")


async def _maybe_await(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


def _addr(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return host_port(host, port)


class Warren:
    """One node's membership of the pair; ``broker.warren`` while ``[replication]`` is set
    (``api.warren()`` to the HTTP API: :class:`amqpd.broker.api.WarrenStatus`)."""

    def __init__(self, api: BrokerAPI, roles: RoleHooks, config: ReplicationConfig) -> None:
        self.api = api
        self.roles = roles
        self.config = config
        self.name = config.node_name or api.settings.node_name
        self.election: Election | None = None
        self.fenced = False
        self.fence_reason = ""
        self.started_role = ""  # "" until the broker got its first role
        self.peers: list[dict[str, Any]] = []  # other nodes' last records (from etcd)
        self.peers_at = 0.0
        self._peer_task: asyncio.Task[None] | None = None
        self._fencing: asyncio.Future[Any] | None = None
        self._idle_position: tuple[int, int] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.config.role != "auto":
            log.warning("warren: static role %r: no automatic failover (without etcd, "
                        "`amqpctl promote` moves the active role by hand)", self.config.role)
            return
        client = EtcdClient(self.config.etcd, timeout=max(self.config.lease_ttl / 3, 0.5))
        self.election = Election(client, self, ElectionSettings(
            self.name, prefix=self.config.etcd_prefix, lease_ttl=self.config.lease_ttl,
            addresses=self.addresses()))
        self.election.start()
        self._peer_task = asyncio.create_task(self._refresh_peers(), name="warren-peers")
        log.info("warren: node %s joins the election under %s on %s (lease %ss)", self.name,
                 self.config.etcd_prefix, ", ".join(self.config.etcd), self.config.lease_ttl)

    async def stop(self) -> None:
        """Graceful: hand over at once (the election fences, then revokes its lease)."""
        if self._peer_task is not None:
            self._peer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._peer_task
        self.roles.close_door()
        if self.election is not None:
            roles = self.roles
            if self.election.role in (ACTIVE, PROMOTING):
                # every client closed before the lease goes: then a standby may take over
                self.fenced, self.fence_reason = True, "node is stopping"
                await roles.fence()
            await self.election.stop()
            await self.election.etcd.close()

    def addresses(self) -> dict[str, str]:
        api = self.api
        s = api.settings
        amqp = next((_addr(h, p) for proto, h, p in api.listeners() if proto == "amqp"), "")
        if not amqp and s.port:
            amqp = _addr(s.bind, s.port)
        http = ""
        if api.http_port():
            http = _addr(s.http_bind or s.bind, api.http_port())
        return {"amqp": amqp, "http": http,
                "replication": self.config.advertise or self.config.listen}

    async def _refresh_peers(self) -> None:
        assert self.election is not None
        interval = max(self.election.settings.poll_interval * 2, 0.5)
        while True:
            try:
                records = await self.election.nodes(timeout=interval)
            except EtcdError:
                pass
            else:
                self.peers = [r for r in records if r.get("node") != self.name]
                self.peers_at = time.time()
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ what others ask
    @property
    def role(self) -> str:
        if self.election is not None:
            return self.election.role
        return self.roles.role

    @property
    def epoch(self) -> int:
        if self.election is not None:
            return self.election.epoch
        return self.roles.epoch

    def holds_lease(self) -> bool:
        """Leads by etcd's word (a static active: by configuration)."""
        if self.election is not None:
            return self.election.holds_lease()
        return self.role == ACTIVE

    def accepting_publishes(self) -> bool:
        """This node is the one clients must reach: it leads and takes publishes."""
        api = self.api
        return (self.holds_lease() and not self.fenced and not api.stopping()
                and self.roles.role == ACTIVE
                and any(proto in ("amqp", "amqps") for proto, _, _ in api.listeners()))

    def in_sync(self) -> bool:
        """A standby within ``max_lag`` of its active (what /health/standby reports)."""
        if self.role != STANDBY:
            return False
        follower = self.follower()
        if follower is None or not follower.connected:
            return False
        return float(follower.lag) <= self.config.max_lag

    def leader(self) -> LeaderInfo | None:
        return self.election.leader if self.election is not None else None

    def active_node(self) -> str | None:
        leader = self.leader()
        return leader.node if leader is not None else None

    def refusal(self) -> str | None:
        """Why an AMQP client may not use this node, naming the active; None = it may."""
        if self.accepting_publishes():
            return None
        leader = self.leader()
        where = (f"; the active node is {leader.node} at {leader.amqp}" if leader is not None
                 and leader.node != self.name else "")
        if self.fenced:
            return f"this node lost the warren lease ({self.fence_reason}){where}"
        return f"this node is a warren {self.role}, not the active one{where}"

    # ------------------------------------------------------------------ replication state
    def source(self) -> Any:
        return self.roles.source

    def follower(self) -> Any:
        return self.roles.follower

    def replication_status(self) -> dict[str, Any]:
        """The replication layer's figures (lag in records, bytes, seconds)."""
        return dict(self.roles.status())

    # ------------------------------------------------------------------ NodeHooks
    async def become_active(self, epoch: int) -> None:
        self.roles.close_door()
        await self.roles.take_over(epoch)
        source = self.source()
        if source is not None and self.election is not None:
            source.insync_changed = self.election.wake  # record a change at once
        self.fenced = False
        self.started_role = ACTIVE
        log.info("warren: %s is the active node at epoch %d", self.name, epoch)

    async def become_standby(self, leader: LeaderInfo) -> None:
        if not leader.replication:
            raise RuntimeError(f"the active {leader.node} publishes no replication address")
        await self.roles.follow(leader.replication, leader.epoch)
        self.started_role = STANDBY
        self.fenced = False
        await self.roles.open_door()

    def fence(self, reason: str) -> None:
        self.fenced = True
        self.fence_reason = reason
        roles = self.roles
        # roles.fence() closes the listeners and sends every client its 320 before its
        # first await; it runs at the very next turn of the loop
        self._fencing = asyncio.ensure_future(roles.fence())

    def log_position(self) -> tuple[int, int]:
        roles = self.roles
        follower, source = roles.follower, roles.source
        if follower is not None or source is not None:
            self._idle_position = None
        if follower is not None:
            return int(follower.epoch), int(follower.last_seq)
        if source is not None:
            return int(roles.epoch), int(source.last_seq)
        # neither following nor serving: the log does not move; read its end once
        if self._idle_position is None:
            self._idle_position = roles.log_end()
        return self._idle_position

    def insync_standbys(self) -> dict[str, int]:
        source = self.source()
        if source is None:
            return {}
        return {s.name: int(s.acked_seq) for s in source.standbys() if s.in_sync}

    def insync_recorded(self, names: set[str]) -> None:
        source = self.source()
        if source is not None and source.gate is not None:
            source.gate.recorded(names)

    def status(self) -> dict[str, Any]:
        rep = self.replication_status()
        rep.pop("history", None)
        return {"replication": rep, "in_sync": self.in_sync()}

    # ------------------------------------------------------------------ views
    def role_code(self) -> int:
        return ROLE_CODES.get(self.role, ROLE_CODES[CANDIDATE])

    def election_figures(self) -> dict[str, Any] | None:
        """Lease and election counters for the metrics (None: a static role)."""
        election = self.election
        if election is None:
            return None
        remaining = max(election.fence_at - time.monotonic(), 0.0) \
            if election.holds_lease() else 0.0
        return {"lease_remaining_seconds": round(remaining, 3),
                "takeovers": election.takeovers, "fences": election.fences}

    def node_fields(self) -> dict[str, Any]:
        """amqpd's warren fields of this node's /api/nodes entry."""
        leader = self.leader()
        return {"amqpd_role": self.role, "amqpd_epoch": self.epoch,
                "amqpd_holds_lease": self.holds_lease(),
                "amqpd_accepting_publishes": self.accepting_publishes(),
                "amqpd_in_sync": self.in_sync(),
                "amqpd_leader": leader.node if leader is not None else None}

    def peer_nodes(self) -> list[dict[str, Any]]:
        """The other nodes, as /api/nodes entries, from their last etcd records; one whose
        presence lease ran out (three lease periods) is not running."""
        out = []
        for rec in self.peers:
            age = time.time() - float(rec.get("updated", 0))
            out.append({"name": rec.get("node"), "type": "disc",
                        "running": bool(rec.get("alive")) and rec.get("role") != "stopped",
                        "amqpd_role": rec.get("role"), "amqpd_epoch": rec.get("epoch"),
                        "amqpd_in_sync": rec.get("in_sync"),
                        "amqpd_leader": rec.get("leader"),
                        "replication": rec.get("replication") or {},
                        "amqpd_record_age_seconds": round(age, 3),
                        "amqpd_addresses": {k: rec.get(k) for k in ("amqp", "http",
                                                                    "replication")}})
        return out


__all__ = ["Warren"]
