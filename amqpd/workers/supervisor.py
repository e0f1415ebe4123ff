"""The ``amqpd`` process when ``workers`` > 1: owns the node's ports, runs the workers.

It serves no client itself (docs/workers.md, "Process model"). It binds the AMQP port,
the amqps port when TLS is set up (``tls_cert``/``tls_key``) and the HTTP port as a
single broker would, starts the node-local coordination store
(:mod:`amqpd.workers.localkv`) and N worker processes (:mod:`amqpd.workers.worker`),
and hands every accepted connection to a worker over that worker's control socket
(:mod:`amqpd.workers.handoff`): AMQP and amqps connections round robin over the
workers that are up, in accept order; an amqps socket is handed before its TLS
handshake, which the worker runs (the supervisor never sees a client's bytes). It
serves the node's HTTP port itself (:mod:`amqpd.workers.http_front`): the management
API of the whole node, answered by asking the workers' private APIs. A worker that
exits is started again after a backoff; its clients lost their connections with it,
the others' are untouched, and the port never closes. SIGTERM/SIGINT stop the
workers (gracefully, SIGTERM each) and then the supervisor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from amqpd.config import Settings, host_port, worker_count
from amqpd.tls import TLSConfigError, server_context, tls_configured
from amqpd.workers import handoff
from amqpd.workers.http_front import Backend, HttpFront
from amqpd.workers.localkv import LocalKV

log = logging.getLogger("amqpd.workers")

BACKOFF_MIN: Final = 0.2  # seconds before a dead worker is started again, doubling
BACKOFF_MAX: Final = 5.0
STABLE_AFTER: Final = 60.0  # a worker that lived this long restarts with BACKOFF_MIN
POLL: Final = 0.05  # seconds between checks for exited workers
STOP_TIMEOUT: Final = 20.0  # seconds a worker gets to stop before SIGKILL
_FRONT_GRACE: Final = 2.0  # seconds the HTTP front gives requests in flight at stop
ACCEPT_BATCH: Final = 64  # connections accepted per readable event
# a worker that exits this many times in a row without ever serving stops the node:
# it cannot start (a data directory it cannot use, a broken install), and a node that
# never listens must say so and exit, as a single broker that cannot start does
START_FAILURES: Final = 3


class WorkerCannotStart(Exception):
    """A worker exited :data:`START_FAILURES` times before it ever served."""


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    control: socket.socket | None = None
    ready: dict[str, Any] | None = None
    started: float = 0.0
    backoff: float = BACKOFF_MIN
    restart_at: float = 0.0
    restarts: int = 0
    served: bool = False  # it reported ready at least once (in any of its lives)
    failed_starts: int = 0  # exits in a row before serving
    handed: int = 0  # connections handed to it (all its lives)
    info: dict[str, Any] = field(default_factory=dict)


def bind_listeners(bind: str, port: int) -> list[socket.socket]:
    """Listening sockets as :meth:`amqpd.server.Broker._listen` opens them: ``""`` is
    every interface, IPv4 and IPv6 on one port (IPv4 alone where IPv6 is missing)."""
    hosts = ["0.0.0.0", "::"] if bind == "" else [bind]
    socks: list[socket.socket] = []
    for host in hosts:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
            sock.listen(1024)
        except OSError as exc:
            if host == "::" and socks:
                log.info("no IPv6 listener on port %d (%s); IPv4 only", port, exc)
                continue
            for s in socks:
                s.close()
            raise OSError(exc.errno, f"cannot listen on {host_port(host, port)}: "
                                     f"{exc.strerror or exc}") from exc
        sock.setblocking(False)
        socks.append(sock)
        port = sock.getsockname()[1]  # an ephemeral port: IPv6 takes the same one
    return socks


class Supervisor:
    def __init__(self, settings: Settings, argv: list[str], ready_file: str | None) -> None:
        self.settings = settings
        self.argv = argv
        self.ready_file = ready_file
        self.workers = [Worker(i) for i in range(worker_count(settings))]
        self.amqp: list[socket.socket] = []
        self.amqps: list[socket.socket] = []  # with tls_cert and tls_key: the TLS port
        self.http: list[socket.socket] = []
        self.kv = LocalKV(Path(settings.data_dir) / "workers" / "kv.log")
        self.cookie = secrets.token_urlsafe(32)  # the private cluster's, for this run
        self.stopping = False
        self._next = 0
        self._announced = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.front = HttpFront(settings.node_name, self._backends, self._node_ports,
                               self._workers_info, self._node_listeners)
        self._front_runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ workers
    def _spawn(self, w: Worker) -> None:
        ours, theirs = handoff.pair()
        env = dict(os.environ)
        env["AMQPD_CLUSTER_COOKIE"] = self.cookie
        cmd = [sys.executable, "-m", "amqpd.workers.worker", "--index", str(w.index),
               "--control-fd", str(theirs.fileno()), "--kv", self.kv.url, "--", *self.argv]
        w.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        w.control = ours
        w.ready = None
        w.started = time.monotonic()
        assert self._loop is not None
        self._loop.add_reader(ours.fileno(), self._control_readable, w)
        log.info("worker %d started (pid %d)", w.index, w.proc.pid)

    def _control_readable(self, w: Worker) -> None:
        if w.control is None:
            return
        for kind, payload, socks in handoff.receive(w.control):
            for s in socks:
                s.close()  # a worker hands nothing back
            if kind == handoff.READY:
                w.ready = json.loads(payload)
                w.served = True
                w.failed_starts = 0
                log.info("worker %d serves (pid %s, private amqp port %s)", w.index,
                         w.ready.get("pid"), w.ready.get("amqp_port"))
                if self._announced:
                    self._write_ready()  # a restarted worker's new private ports
            elif not kind:
                self._drop_control(w)
                return

    def _drop_control(self, w: Worker) -> None:
        if w.control is not None and self._loop is not None:
            self._loop.remove_reader(w.control.fileno())
            w.control.close()
        w.control = None
        w.ready = None

    def _reap(self) -> None:
        """Notice exited workers; start them again once their backoff has passed."""
        now = time.monotonic()
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is not None:
                code = w.proc.returncode
                lived = now - w.started
                self._drop_control(w)
                w.proc = None
                if self.stopping:
                    continue
                if not w.served:
                    w.failed_starts += 1
                    if w.failed_starts >= START_FAILURES:
                        raise WorkerCannotStart(
                            f"worker {w.index} exited {w.failed_starts} times without "
                            f"serving (last: code {code}); see its log lines above")
                w.backoff = BACKOFF_MIN if lived >= STABLE_AFTER else min(
                    w.backoff * 2, BACKOFF_MAX) if w.restarts else BACKOFF_MIN
                w.restart_at = now + w.backoff
                w.restarts += 1
                log.error("worker %d exited (%s) after %.1f s; its clients were "
                          "disconnected; restarting in %.1f s", w.index,
                          f"signal {-code}" if code < 0 else f"code {code}", lived, w.backoff)
            if w.proc is None and not self.stopping and now >= w.restart_at:
                self._spawn(w)

    # ------------------------------------------------------------------ connections
    def _accept(self, listener: socket.socket, kind: bytes) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the next readable event retries
                log.warning("accept failed: %s", exc)
                return
            with conn:
                self._hand(conn, kind)

    def _hand(self, conn: socket.socket, kind: bytes) -> None:
        live = [w for w in self.workers if w.ready is not None and w.control is not None]
        if not live:
            log.warning("no worker is up: connection closed")
            return
        start = self._next % len(live)
        order = live[start:] + live[:start]
        self._next += 1
        for w in order:
            assert w.control is not None
            try:
                handoff.hand_over(w.control, kind, conn)
            except OSError as exc:
                log.warning("worker %d did not take a connection: %s", w.index, exc)
                continue
            w.handed += 1
            return
        log.warning("no worker took the connection: closed")

    # ------------------------------------------------------------------ the HTTP port
    def _backends(self) -> list[Backend]:
        """The workers that serve, with a private API, in index order."""
        return [Backend(w.index, int(w.ready["http_port"]), str(w.ready.get("node", "")))
                for w in self.workers
                if w.ready is not None and w.control is not None and w.ready.get("http_port")]

    def _node_ports(self) -> list[int]:
        """The node's listening ports (a health check's), as a single broker counts
        them: its AMQP and amqps listeners and this HTTP listener."""
        ports = [s.getsockname()[1] for s in self.amqp + self.amqps + self.http]
        return list(dict.fromkeys(ports))

    def _listeners(self) -> list[tuple[str, str, int]]:
        """The node's AMQP listeners as a single broker lists them (``amqp`` first,
        then ``amqps``), each (protocol, address, port)."""
        return ([("amqp", *s.getsockname()[:2]) for s in self.amqp]
                + [("amqps", *s.getsockname()[:2]) for s in self.amqps])

    def _node_listeners(self) -> list[tuple[str, str, int]]:
        """Every listener of the node, the HTTP one included (``https`` with
        ``http_tls``): what the overview's ``listeners`` show."""
        http = "https" if self.settings.http_tls else "http"
        return self._listeners() + [(http, *s.getsockname()[:2]) for s in self.http]

    def _workers_info(self) -> list[dict[str, Any]]:
        """``GET /api/workers``: each worker, serving or not, with its private ports."""
        now = time.monotonic()
        return [{"index": w.index, "node": (w.ready or {}).get("node"),
                 "pid": (w.ready or {}).get("pid"),
                 "amqp_port": (w.ready or {}).get("amqp_port"),
                 "http_port": (w.ready or {}).get("http_port"),
                 "serving": w.ready is not None and w.control is not None,
                 "uptime": round(now - w.started, 3) if w.proc is not None else None,
                 "restarts": w.restarts, "connections_handed": w.handed}
                for w in self.workers]

    async def _serve_http(self) -> None:
        # a short grace for requests in flight at stop (aiohttp waits 60 s by default):
        # the workers get their SIGTERM only after the front is down, and a supervisor
        # still waiting when its own stop times out (a service manager's, or the
        # tests' 15 s) is killed and leaves them running (CI: both workers alive 10 s
        # after the node's stop, with the shovel plugin on)
        runner = web.AppRunner(self.front.app, access_log=None, handle_signals=False,
                               shutdown_timeout=_FRONT_GRACE)
        await runner.setup()
        self._front_runner = runner
        # https with http_tls: the front speaks TLS to clients (the workers' private
        # APIs behind it are loopback HTTP, docs/workers.md "TLS")
        ssl_ctx = server_context(self.settings) if self.settings.http_tls else None
        for sock in self.http:
            await web.SockSite(runner, sock, ssl_context=ssl_ctx).start()

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        s = self.settings
        self._loop = asyncio.get_running_loop()
        if tls_configured(s) or s.http_tls:
            # the certificate, key and CA load here first, so a node that cannot use
            # them stops with the single broker's error, not after its workers failed
            server_context(s)
        self.amqp = bind_listeners(s.bind, s.port)
        if tls_configured(s):
            self.amqps = bind_listeners(s.bind, s.tls_port)
        if s.management:
            self.http = bind_listeners(s.http_bind or s.bind, s.http_port)
        await self.kv.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, stop.set)
        for w in self.workers:
            self._spawn(w)
        try:
            while not stop.is_set():
                self._reap()
                if not self._announced and all(w.ready is not None for w in self.workers):
                    # accept only now: a client must find the whole node (the kernel's
                    # backlog holds connections meanwhile)
                    self._announced = True
                    await self._serve_http()  # first: a client that reaches AMQP finds HTTP
                    for sock in self.amqp:
                        self._loop.add_reader(sock.fileno(), self._accept, sock,
                                              handoff.ACCEPTED_AMQP)
                    for sock in self.amqps:
                        self._loop.add_reader(sock.fileno(), self._accept, sock,
                                              handoff.ACCEPTED_AMQPS)
                    self._announce()
                try:
                    await asyncio.wait_for(stop.wait(), POLL)
                except TimeoutError:
                    pass
        finally:
            await self._stop()

    def _announce(self) -> None:
        log.info("amqpd node listening on %s with %d workers", ", ".join(
            f"{proto} {host_port(h, p)}" for proto, h, p in self._listeners()),
            len(self.workers))
        self._write_ready()

    def _write_ready(self) -> None:
        """The ready file (``--ready-file``): the node's ports as a single broker
        writes them, plus each worker's pid and private ports."""
        amqp_port = self.amqp[0].getsockname()[1]
        http_port = self.http[0].getsockname()[1] if self.http else None
        listeners = [list(entry) for entry in self._listeners()]
        tls_port = self.amqps[0].getsockname()[1] if self.amqps else None
        if self.ready_file:
            tmp = self.ready_file + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({"amqp_port": amqp_port, "pid": os.getpid(),
                           "listeners": listeners, "http_port": http_port,
                           "stream_port": None, "stream_tls_port": None, "tls_port": tls_port,
                           "replication": None,
                           "workers": [dict(w.ready or {}, index=w.index)
                                       for w in self.workers]}, fh)
            os.replace(tmp, self.ready_file)

    async def _stop(self) -> None:
        self.stopping = True
        assert self._loop is not None
        for sock in self.amqp + self.amqps:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        if self._front_runner is not None:
            try:
                await self._front_runner.cleanup()
            except Exception as exc:  # the workers must stop regardless
                log.warning("the HTTP front did not stop cleanly: %r", exc)
        for sock in self.http:
            sock.close()
        running = [w for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for w in running:
            assert w.proc is not None
            w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for w in running:
            assert w.proc is not None
            while w.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(POLL)
            if w.proc.poll() is None:
                log.error("worker %d did not stop in time: killed", w.index)
                w.proc.kill()
                w.proc.wait()
        for w in self.workers:
            self._drop_control(w)
        await self.kv.stop()
        log.info("node stopped")


def run(settings: Settings, argv: list[str], ready_file: str | None) -> int:
    """``amqpd`` with ``workers`` > 1: run the supervisor until SIGTERM/SIGINT."""
    try:
        asyncio.run(Supervisor(settings, argv, ready_file).run())
    except (OSError, WorkerCannotStart, TLSConfigError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0
