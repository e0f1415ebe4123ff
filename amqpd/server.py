"""The Broker: the process lifecycle, the listeners, and what the broker package hangs on.

One Broker per process. It owns the asyncio listeners, the node-wide store, the auth
store, the vhosts, the publish pipeline (``publisher``, :mod:`amqpd.broker.publish`) and
the public broker API (``api``, :mod:`amqpd.broker.api`). It runs what is tied to the
event loop and the process: the dispatch scheduler (queues that became deliverable this
tick are dispatched once, at its end), the once-a-second tick (alarms, memory budget,
idle commits, heartbeats), durable definitions (records in the same log, through
``broker/journal.py``: the one trigger is :meth:`Broker.definitions_changed`), boot and
recovery, and graceful shutdown.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import platform
import secrets
import signal
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import amqpd
from amqpd import hotpath
from amqpd.alarms import Alarms
from amqpd.broker import extensions, resource_limits
from amqpd.broker.api import BrokerAPI, ClusterStatus
from amqpd.broker.auth import AuthStore
from amqpd.broker.deadletter import dead_letter
from amqpd.broker.exchange import Binding, Exchange
from amqpd.broker.exchanges.dedup import recover as recover_dedup
from amqpd.broker.exchanges.delayed import recover as recover_delayed
from amqpd.broker.journal import DefinitionJournal
from amqpd.broker.message import LoggedMessage, Message
from amqpd.broker.operator_policy import OperatorPolicyStore
from amqpd.broker.parameters import ParameterStore
from amqpd.broker.policy import PolicyStore
from amqpd.broker.publish import Publisher
from amqpd.broker.queue import QueueEntry
from amqpd.broker.queue_type import QueueType
from amqpd.broker.ttl import TimerService
from amqpd.broker.vhost import VHost
from amqpd.config import Settings, host_port
from amqpd.plugins import load_plugins
from amqpd.protocol import codec
from amqpd.protocol.connection import Limits
from amqpd.store.memory import MemoryStore
from amqpd.transport import AMQPProtocol
from amqpd.watchdog import Watchdog

if TYPE_CHECKING:
    from amqpd.coord.warren import Warren
    from amqpd.http.listener import HttpServer
    from amqpd.session import Session
    from amqpd.store.api import MessageStore

log = logging.getLogger("amqpd.server")

# messages put back into their queues at start-up between two returns to the event loop
# (about 0.1 s of work on a quiet machine)
RESTORE_SLICE = 20_000

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
    # amqpd's own: a retried publish goes only into the queues that did not take it
    # (amqpd.broker.retry_routes; a client announces it back to use it)
    "publish_retry_of": True,
}


class Broker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # what this node answers other nodes' requests with (BrokerAPI.serve_node_requests)
        self.node_request_handlers: dict[str, Any] = {}
        self.auth = AuthStore()
        self.auth.loopback_users = set(settings.loopback_users)
        self.vhosts: dict[str, VHost] = {}
        self.sessions: set[Session] = set()
        self._server_properties: dict[str, Any] | None = None
        self.transports: set[AMQPProtocol] = set()
        # "no persistence" is the in-memory store, opened at once so that a Broker that
        # is never started (unit tests) has one too; start() swaps in the shared log
        # when persistence is on
        self.store: MessageStore = MemoryStore()
        self.store.open()
        self._dirty: dict[int, QueueType] = {}
        self._last_dirty: QueueType | None = None  # the queue last put in _dirty
        self._dispatch_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self.stream_listener: Any = None  # amqpd.streamproto's listener when enabled
        self._ticker: asyncio.Task[None] | None = None
        self.definitions = DefinitionJournal(self)  # durable topology -> log records
        # event-loop stalls and requests waiting too long, in the log (issue 28)
        self.watchdog = Watchdog(wait_limit=settings.cluster.definition_timeout)
        self.watchdog.add_source("definitions", lambda now: self.definitions.waits(now))
        self.started_at = time.time()
        self.listeners: list[tuple[str, str, int]] = []  # (protocol, host, port)
        self.stopping = False
        self._plugins_stopped = False
        self.alarms = Alarms(self)
        self.publisher = Publisher(self)
        self.policies = PolicyStore(self)
        self.operator_policies = OperatorPolicyStore(self)
        self.timers = TimerService()  # TTL, x-expires and delayed-message deadlines
        self.parameters = ParameterStore()  # runtime parameters (shovel, federation...)
        resource_limits.register(self)  # the vhost-limits component
        self.http: HttpServer | None = None
        self.api = BrokerAPI(self)  # what http/, plugins and (next) the cluster use
        # durable state saves itself: users, permissions and parameters report changes
        self.auth.on_change.append(self.definitions_changed)
        self.parameters.on_change.append(self.definitions_changed)
        # the warren (amqpd/replication/roles.py): None on a single node
        self.roles: Any = None
        # its etcd election and health (amqpd/coord/warren.py): None on a single node
        self.warren: Warren | None = None
        # a cluster's queue leader locator (amqpd.cluster.cluster_queues.ClusterQueues
        # .place): given a durable queue being declared, the queue led by another node,
        # or None to create it here; None on a single node
        self.queue_placer: Callable[[VHost, str, type[QueueType], bool, dict[str, Any]],
                                    QueueType | None] | None = None
        # the cluster (amqpd/cluster/, issue 15): None on a single node
        self.cluster: ClusterStatus | None = None
        # set while a warren standby takes over: every recovered message counts as
        # delivered once (redelivered=true), since the old active may have delivered it
        # and its delivery marks need not have reached this node before it died
        self.takeover_redelivers = False
        # called again when the listeners change (a standby promoted): the ready file
        self.on_ready: Callable[[Broker], None] | None = None
        self._setup_defaults()
        self.auth.set_internal_user(f"amqpd-internal-{secrets.token_hex(4)}",
                                    secrets.token_urlsafe(24))
        self.plugins = load_plugins(self.api, settings.plugins)

    # ------------------------------------------------------------------ setup
    def reset_state(self) -> None:
        """Forget every vhost, queue, user and policy held in memory (a demoted warren
        node, whose store is closed: it will recover them from its log when promoted,
        as a restarted process does)."""
        self.auth = AuthStore()
        self.auth.loopback_users = set(self.settings.loopback_users)
        self.vhosts = {}
        self._dirty = {}
        self._last_dirty = None
        self.definitions = DefinitionJournal(self)
        self.quorum_queues = 0
        self.publisher = Publisher(self)  # no commit waiters or delivery marks carried
        self.publisher.loop = self._loop
        self.policies = PolicyStore(self)
        self.operator_policies = OperatorPolicyStore(self)
        self.timers.stop()
        self.timers = TimerService()
        if self._loop is not None:
            self.timers.start(self._loop)
        self.parameters = ParameterStore()
        resource_limits.register(self)
        self.auth.on_change.append(self.definitions_changed)
        self.parameters.on_change.append(self.definitions_changed)
        self._setup_defaults()
        self.auth.set_internal_user(f"amqpd-internal-{secrets.token_hex(4)}",
                                    secrets.token_urlsafe(24))

    def _setup_defaults(self) -> None:
        s = self.settings
        self.add_vhost(s.default_vhost)
        for name in s.vhosts:
            self.add_vhost(name)
        if s.default_user and s.default_user not in {u.name for u in s.users}:
            self.auth.add_user(s.default_user, s.default_pass, ["administrator"])
            self.auth.set_permissions(s.default_user, s.default_vhost, ".*", ".*", ".*")
        for u in s.users:
            self.auth.add_user(u.name, u.password, u.tags, password_hash=u.password_hash,
                               algorithm=u.hashing_algorithm)
        for p in s.permissions:
            self.auth.set_permissions(p.user, p.vhost, p.configure, p.write, p.read)

    def add_vhost(self, name: str) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            vh = VHost(self, name)
            self.vhosts[name] = vh
        return vh

    def server_properties(self) -> dict[str, Any]:
        """The same dict for every connection until the cluster name changes (the
        connection machine encodes connection.start once per dict); read-only."""
        name = self.api.cluster_name()
        props = self._server_properties
        if props is None or props["cluster_name"] != name:
            props = self._server_properties = {
                "product": "amqpd",
                "version": amqpd.__version__,
                "platform": f"Python {platform.python_version()}",
                "copyright": "amqpd contributors",
                "information": "Licensed under the Apache 2.0 license",
                "cluster_name": name,
                "capabilities": dict(CAPABILITIES),
            }
        return props

    def limits(self) -> Limits:
        s = self.settings
        return Limits(channel_max=s.channel_max, frame_max=s.frame_max, heartbeat=s.heartbeat,
                      max_message_size=s.max_message_size,
                      handshake_timeout=s.handshake_timeout)

    # ------------------------------------------------------------------ sessions
    def session_opened(self, session: Session) -> None:
        self.sessions.add(session)

    def session_closed(self, session: Session) -> None:
        self.sessions.discard(session)

    def reschedule_session(self, session: Session) -> None:
        for ch in session.channels.values():
            for consumer in ch.consumers.values():
                self.schedule_dispatch(consumer.queue)

    # ------------------------------------------------------------------ dispatch
    def schedule_dispatch(self, queue: QueueType) -> None:
        if queue is self._last_dirty:  # every publish of a run marks the same queue
            return
        self._last_dirty = queue
        self._dirty[id(queue)] = queue
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            if self._loop is not None:
                self._loop.call_soon(self._run_dispatch)

    def _run_dispatch(self) -> None:
        self._dispatch_scheduled = False
        for _ in range(3):  # dispatch may dirty other queues (rare); bounded
            dirty, self._dirty = self._dirty, {}
            self._last_dirty = None
            for queue in dirty.values():
                # a held queue is dispatched again when its hold ends
                # (QueueType.deliveries_held)
                if not queue.deleted and not queue.deliveries_held:
                    queue.dispatch()
            if not self._dirty:
                break
        if self._dirty and not self._dispatch_scheduled and self._loop is not None:
            self._dispatch_scheduled = True
            self._loop.call_soon(self._run_dispatch)

    # ------------------------------------------------------------------ persistence
    def body_of(self, message: Message) -> bytes:
        """The message body, read back from the log when it was paged out."""
        return self.publisher.body_of(message)

    def store_drop_queue(self, queue: QueueType) -> None:
        self.publisher.store_drop_queue(queue)

    def _periodic_commit_done(self, error: BaseException | None) -> None:
        """Clear the store alarm once the store writes again and there is room for at
        least a segment (else it would clear and fail again on every retry)."""
        if error is not None:
            self.publisher.store_failed(error)
            return
        if "store" in self.alarms.active \
                and not getattr(self.store, "failed", None) \
                and self.alarms.free >= self.settings.segment_size:
            self.alarms.set_external("store", False, "message store writes again")

    def close_session(self, session: Session, code: int, reason: str) -> None:
        """Close one client connection (``connection.close`` with ``code``), now."""
        if session.conn.is_open:
            session.conn.close(code, reason)
        proto = session.protocol
        if proto is not None:
            proto.flush()

    # ------------------------------------------------------------------ extension hooks
    def apply_policies_to(self, vhost: VHost, obj: QueueType | Exchange) -> None:
        """Set ``obj.policy`` from the matching policy, then the options it drives."""
        extensions.apply_policies(self, vhost, obj)

    def dead_letter(self, queue: QueueType, entries: list[QueueEntry], reason: str) -> None:
        """Republish to the queue's dead-letter exchange, if any (amqpd.broker.deadletter)."""
        dead_letter(self, queue, entries, reason)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.publisher.loop = self._loop
        self.timers.start(self._loop)
        self.watchdog.start()
        s = self.settings
        Path(s.data_dir).mkdir(parents=True, exist_ok=True)
        if s.replication is not None:
            # the warren: the role decides whether the store opens and clients are served
            from amqpd.replication.roles import RoleHooks

            self.roles = RoleHooks(self)
            await self.roles.start()
            return
        await self.open_store()
        await self.serve_clients()
        await self.start_http()
        self.announce()
        await self.start_plugins()

    def announce(self) -> None:
        """Log the start-up line once every listener (AMQP, amqps, HTTP) is bound: a
        broker whose HTTP port is taken stops before it, so its log never says it was
        listening (the error names the listener that failed)."""
        log.info("amqpd %s listening on %s; hot path: %s", amqpd.__version__,
                 ", ".join(f"{proto} {host_port(h, p)}" for proto, h, p in self.listeners),
                 hotpath.MODE)

    async def serve_clients(self) -> None:
        """Open the AMQP (and amqps) listeners over the open store; boot definitions."""
        s = self.settings
        for host, port in await self._listen(s.port):
            self.listeners.append(("amqp", host, port))
        await self._start_operations()
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick_loop())

    async def start_http(self) -> None:
        """The management API (a warren standby serves it before any store is open)."""
        if self.settings.management and self.http is None:
            from amqpd.http.listener import HttpServer

            self.http = HttpServer(self.api)
            await self.http.start()

    async def start_plugins(self) -> None:
        for plugin in self.plugins.values():
            await plugin.start()

    async def close_clients(self, reason: str) -> None:
        """Stop listening for AMQP and close every client connection with 320
        CONNECTION_FORCED (shutdown; a fenced warren node)."""
        for server in self._servers:
            server.close()
        self._servers = []
        if self.stream_listener is not None:
            self.stream_listener.close()
            self.stream_listener = None
        self.listeners = [entry for entry in self.listeners if entry[0] not in
                          ("amqp", "amqps", "stream", "stream/ssl")]
        for proto in list(self.transports):
            if proto.session is not None and proto.session.conn.is_open:
                proto.session.conn.close(
                    320, "CONNECTION_FORCED - broker forced connection closure with reason "
                    f"'{reason}'")
                proto.session.conn.should_close_transport = True
            if proto.session is not None:
                proto.session.conn.linger = False  # no lingering close
            proto.flush()
        deadline = time.monotonic() + 5
        while self.transports and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for proto in list(self.transports):
            if proto.transport is not None:
                proto.transport.abort()

    def close_store(self) -> None:
        """Flush what is pending and close the store (shutdown; a demoted warren node).
        The in-memory store stands in afterwards, so ``store`` is always a store (a
        demoted node serves no client: nothing is written to it)."""
        self.publisher.register_commit()
        self.publisher.flush_delivered()
        if self.publisher.own_log_queues:  # streams: flush, fsync, close their files
            for vhost in self.vhosts.values():
                for q in vhost.queues.values():
                    q.shutdown()
        self.store.close()
        self.store = MemoryStore(loop=self._loop)
        self.store.open()

    async def _listen(self, port: int, ssl: Any = None, factory: Any = None,
                      name: str = "") -> list[tuple[str, int]]:
        """Open a listener on ``settings.bind``; ``""`` (the default) means every
        interface, IPv4 and IPv6, on one port, as RabbitMQ listens by default (a client
        that resolves localhost to ::1 must reach it). Without IPv6 on the machine the
        IPv4 listener is enough. ``factory`` makes each connection's protocol (AMQP's
        by default; the stream listener passes its own) and ``name`` names the
        listener in errors."""
        assert self._loop is not None
        bind = self.settings.bind
        hosts = ["0.0.0.0", "::"] if bind == "" else [bind]
        bound: list[tuple[str, int]] = []
        make = factory if factory is not None else (lambda: AMQPProtocol(self))
        for host in hosts:
            try:
                server = await self._loop.create_server(
                    make, host=host, port=port, reuse_address=True, backlog=1024, ssl=ssl)
            except OSError as exc:
                if host == "::" and bound:
                    log.info("no IPv6 listener on port %d (%s); IPv4 only", port, exc)
                    continue
                # start-up refuses half a broker: name the listener that could not bind
                what = name or ("amqp" if ssl is None else "amqps")
                raise OSError(exc.errno, f"{what} listener cannot listen on "
                                         f"{host_port(host, port)}: "
                                         f"{exc.strerror or exc}") from exc
            self._servers.append(server)
            for sock in cast(Any, server).sockets:  # uvloop: a list; typeshed: a tuple
                addr = sock.getsockname()
                bound.append((addr[0], addr[1]))
            port = bound[0][1]  # an ephemeral port: the IPv6 listener takes the same one
        return bound

    def _open_store(self) -> None:
        """Open the log, restore durable definitions, then put messages back in queues
        (all at once: for callers without a running loop, e.g. benches)."""
        for _done in self._restore_store(None):
            pass

    async def open_store(self, slice_size: int = RESTORE_SLICE) -> None:
        """:meth:`_open_store` without holding the event loop for long: the log's
        recovery (reading and indexing every segment) runs in a worker thread, and the
        messages go back into their queues in slices of :data:`RESTORE_SLICE`, with a
        return to the loop between two. A warren standby taking over a large backlog
        keeps answering health checks and HTTP meanwhile (issue 34: about 14 s in one
        piece at 1,000,000 messages before)."""
        from amqpd.store import recovery

        rec = None
        if self.settings.persistence:
            directory = Path(self.settings.data_dir) / "log"
            directory.mkdir(parents=True, exist_ok=True)
            rec = await asyncio.to_thread(recovery.recover, directory)
        for _done in self._restore_store(rec, slice_size):
            await asyncio.sleep(0)

    def _restore_store(self, rec: Any, slice_size: int = RESTORE_SLICE) -> Iterator[None]:
        """The steps of opening the store; yields after each slice of messages.
        ``rec``: the log's recovery when already run (``None``: run here)."""
        from amqpd.store.log import SharedLog

        s = self.settings
        data = Path(s.data_dir)
        if not s.persistence:
            assert isinstance(self.store, MemoryStore)
            self.store.loop = self._loop  # commit callbacks on the loop, as the log's are
            return
        started = time.monotonic()
        store = SharedLog(data / "log", segment_size=s.segment_size,
                          compact_ratio=s.compact_ratio,
                          fsync="never" if s.fsync == "never" else "batch", loop=self._loop)
        recovered = store.open(rec)
        self.store = store
        self._recover_definitions(recovered.definitions, data / "definitions.json")
        defined = time.monotonic()
        self.operator_policies.restore(data)
        n = 0
        budget = slice_size
        for key, rq in recovered.queues.items():
            vhost_name, _, queue_name = key.partition("\x00")
            vhost = self.vhosts.get(vhost_name)
            queue = vhost.queues.get(queue_name) if vhost is not None else None
            if queue is None and recover_delayed(self, key, rq):
                continue  # a delayed exchange's held messages
            if queue is None and recover_dedup(self, key, rq):
                continue  # a deduplication exchange's cache records
            if queue is None and vhost is not None and rq.positions and \
                    not queue_name.startswith("amq.gen-"):
                # Messages outlived their definition (a crash before the definitions file
                # was rewritten): keep them in a plain durable queue rather than lose them.
                log.warning("queue %r in vhost %r has %d messages but no definition; "
                            "recreating it as a durable queue", queue_name, vhost_name,
                            len(rq.positions))
                queue = vhost.declare_queue(queue_name, durable=True, server_named=True)
            if queue is None or not queue.durable:
                store.drop_queue(key)  # transient or server-named: nothing can consume these
                continue
            redelivered = rq.redelivered
            everything = self.takeover_redelivers
            for position, size, stamp, extra in zip(rq.positions, rq.sizes, rq.stamps,
                                                    rq.extra, strict=True):
                queue.restore(LoggedMessage(store, position, size),
                              everything or position in redelivered,
                              stamp >> 1, extra)
                budget -= 1
                if not budget:
                    budget = slice_size
                    yield None
            n += len(rq.positions)
        if recovered.truncated_bytes:
            log.warning("store: truncated %d bytes of torn or corrupt log tail",
                        recovered.truncated_bytes)
        log.info("recovered %d definitions in %.2fs, %d messages in %d queues in %.2fs",
                 len(recovered.definitions), defined - started, n, len(recovered.queues),
                 time.monotonic() - defined)

    def _recover_definitions(self, entries: dict[tuple[int, str], bytes],
                             legacy: Path) -> None:
        """Definitions from the log; on the first start after issue 22, from the old
        definitions.json (migrated into the log once)."""
        journal = self.definitions
        assert self.store is not None
        journal.attach(self.store)
        if entries:
            journal.restore(entries)
            if legacy.exists():  # migrated, but the rename did not happen (crash)
                legacy.rename(legacy.with_name(legacy.name + ".migrated"))
        elif legacy.exists():
            journal.migrate(legacy)
        s = self.settings
        for u in s.users:  # the config file's users apply on top, as before
            self.auth.add_user(u.name, u.password, u.tags, password_hash=u.password_hash,
                               algorithm=u.hashing_algorithm)
        for p in s.permissions:
            self.auth.set_permissions(p.user, p.vhost, p.configure, p.write, p.read)
        journal.changed(None, False)  # first start: the defaults; later: config users

    def _restore_definitions(self, defs: dict[str, Any]) -> None:
        """Boot from the saved definitions. Default user and vhost exist only on a first
        boot (as in RabbitMQ): once saved definitions hold users, they are the truth,
        with the config file's users applied on top."""
        if not any(defs.get(k) for k in ("vhosts", "queues", "exchanges", "users")):
            return
        from amqpd.broker.definitions import import_definitions

        if defs.get("users"):
            self.auth.clear()
        import_definitions(self, defs)
        s = self.settings
        for u in s.users:
            self.auth.add_user(u.name, u.password, u.tags, password_hash=u.password_hash,
                               algorithm=u.hashing_algorithm)
        for p in s.permissions:
            self.auth.set_permissions(p.user, p.vhost, p.configure, p.write, p.read)

    def definitions_changed(self, obj: QueueType | Exchange | Binding | None = None,
                            deleted: bool = False) -> None:
        """The one hook for persisting durable topology: ``obj`` (a queue, exchange or
        binding) was declared, or deleted; without ``obj``, users, vhosts, permissions,
        policies or parameters changed. Recorded in the log at once (a record, not a
        rewrite); a reply that must wait for durability uses ``self.definitions``."""
        self.definitions.changed(obj, deleted)

    async def _start_operations(self) -> None:
        """Boot definitions file, the amqps listener and the HTTP API (operations issue)."""
        from amqpd.tls import server_context, tls_configured

        s = self.settings
        if s.definitions_file:
            import json

            from amqpd.broker.definitions import import_definitions

            with open(s.definitions_file) as fh:
                import_definitions(self, json.load(fh))
            log.info("imported definitions from %s", s.definitions_file)
        if tls_configured(s):
            for host, port in await self._listen(s.tls_port, ssl=server_context(s)):
                self.listeners.append(("amqps", host, port))
        if s.stream and self.stream_listener is None:
            from amqpd.streamproto.transport import StreamListener

            self.stream_listener = StreamListener(self)
            for host, port in await self.stream_listener.start(s.stream_port):
                self.listeners.append(("stream", host, port))
            if tls_configured(s):
                for host, port in await self.stream_listener.start(
                        s.stream_tls_port, ssl=server_context(s)):
                    self.listeners.append(("stream/ssl", host, port))

    def local_uri(self, vhost: str = "/") -> str:
        """An AMQP URI to this broker for plugins' links (RabbitMQ's bare "amqp://")."""
        assert self.auth.internal is not None
        user, password = self.auth.internal
        host = next((h for p, h, _ in self.listeners if p == "amqp"), "127.0.0.1")
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return (f"amqp://{urllib.parse.quote(user, safe='')}:"
                f"{urllib.parse.quote(password, safe='')}@{host}:{self.port}/"
                f"{urllib.parse.quote(vhost, safe='')}")

    @property
    def port(self) -> int:
        """The AMQP port (0 while none is open: a warren standby)."""
        return self.listeners[0][2] if self.listeners else 0

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            self.alarms.check()
            self.publisher.check_memory()
            if not self.stopping:
                # acks and delivery marks ride on confirms; without any, flush them anyway
                self.store.commit(self._periodic_commit_done)
                maintain = getattr(self.store, "maintain", None)
                if maintain is not None:
                    maintain()  # an idle node still reclaims disk
            for proto in list(self.transports):
                if proto.session is not None:
                    proto.session.conn.tick(now)
                    proto.flush()

    async def promote_standby(self) -> int:
        """``amqpctl promote`` (BrokerAPI.promote): a static warren standby becomes
        active at the next epoch; returns the epoch. The replication layer's refusal
        becomes 405 RESOURCE_LOCKED here, where amqpd.replication may be imported (the
        broker package may not: the core's import contract)."""
        from amqpd.protocol.errors import PreconditionFailed, ResourceLocked
        from amqpd.replication.roles import RoleError

        roles = self.roles
        if roles is None:
            raise PreconditionFailed("replication is not configured on this node")
        try:
            return int(await roles.promote())
        except RoleError as exc:
            raise ResourceLocked(str(exc)) from None

    async def stop_plugins(self) -> None:
        """Stop the plugins (once). Called before a cluster node leaves its cluster:
        a shovel or federation link hands over what it holds by letting it be
        confirmed and acked (issue 29), which needs the queues of its route, some of
        them led by other nodes, still reachable."""
        if self._plugins_stopped:
            return
        self._plugins_stopped = True
        for plugin in self.plugins.values():
            try:
                await plugin.stop()
            except Exception:
                log.exception("plugin %s failed to stop", plugin.name)

    async def stop(self) -> None:
        """Close every connection with 320 CONNECTION_FORCED, then flush the store."""
        if self.stopping:
            return
        self.stopping = True
        await self.stop_plugins()
        log.info("shutting down: closing %d connections", len(self.transports))
        for server in self._servers:
            server.close()
        if self.http is not None:
            await self.http.stop()
        await self.close_clients("shutdown")
        if self._ticker is not None:
            self._ticker.cancel()
        self.timers.stop()  # no TTL or delayed-message work once the store closes
        if self.roles is not None:
            await self.roles.stop()
        self.close_store()
        await self.watchdog.stop()
        log.info("shutdown complete")


def tune_gc() -> None:
    """Collect young objects less often, and never re-scan what exists at boot.

    Queued messages are long-lived objects that never form cycles, yet with the default
    thresholds (700, 10, 10) the cyclic collector kept re-walking them: measured with
    240k-message backlogs (raw-socket publisher, in-process broker, gc.callbacks timing)
    it took 2.9 s of 3.6 s CPU; with (50000, 20, 100) 0.2 s, and the publish rate doubled.
    Cycles are still collected, just in larger batches.
    """
    gc.collect()
    gc.freeze()  # modules and boot-time objects move to the permanent generation
    gc.set_threshold(50_000, 20, 100)


async def serve(settings: Settings, ready: Callable[[Broker], None] | None = None) -> None:
    """Run a broker until SIGTERM/SIGINT."""
    broker = Broker(settings)
    try:
        await broker.start()
    except BaseException:
        # a listener could not bind (or boot failed): undo what started, then exit
        await broker.stop()
        raise
    tune_gc()
    cluster = None
    if settings.cluster.enabled:
        from amqpd.cluster import cluster_queues
        from amqpd.cluster.node import Cluster
        from amqpd.config import split_addr

        cluster = Cluster(broker.api, settings)
        broker.cluster = cluster
        # the inter-node links listen first: the node's record names their address
        cc = settings.cluster
        queues = await cluster_queues.start(broker.api, cluster, cluster.cookie,
                                            *split_addr(cc.link_listen),
                                            cc.queue_leader_locator)
        cluster.link_address = queues.links.address
        # joins, syncs definitions from etcd (paused until then), starts heartbeats
        try:
            await cluster.start()
        except BaseException:  # e.g. another running node holds this node's name
            await queues.stop()
            await cluster.stop()
            await broker.stop()
            raise
        from amqpd.cluster import mirror

        mirrors = mirror.start(broker.api, cluster, queues)  # mirrored queues (issue 16)
        from amqpd.cluster import quorum_group

        groups = quorum_group.start(broker.api, cluster, queues)  # quorum queues' groups
        from amqpd.cluster import stream_group

        streams = stream_group.start(broker.api, cluster, queues)  # replicated streams
        from amqpd.cluster import forwarded_publish

        # stream-protocol publishers declared on a node that does not lead their stream
        cluster.forwarded_publishes = forwarded_publish.start(
            queues, lambda: getattr(broker.stream_listener, "relay", None))
        from amqpd.cluster import peer_ask

        # the other nodes' questions (the management API's lists of the whole cluster)
        cluster.peer_ask = peer_ask.start(broker.api, queues)
        queues.extensions_started = True  # their frames are handled from here on
        from amqpd.cluster import deadlines as commit_deadlines

        # no commit waits on the replicas for ever (issue 28)
        deadlines = commit_deadlines.start(cc.definition_timeout, mirrors=mirrors,
                                           quorum=groups, queues=queues)
        broker.watchdog.add_source("replicas", deadlines.waits)
    # before READY: a service manager may send SIGTERM the moment it hears READY=1, and
    # without the handler that signal would end the process with -15 instead of a stop
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    broker.on_ready = ready
    if ready is not None:
        ready(broker)
    if settings.replication is not None:
        from amqpd.coord.warren import Warren

        broker.warren = Warren(broker.api, broker.roles, settings.replication)
        await broker.warren.start()  # role "auto": etcd decides; else a static role
    await stop.wait()
    await broker.stop_plugins()  # while the cluster is still there (their hand-over)
    if broker.warren is not None:
        await broker.warren.stop()  # an active hands over at once (fence, revoke lease)
    if cluster is not None:
        await deadlines.stop()
        await groups.stop()
        await streams.stop()
        await mirrors.stop()
        await cluster.stop()  # revokes the lease: the others see this node go at once
        cluster.peer_ask.close()  # the other nodes' questions still being answered
        await queues.stop()
    await broker.stop()


__all__ = ["Broker", "codec", "serve"]
