"""One worker of a multi-worker node: a whole broker that adopts handed-over connections.

``python -m amqpd.workers.worker --index I --control-fd FD --kv URL -- <amqpd argv>``,
started by the supervisor only. The node's command line, file and environment are read
exactly as ``amqpd`` reads them (:func:`amqpd.cli.overrides_from_args`), then made this
worker's (:func:`worker_settings`): its own data directory, a private loopback AMQP
and HTTP port, and membership of the node-private cluster whose coordination store is
the supervisor's (docs/workers.md). Then it runs :func:`amqpd.server.serve` unchanged;
the ready hook starts reading the control socket, where the supervisor hands over
accepted client connections. The worker stops (gracefully) when that socket closes: a
node whose supervisor is gone has no port any more.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from amqpd import cli
from amqpd.config import ConfigError, Settings, check_data_dir, load_settings, worker_count
from amqpd.workers import handoff

log = logging.getLogger("amqpd.workers.worker")

CLUSTER = "workers"  # the node-private cluster's name (never advertised to clients)
LINK_WAIT = 30.0
# seconds a silent worker still counts as running for the others (its restart by the
# supervisor takes 1-2 s; the longest backoff is 5 s)
VISIBLE_WAIT = 5.0  # seconds a reply waits at most for the other workers to apply it
RESTART_GRACE = 30.0  # seconds a starting worker waits for its links to the others


def worker_dir(data_dir: str, index: int) -> Path:
    return Path(data_dir) / "workers" / f"w{index}"


def worker_name(node_name: str, index: int) -> str:
    """The worker's member name in the private cluster (unique, no ``/``: a key part)."""
    return f"{node_name}-w{index}"


def node_settings(argv: list[str]) -> Settings:
    """The node's settings, exactly as ``amqpd argv`` reads them."""
    args = cli.build_parser().parse_args(argv)
    return load_settings(args.config, cli.overrides_from_args(args))


def worker_settings(argv: list[str], index: int, kv_url: str) -> Settings:
    """The node's settings as ``amqpd argv`` reads them, made worker ``index``'s."""
    args = cli.build_parser().parse_args(argv)
    node = node_settings(argv)
    share = worker_count(node)
    settings = load_settings(args.config, {
        **cli.overrides_from_args(args),
        "workers": 1, "bind": "127.0.0.1", "port": 0, "http_port": 0,
        # with TLS set up, a private amqps listener too (loopback, like the private
        # AMQP port): the node's amqps port is the supervisor's, whose accepted
        # sockets the worker wraps with the same certificate (Adopter)
        "tls_port": 0,
        # the private API is loopback HTTP even with http_tls: the supervisor's front
        # speaks TLS to clients, and a worker asking for client certificates
        # (tls_fail_if_no_peer_cert) would refuse the front
        "http_tls": False,
        "http_bind": "127.0.0.1", "data_dir": str(worker_dir(node.data_dir, index)),
        "node_name": worker_name(node.node_name, index),
        "cluster_name": CLUSTER, "cluster_etcd": kv_url,
        "cluster_etcd_prefix": "/amqpd/workers",
        "cluster_link_listen": "127.0.0.1:0", "cluster_heartbeat_listen": "127.0.0.1:0",
        # a worker that restarts is not a partition: the others keep serving
        "cluster_partition_handling": "ignore",
        # nor is it a node gone: while the supervisor restarts it, the others keep
        # counting it running, so a publish to its queues is nacked (the client
        # publishes again), not acked and dropped as a down node's unroutable one
        "cluster_heartbeat_timeout": RESTART_GRACE, "cluster_lease_ttl": RESTART_GRACE,
        # a declare-ok on one worker means every worker has the change, as in one
        # process (amqpd/cluster/visibility.py)
        "cluster_visible_wait": VISIBLE_WAIT,
        # a quorum queue has one member, the worker that owns it: members on the same
        # machine add no availability (a majority of two workers needs both) and make
        # every commit wait for the other worker (docs/workers.md, "Quorum queues")
        "cluster_quorum_max_members": 1,
        # the front merges the workers' lists of connections, channels and consumers
        # (amqpd/workers/http_front.py): each worker lists its own only
        "cluster_wide_lists": False,
        # one web UI login for the node: a session made through one worker opens the
        # others (the front sends a request to whichever worker it concerns)
        "http_sessions_file": node.http_sessions_file or str(
            Path(node.data_dir) / "workers" / "http-sessions.json"),
    })
    # what clients are told stays the node's (connection.start's cluster_name)
    settings.cluster_name = node.effective_cluster_name
    # the node's memory limits are the node's, not each worker's: every worker gets
    # its share (an alarm is then raised per worker, docs/workers.md)
    settings.vm_memory_high_watermark = node.vm_memory_high_watermark / share
    settings.memory_high_watermark_bytes = node.memory_high_watermark_bytes // share
    settings.message_memory_budget = node.message_memory_budget // share
    if index != 0:
        # static shovels run once per node, on worker 0: a copy per worker would run
        # each shovel N times (an exchange source's messages moved N times over;
        # docs/workers.md, "Plugins and shovels")
        settings.shovels = []
    return settings


class Adopter:
    """Reads the control socket: adopts handed-over connections into the broker."""

    def __init__(self, broker: Any, control: socket.socket) -> None:
        from amqpd.tls import server_context, tls_configured

        self.broker = broker
        self.control = control
        # the node's amqps port: the same context as a single broker's amqps listener
        # (certificate, client-certificate checks), built once
        self.tls = server_context(broker.settings) if tls_configured(broker.settings) \
            else None
        self.loop = asyncio.get_running_loop()
        self.pending: set[asyncio.Task[Any]] = set()

    def start(self, index: int) -> None:
        from amqpd.transport import AMQPProtocol

        self._amqp = lambda: AMQPProtocol(self.broker)
        self.control.setblocking(False)
        self.loop.add_reader(self.control.fileno(), self._readable)
        task = self.loop.create_task(self._ready(index))
        self.pending.add(task)
        task.add_done_callback(self._done)

    async def _ready(self, index: int) -> None:
        """Tell the supervisor this worker serves, once it reaches every other worker:
        before that, a client of this worker would find the others' queues "down"."""
        await linked(self.broker, LINK_WAIT)
        http = self.broker.http
        handoff.send_ready(self.control, {
            "index": index, "pid": os.getpid(), "amqp_port": self.broker.port,
            "node": self.broker.settings.node_name,
            "http_port": http.port if http is not None else None})

    def _readable(self) -> None:
        for kind, _payload, socks in handoff.receive(self.control):
            if not kind:
                log.warning("worker: the supervisor is gone; stopping")
                self.loop.remove_reader(self.control.fileno())
                os.kill(os.getpid(), signal.SIGTERM)
                return
            for sock in socks:
                self._adopt(kind, sock)

    def _adopt(self, kind: bytes, sock: socket.socket) -> None:
        sock.setblocking(False)
        tls = self.tls if kind == handoff.ACCEPTED_AMQPS else None
        if kind not in (handoff.ACCEPTED_AMQP, handoff.ACCEPTED_AMQPS) \
                or (kind == handoff.ACCEPTED_AMQPS and tls is None) or self.broker.stopping:
            sock.close()
            return
        # an amqps socket: the TLS handshake runs here (the protocol is made once it
        # is done, with the peer's certificate known, as on a single broker's listener)
        task = self.loop.create_task(
            self.loop.connect_accepted_socket(self._amqp, sock, ssl=tls))
        self.pending.add(task)
        task.add_done_callback(self._tls_done if tls is not None else self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker: %s failed: %r", task.get_coro(), task.exception())

    def _tls_done(self, task: asyncio.Task[Any]) -> None:
        """An amqps adoption ended: a handshake the client failed or dropped is the
        client's business, and a single broker's amqps listener logs nothing for it
        (asyncio reports it only in debug mode): a debug line, not an error."""
        self.pending.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, OSError):  # ssl.SSLError, a reset, the handshake's timeout
            log.debug("worker: TLS handshake not completed: %r", exc)
        elif exc is not None:
            log.error("worker: %s failed: %r", task.get_coro(), exc)


async def linked(broker: Any, timeout: float) -> bool:
    """Wait until every other member of the private cluster runs (heartbeats heard)
    and has its link to this worker up; False (with a log line) after ``timeout``."""
    view = broker.cluster  # the cluster's Cluster is its ClusterView
    queues = view.queues if view is not None else None
    if view is None or queues is None:
        return True
    deadline = time.monotonic() + timeout
    while True:
        missing = sorted(n for n in view.members - {view.node_name}
                         if not (view.is_running(n) and n in queues.links.links))
        if not missing:
            return True
        if time.monotonic() >= deadline:
            log.warning("worker: serving without a link to %s after %.0f s",
                        ", ".join(missing), timeout)
            return False
        await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="amqpd.workers.worker")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--control-fd", type=int, required=True)
    p.add_argument("--kv", required=True)
    p.add_argument("node_argv", nargs=argparse.REMAINDER)
    ours = p.parse_args(argv)
    node_argv = ours.node_argv[1:] if ours.node_argv[:1] == ["--"] else ours.node_argv
    control = socket.socket(fileno=ours.control_fd)
    try:
        settings = worker_settings(node_argv, ours.index, ours.kv)
        check_data_dir(settings.data_dir)
    except ConfigError as exc:
        print(f"amqpd worker {ours.index}: {exc}", file=sys.stderr)
        return 2
    from amqpd import logs

    logs.configure(settings.log_level, settings.log_format)
    try:
        import uvloop  # type: ignore[import-not-found]

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    from amqpd.server import Broker, serve

    node_http_tls = node_settings(node_argv).http_tls

    def ready(broker: Broker) -> None:
        if node_http_tls and broker.http is not None:
            # what this API says of its listener is the node's: the front serves https
            # (the overview's protocol, the protocol-listener check, a UI cookie's
            # Secure flag), though its own loopback port is plain HTTP
            broker.http.describe_as_tls()
        Adopter(broker, control).start(ours.index)

    try:
        asyncio.run(serve(settings, ready))
    except (OSError, ValueError) as exc:
        log.error("worker %d cannot start: %s", ours.index, exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
