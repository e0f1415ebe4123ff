"""ClusterView: what this node knows about the cluster's members, and what it decides.

The view is pure state, fed by two sources and read by everything else (the broker, the
HTTP API, the inter-node links of amqpd/cluster/link.py):

* etcd (``membership.py``): ``members/<node>`` (joined; no lease) and ``nodes/<node>``
  (the node's record under its lease: present = its process runs and renews);
* UDP heartbeats (``heartbeat.py``): a datagram from each running node every
  ``heartbeat_interval`` seconds.

``is_running(node)`` needs both: the record present at the last etcd read *and* a
heartbeat within ``heartbeat_timeout``. A node killed with SIGKILL stops sending at once,
so the others see it stop running within about a second; the lease (several seconds) is
the backstop for a node whose UDP packets still arrive but that lost etcd. A record seen
for the first time counts as a heartbeat (a grace period of one timeout), so a node that
just started is not reported down before its first datagram can have arrived. Silence
is measured on ``clock`` (a running node's ``LoopClock``, loop_clock.py), which does not
count this node's own event-loop stalls: heartbeats that arrived during a stall were not
late.

The pause decision (pause_minority) is made by ``node.py`` from :meth:`sees_majority`;
the view only holds its outcome (:meth:`serving`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.cluster.cluster_queues import ClusterQueues

log = logging.getLogger("amqpd.cluster")

Subscriber = Callable[[str, bool], None]


@dataclass(frozen=True)
class NodeInfo:
    """A member as the rest of the broker sees it."""

    name: str
    link: tuple[str, int] | None  # the inter-node link listener (None: unknown)
    amqp_port: int
    http_port: int
    running: bool
    stream: tuple[str, int] | None = None  # the stream listener metadata names


def parse_addr(text: Any) -> tuple[str, int] | None:
    """"host:port" (``[v6]:port`` too) from a record; None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


class ClusterView:
    def __init__(self, node_name: str, heartbeat_timeout: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node_name = node_name
        self.heartbeat_timeout = heartbeat_timeout
        self.clock = clock
        self.members: set[str] = set()  # joined nodes (etcd members/), self included
        self.records: dict[str, dict[str, Any]] = {}  # nodes/<name> records (leases)
        self.heard: dict[str, float] = {}  # node -> clock() of its last heartbeat
        self.catalogue: dict[tuple[str, str], str] = {}  # (vhost, queue) -> leader node
        self.paused = True  # serving nobody until the first sync with etcd
        self.pause_reason = "the node has not yet synchronised with the cluster"
        self._subscribers: list[Subscriber] = []
        self._last_running: dict[str, bool] = {}
        # this node's queues across the cluster (its inter-node links), held here for
        # the definitions applier and the non-durable queues' mirror: set by
        # cluster_queues.start; None in a view without links (catalogue only)
        self.queues: ClusterQueues | None = None

    # ------------------------------------------------------------------ feeding
    def update(self, members: Iterable[str], records: dict[str, dict[str, Any]]) -> None:
        """What the last etcd read said."""
        now = self.clock()
        for name, rec in records.items():
            old = self.records.get(name)
            if old is None or old.get("started") != rec.get("started"):
                # a record that (re)appeared: grace until its first heartbeat is due
                self.heard[name] = max(self.heard.get(name, now), now)
        self.members = set(members)
        self.records = dict(records)
        self.check_changes()

    def heartbeat(self, node: str) -> None:
        self.heard[node] = self.clock()

    # ------------------------------------------------------------------ reading
    def is_running(self, node: str) -> bool:
        """The node's lease is present and its heartbeats arrive (this node: always)."""
        if node == self.node_name:
            return True
        if node not in self.records:
            return False
        last = self.heard.get(node)
        return last is not None and self.clock() - last <= self.heartbeat_timeout

    def nodes(self) -> dict[str, NodeInfo]:
        """Every member, running or not (and a running node that is not, or no longer,
        a member: it shows up until its lease goes)."""
        out: dict[str, NodeInfo] = {}
        for name in sorted(self.members | set(self.records)):
            rec = self.records.get(name, {})
            out[name] = NodeInfo(name, parse_addr(rec.get("link")),
                                 int(rec.get("amqp_port") or 0),
                                 int(rec.get("http_port") or 0), self.is_running(name),
                                 parse_addr(rec.get("stream")))
        return out

    def running_nodes(self) -> list[str]:
        return sorted(n for n in self.members | set(self.records) if self.is_running(n))

    def partitioned_from(self) -> list[str]:
        """Members etcd says run (lease present) whose heartbeats do not reach us: the
        network between us is cut (RabbitMQ's "network partitions")."""
        return sorted(n for n in self.records
                      if n != self.node_name and n in self.members and not self.is_running(n))

    def sees_majority(self) -> bool:
        """More than half of the members are running as far as this node can tell (this
        node counts itself). RabbitMQ's pause_minority pauses at exactly half as well."""
        if not self.members:
            return False
        visible = sum(1 for m in self.members if self.is_running(m))
        return visible * 2 > len(self.members)

    def subscribe(self, callback: Subscriber) -> None:
        """``callback(node, running)`` whenever a node starts or stops running."""
        self._subscribers.append(callback)

    def serving(self) -> bool:
        """False while this node is paused: it serves no client."""
        return not self.paused

    def queue_leader(self, vhost: str, name: str) -> str | None:
        return self.catalogue.get((vhost, name))

    def stream_address_of(self, node: str) -> tuple[str, int] | None:
        info = self.nodes().get(node)
        return info.stream if info is not None else None

    # ------------------------------------------------------------------ changes
    def check_changes(self) -> None:
        """Tell the subscribers about every node whose running state flipped."""
        for name in self.members | set(self.records) | set(self._last_running):
            if name == self.node_name:
                continue
            running = self.is_running(name)
            if self._last_running.get(name, False) != running:
                self._last_running[name] = running
                log.info("cluster: node %s is %s", name, "running" if running else "down")
                for callback in list(self._subscribers):
                    try:
                        callback(name, running)
                    except Exception:
                        log.exception("cluster: a node-state subscriber failed")


__all__ = ["ClusterView", "NodeInfo", "parse_addr"]
