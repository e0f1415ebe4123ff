"""The warren beside a broker: runs the etcd election (``role = "auto"``) and answers
what the health checks, ``/api/nodes``, ``amqpctl cluster_status`` and the metrics ask:
which role this node has, whether it holds the lease and takes publishes, whether it is
an in-sync standby, and what the other nodes last said.

The broker's role changes go through the hooks of the replication layer
(amqpd/replication, ``Broker.start_as_active`` and friends); this module only decides
*when*, from what etcd says, and adapts the replication layer's state to the election's
:class:`~amqpd.coord.election.NodeHooks`.

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

from amqpd.coord.election import (
    ACTIVE,
    CANDIDATE,
    ROLE_CODES,
    STANDBY,
    Election,
    ElectionSettings,
    LeaderInfo,
)
from amqpd.coord.etcd import EtcdClient, EtcdError

if TYPE_CHECKING:
    from amqpd.config import ReplicationConfig
    from amqpd.server import Broker

log = logging.getLogger("amqpd.coord.warren")


async def _maybe_await(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


def _addr(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Warren:
    """One node's membership of the pair; ``broker.warren`` while ``[replication]`` is set."""

    def __init__(self, broker: Broker, config: ReplicationConfig) -> None:
        self.broker = broker
        self.config = config
        self.name = config.node_name or broker.settings.node_name
        self.election: Election | None = None
        self.fenced = False
        self.fence_reason = ""
        self.started_role = ""  # "" until the broker got its first role
        self.peers: list[dict[str, Any]] = []  # other nodes' last records (from etcd)
        self.peers_at = 0.0
        self._peer_task: asyncio.Task[None] | None = None
        self._fencing: asyncio.Future[Any] | None = None

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
        if self.election is not None:
            await self.election.stop()
            await self.election.etcd.close()

    def addresses(self) -> dict[str, str]:
        b = self.broker
        s = b.settings
        amqp = next((_addr(h, p) for proto, h, p in b.listeners if proto == "amqp"), "")
        if not amqp and s.port:
            amqp = _addr(s.bind, s.port)
        http = ""
        if b.http is not None and b.http.port:
            http = _addr(s.http_bind or s.bind, b.http.port)
        return {"amqp": amqp, "http": http, "replication": self.config.listen}

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
        role = str(getattr(self.broker, "role", "") or self.config.role)
        return "fenced" if self.fenced else role

    @property
    def epoch(self) -> int:
        if self.election is not None:
            return self.election.epoch
        return int(getattr(self.broker, "epoch", 0) or 0)

    def holds_lease(self) -> bool:
        """Leads by etcd's word (static active: by configuration)."""
        if self.election is not None:
            return self.election.holds_lease()
        return self.role == ACTIVE

    def accepting_publishes(self) -> bool:
        """This node is the one clients must reach: it leads and takes publishes."""
        b = self.broker
        return (self.holds_lease() and not self.fenced and not b.stopping
                and not getattr(b, "fenced", False)
                and any(proto in ("amqp", "amqps") for proto, _, _ in b.listeners))

    def in_sync(self) -> bool:
        """A standby within ``max_lag`` of its active (what /health/standby reports)."""
        if self.role != STANDBY:
            return False
        follower = self.follower()
        if follower is None or not getattr(follower, "connected", False):
            return False
        lag = float(getattr(follower, "lag", 0.0) or 0.0)
        return lag <= self.config.max_lag

    def leader(self) -> LeaderInfo | None:
        return self.election.leader if self.election is not None else None

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
        return getattr(self.broker, "replication_source", None)

    def follower(self) -> Any:
        return getattr(self.broker, "replication_follower", None)

    def replication_status(self) -> dict[str, Any]:
        """Lag in records, bytes and seconds, as the replication layer reports it."""
        out: dict[str, Any] = {}
        follower = self.follower()
        if follower is not None and self.role != ACTIVE:
            out.update(connected=bool(getattr(follower, "connected", False)),
                       last_seq=int(getattr(follower, "last_seq", 0) or 0),
                       lag_seconds=float(getattr(follower, "lag", 0.0) or 0.0),
                       lag_records=int(getattr(follower, "lag_records", 0) or 0),
                       lag_bytes=int(getattr(follower, "lag_bytes", 0) or 0),
                       in_sync=self.in_sync())
        source = self.source()
        if source is not None and self.role == ACTIVE:
            with contextlib.suppress(Exception):
                out["standbys"] = [self._standby_dict(s) for s in source.standbys()]
                out["insync_count"] = int(source.insync_count())
        return out

    @staticmethod
    def _standby_dict(s: Any) -> dict[str, Any]:
        if isinstance(s, dict):
            return dict(s)
        return {k: getattr(s, k) for k in ("name", "acked_seq", "lag_records", "lag_bytes",
                                           "lag_seconds", "lag", "in_sync", "connected")
                if hasattr(s, k)}

    # ------------------------------------------------------------------ NodeHooks
    async def become_active(self, epoch: int) -> None:
        b: Any = self.broker
        self.fenced = False
        if not self.started_role:
            await _maybe_await(b.start_as_active(epoch))
        else:
            await _maybe_await(b.promote(epoch))
        self.started_role = ACTIVE
        log.info("warren: %s is the active node at epoch %d", self.name, epoch)

    async def become_standby(self, leader: LeaderInfo) -> None:
        b: Any = self.broker
        if not leader.replication:
            raise RuntimeError(f"the active {leader.node} publishes no replication address")
        if not self.started_role:
            await _maybe_await(b.start_as_standby(leader.replication, leader.epoch))
        else:
            await _maybe_await(b.demote_and_follow(leader.replication, leader.epoch))
        self.started_role = STANDBY
        self.fenced = False

    def fence(self, reason: str) -> None:
        self.fenced = True
        self.fence_reason = reason
        fence = getattr(self.broker, "fence", None)
        if fence is None:
            log.error("warren: the broker has no fence(); cannot stop publishes")
            return
        result = fence()
        if inspect.isawaitable(result):  # the closing part may be async; the stop is not
            self._fencing = asyncio.ensure_future(result)

    def log_position(self) -> tuple[int, int]:
        follower = self.follower()
        if follower is not None and self.started_role == STANDBY:
            return (int(getattr(follower, "epoch", 0) or 0),
                    int(getattr(follower, "last_seq", 0) or 0))
        store = self.broker.store
        seq = 0
        for name in ("durable_seq", "last_seq"):
            value = getattr(store, name, None) if store is not None else None
            if value is not None:
                seq = int(value() if callable(value) else value)
                break
        return self.epoch, seq

    def insync_standbys(self) -> dict[str, int]:
        source = self.source()
        if source is None:
            return {}
        out: dict[str, int] = {}
        for s in source.standbys():
            d = self._standby_dict(s)
            if d.get("in_sync"):
                out[str(d.get("name"))] = int(d.get("acked_seq", 0) or 0)
        return out

    def status(self) -> dict[str, Any]:
        return {"replication": self.replication_status(), "in_sync": self.in_sync()}

    # ------------------------------------------------------------------ views
    def role_code(self) -> int:
        return ROLE_CODES.get(self.role, ROLE_CODES[CANDIDATE])

    def node_fields(self) -> dict[str, Any]:
        """amqpd's warren fields of this node's /api/nodes entry."""
        leader = self.leader()
        return {"amqpd_role": self.role, "amqpd_epoch": self.epoch,
                "amqpd_holds_lease": self.holds_lease(),
                "amqpd_accepting_publishes": self.accepting_publishes(),
                "amqpd_in_sync": self.in_sync(),
                "amqpd_leader": leader.node if leader is not None else None,
                "amqpd_replication": self.replication_status()}

    def peer_nodes(self) -> list[dict[str, Any]]:
        """The other nodes, as /api/nodes entries, from their last etcd records. A record
        older than three lease periods counts as not running."""
        stale = max(self.config.lease_ttl * 3, 3.0)
        out = []
        for rec in self.peers:
            age = time.time() - float(rec.get("updated", 0))
            out.append({"name": rec.get("node"), "type": "disc",
                        "running": age < stale and rec.get("role") != "stopped",
                        "amqpd_role": rec.get("role"), "amqpd_epoch": rec.get("epoch"),
                        "amqpd_in_sync": rec.get("in_sync"),
                        "amqpd_leader": rec.get("leader"),
                        "amqpd_replication": rec.get("replication") or {},
                        "amqpd_record_age_seconds": round(age, 3),
                        "amqpd_addresses": {k: rec.get(k) for k in ("amqp", "http",
                                                                    "replication")}})
        return out


__all__ = ["Warren"]
