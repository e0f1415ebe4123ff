"""Node-to-node UDP heartbeats (asyncio-dgram): how a dead node is noticed in about a
second rather than a lease period.

Every ``interval`` seconds each node sends one datagram to every other node whose etcd
record names a heartbeat address; a receiver that has heard nothing from a node for
``timeout`` seconds counts it as not running (``view.py``). UDP because a heartbeat that
is late is worthless: nothing is retransmitted, nothing queues behind a slow peer.

Datagram layout (all of it covered by the tag)::

    JSON {"c": cluster name, "n": sender node, "s": sequence}  b"\\n"  HMAC-SHA256(cookie)

The tag is the datagram's last ``TAG_SIZE`` bytes, found by its fixed size: a binary tag
may itself hold a newline, so splitting at the last newline would cut inside it (about one
heartbeat in eight was dropped that way).

Datagrams with a bad tag, from another cluster or from this node are dropped (counted,
logged once in a while): a stray packet must not keep a dead node "running".
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable

import asyncio_dgram

from amqpd.cluster.periodic import cancel_all
from amqpd.cluster.view import ClusterView
from amqpd.config import host_port

log = logging.getLogger("amqpd.cluster.heartbeat")

TAG_SIZE = 32  # HMAC-SHA256 digest
SEPARATOR = ord("\n")


def encode(cookie: bytes, cluster: str, node: str, seq: int) -> bytes:
    payload = json.dumps({"c": cluster, "n": node, "s": seq}, separators=(",", ":")).encode()
    return payload + b"\n" + hmac.new(cookie, payload, hashlib.sha256).digest()


def decode(cookie: bytes, cluster: str, data: bytes) -> str | None:
    """The sender's node name, or None for a datagram that is not a valid heartbeat."""
    if len(data) < TAG_SIZE + 1 or data[-TAG_SIZE - 1] != SEPARATOR:
        return None
    payload, tag = data[:-TAG_SIZE - 1], data[-TAG_SIZE:]
    if not hmac.compare_digest(hmac.new(cookie, payload, hashlib.sha256).digest(), tag):
        return None
    try:
        msg = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(msg, dict) or msg.get("c") != cluster or not isinstance(msg.get("n"), str):
        return None
    return str(msg["n"])


class Heartbeats:
    def __init__(self, view: ClusterView, cluster: str, cookie: bytes,
                 listen: tuple[str, int], interval: float,
                 targets: Callable[[], dict[str, tuple[str, int]]]) -> None:
        self.view = view
        self.cluster = cluster
        self.cookie = cookie
        self.listen = listen
        self.interval = interval
        self.targets = targets  # node -> heartbeat address, of the other running nodes
        self.address: tuple[str, int] = listen
        self.sent = 0
        self.received = 0
        self.rejected = 0
        self._stream: asyncio_dgram.aio.DatagramServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._last_reject_log = 0.0

    async def start(self) -> None:
        self._stream = await asyncio_dgram.bind(self.listen)
        host, port = self._stream.sockname[:2]
        self.address = (host, port)
        self._tasks = [asyncio.create_task(self._send_loop(), name="cluster-heartbeat-send"),
                       asyncio.create_task(self._recv_loop(), name="cluster-heartbeat-recv")]
        log.info("cluster heartbeats on udp %s every %.2fs", host_port(host, port),
                 self.interval)

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    async def _send_loop(self) -> None:
        seq = 0
        while True:
            stream = self._stream
            if stream is not None:
                seq += 1
                packet = encode(self.cookie, self.cluster, self.view.node_name, seq)
                for _node, addr in self.targets().items():
                    try:
                        await stream.send(packet, addr)
                        self.sent += 1
                    except OSError as exc:  # unreachable right now: the next round retries
                        log.debug("heartbeat to %s failed: %s", addr, exc)
            await asyncio.sleep(self.interval)

    async def _recv_loop(self) -> None:
        assert self._stream is not None
        while True:
            try:
                data, _remote = await self._stream.recv()
            except asyncio_dgram.TransportClosed:
                return
            except OSError:
                continue  # an ICMP error of an earlier send surfaced here; keep reading
            node = decode(self.cookie, self.cluster, data)
            if node is None or node == self.view.node_name:
                self.rejected += 1
                now = time.monotonic()
                if now - self._last_reject_log > 60:
                    self._last_reject_log = now
                    log.warning("cluster: dropped a datagram on the heartbeat port from %s "
                                "(%s; %d so far)", _remote,
                                "this node's own name" if node else
                                "not a heartbeat of this cluster", self.rejected)
                continue
            self.received += 1
            self.view.heartbeat(node)


__all__ = ["Heartbeats", "decode", "encode"]
