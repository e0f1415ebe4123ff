"""One stream-protocol connection: the command state machine over the broker.

States follow RabbitMQ's plugin: peer properties and SASL first (``_authenticated``),
then tune and open (``_opened``); any other command before open is refused with a
close and a log line. Output is queued in ``self.out`` (frames) and taken by the
transport (:mod:`amqpd.streamproto.transport`) once per tick; ``close_transport`` asks
it to end the socket after writing.

Streams are the broker's stream queues (:class:`amqpd.broker.stream.StreamQueue`):
create and delete take the same arguments and checks as ``x-queue-type: stream``,
publishing appends AMQP 1.0 messages to the stream's log (through the connection's
:class:`~amqpd.streamproto.publishing.Writer`), a subscription reads it with
its own :class:`~amqpd.store.stream_log.Reader` and sends what it reads as osiris
chunks, one per credit, never beyond the stream's commit point
(:meth:`StreamQueue.commit_point`). In a cluster a subscription on a member's node
reads that node's copy of the stream (:mod:`amqpd.streamproto.copies`); a publisher
of a stream led elsewhere sends its frames to the leader's node, which stores them
(:mod:`amqpd.streamproto.relay`). Offsets and publisher sequences
of a stream led elsewhere are asked of the leader's node
(:mod:`amqpd.streamproto.forwarding`); on the leader they are this node's
``tracking.json`` (:meth:`StreamQueue.stream_tracking`), which replication copies to
the members with the records (:mod:`amqpd.streamproto.tracking`): a named publisher's
frame notes its ids and where each one's records end before any confirm.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

import amqpd
from amqpd.broker.stream import StreamQueue, decode_payload
from amqpd.protocol.errors import AccessRefused, AMQPError, NotFound
from amqpd.store.stream_log import Reader
from amqpd.streamproto import codec as c
from amqpd.streamproto import superstreams
from amqpd.streamproto.amqp10 import data_message
from amqpd.streamproto.arguments import BadArgument, queue_arguments
from amqpd.streamproto.chunks import Cutter, next_chunk
from amqpd.streamproto.copies import CopySource, StreamSource
from amqpd.streamproto.forwarding import TrackingForwarder
from amqpd.streamproto.publishing import Publisher, Writer
from amqpd.streamproto.relay import RemotePublisher
from amqpd.streamproto.sac import Coordinator, GroupKey, Notice

if TYPE_CHECKING:
    from collections.abc import Callable

    from amqpd.broker.queue_type import QueueType
    from amqpd.server import Broker

log = logging.getLogger("amqpd.streamproto")

SERVER_FRAME_MAX: Final = 1048576  # RabbitMQ's stream plugin defaults
SERVER_HEARTBEAT: Final = 60
# bytes of publishes sent to other nodes (streams led there) and not yet answered,
# past which the connection stops reading from its client (streamproto.relay)
FORWARD_HIGH_WATER: Final = 16 << 20
CHUNK_BYTES: Final = 1024 * 1024  # a delivered chunk holds at most about this much
MAX_REFERENCE: Final = 256


class Subscription:
    """One subscription: its stream, credit and read state (``cut``: None while a
    single active consumer waits), and what the management API shows of it."""

    def __init__(self, id: int, queue: StreamSource, reader: Reader | None, credit: int,
                 properties: dict[str, str],
                 offset_spec: tuple[int, int | None] = (c.OFFSET_NEXT, None),
                 group: GroupKey | None = None, active: bool = True) -> None:
        self.id = id
        self.queue = queue
        self.cut: Cutter | None = Cutter(reader) if reader is not None else None
        self.credit = credit
        self.properties = properties
        self.offset_spec = offset_spec  # as subscribed
        self.group = group  # single active consumer: (vhost, stream, name)
        self.active = active  # a group member that is not active gets nothing
        self.chunks = 0  # delivered
        self.consumed = 0  # records delivered

    @property
    def reader(self) -> Reader | None:
        """Where the subscription reads (None while a single active consumer waits)."""
        return self.cut.reader if self.cut is not None else None


class StreamConnection:
    """The state machine of one client connection (module docstring)."""

    def __init__(self, broker: Broker, peer: tuple[str, int] | None, name: str,
                 advertised: tuple[str, int],
                 coordinator: Coordinator | None = None,
                 forwarder: TrackingForwarder | None = None) -> None:
        self.broker = broker
        # single active consumer groups: node-wide (the listener's), own one otherwise
        self.coordinator = coordinator if coordinator is not None else Coordinator()
        # offsets and publisher sequences of streams led elsewhere (node-wide)
        self.forwarder = forwarder if forwarder is not None else TrackingForwarder(
            broker)
        self._correlation = 0  # of the requests this side sends (consumer update)
        # consumer updates sent, by correlation id: (subscription id, stepping down)
        self._updates: dict[int, tuple[int, bool]] = {}
        self.peer = peer
        self.name = name
        self.advertised = advertised
        self.reader = c.FrameReader(SERVER_FRAME_MAX)
        self.out: list[bytes] = []
        self.close_transport = False
        self.username = ""
        self.vhost = ""
        self.client_properties: dict[str, str] = {}
        self._authenticated = False
        self._opened = False
        self.frame_max = SERVER_FRAME_MAX
        self.heartbeat = SERVER_HEARTBEAT
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.on_output: Callable[[], None] = lambda: None
        self.paused = False  # the transport's buffer is full: deliveries wait
        # the transport's hook: stop (False) or go on (True) reading from the client
        self.reading: Callable[[bool], None] = lambda on: None
        self._forwarding = 0  # bytes sent to leaders' nodes, not yet answered
        self.received = True  # something arrived since the last heartbeat check
        # the streams (or stand-ins of streams led elsewhere) whose removal this
        # connection hears of, by id: the queue and the callback it was given
        self._gone_callbacks: dict[int, tuple[QueueType, Callable[[Any], None]]] = {}
        # stores this connection's publishes to streams led here (streamproto.publishing)
        self.writer = Writer(self._loop, name)
        # streams led elsewhere read from this node's copy, by name (streamproto.copies)
        self._copies: dict[str, CopySource] = {}

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self.broker._loop
        assert loop is not None
        return loop

    @property
    def is_open(self) -> bool:
        """Authenticated, tuned and opened on a vhost."""
        return self._opened

    # ------------------------------------------------------------------ input
    def receive_data(self, data: bytes) -> None:
        self.received = True
        if self.close_transport:
            return
        try:
            frames = self.reader.feed(data)
        except c.FrameError as exc:
            self._fatal(exc.code, str(exc))
            return
        for frame in frames:
            try:
                command = c.decode(frame)
            except c.FrameError as exc:
                if not exc.close and len(frame) >= 8:
                    key = int.from_bytes(frame[:2], "big")
                    corr = int.from_bytes(frame[4:8], "big")
                    log.warning("stream connection %s: %s", self.name, exc)
                    self.send(c.response(key, corr, exc.code).frame())
                    continue
                self._fatal(exc.code, str(exc))
                return
            self.handle(command)
            if self.close_transport:
                return

    def send(self, frame: bytes) -> None:
        self.out.append(frame)
        self.on_output()

    def take_output(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data

    def take_parts(self) -> list[bytes]:
        """The tick's output as the frames and frame parts it was queued in (for one
        vectored write: a deliver frame's entries are not copied into a joined
        buffer first); the connection starts a new list."""
        parts = self.out
        self.out = []
        return parts

    def _fatal(self, code: int, reason: str) -> None:
        """A frame that cannot be answered: a close request, then the socket ends."""
        log.warning("stream connection %s: closing: %s (code 0x%02x)", self.name, reason,
                    code)
        self.send(c.close_request(1, code, reason[:200]))
        self.close_transport = True

    def handle(self, cmd: c.Command) -> None:
        key = cmd.key
        if not self._authenticated and key not in (c.PEER_PROPERTIES, c.SASL_HANDSHAKE,
                                                   c.SASL_AUTHENTICATE, c.CLOSE):
            self._fatal(c.UNKNOWN_FRAME, f"command 0x{key:04x} before authentication")
            return
        if self._authenticated and not self._opened and key not in (c.TUNE, c.OPEN,
                                                                    c.CLOSE, c.HEARTBEAT):
            self._fatal(c.UNKNOWN_FRAME, f"command 0x{key:04x} before open")
            return
        handler = getattr(self, _HANDLERS.get(key, "_unexpected"))
        handler(cmd)

    def _unexpected(self, cmd: c.Command) -> None:
        self._fatal(c.UNKNOWN_FRAME, f"unexpected command 0x{cmd.key:04x}")

    # ------------------------------------------------------------------ handshake
    def _peer_properties(self, cmd: c.Command) -> None:
        self.client_properties = cmd.fields[0]
        props = {"product": "amqpd", "version": amqpd.__version__, "platform": "Python",
                 "copyright": "amqpd contributors",
                 "information": "RabbitMQ Stream protocol listener",
                 "cluster_name": self.broker.settings.effective_cluster_name}
        self.send(c.response(c.PEER_PROPERTIES, cmd.correlation_id, c.OK)
                  .properties(props).frame())

    def _sasl_handshake(self, cmd: c.Command) -> None:
        w = c.response(c.SASL_HANDSHAKE, cmd.correlation_id, c.OK)
        self.send(w.u32(1).string("PLAIN").frame())

    def _sasl_authenticate(self, cmd: c.Command) -> None:
        mechanism, data = cmd.fields
        corr = cmd.correlation_id
        if mechanism != "PLAIN":
            log.warning("stream connection %s: SASL mechanism %r refused", self.name,
                        mechanism)
            self.send(c.response(c.SASL_AUTHENTICATE, corr,
                                 c.SASL_MECHANISM_NOT_SUPPORTED).frame())
            return
        parts = data.split(b"\x00")
        if len(parts) != 3:
            log.warning("stream connection %s: malformed PLAIN response", self.name)
            self.send(c.response(c.SASL_AUTHENTICATE, corr, c.SASL_ERROR).frame())
            return
        username, password = parts[1].decode(errors="replace"), parts[2].decode(
            errors="replace")
        loopback = self.peer is not None and (self.peer[0].startswith("127.")
                                              or self.peer[0] == "::1")
        user = self.broker.api.authenticate(username, password, loopback)
        if user is None:
            refused_loopback = (self.broker.api.authenticate(username, password, True)
                                is not None)
            code = c.AUTHENTICATION_FAILURE_LOOPBACK if refused_loopback else \
                c.AUTHENTICATION_FAILURE
            log.warning("stream connection %s: authentication of user '%s' failed%s",
                        self.name, username,
                        " (loopback-only user)" if refused_loopback else "")
            self.send(c.response(c.SASL_AUTHENTICATE, corr, code).frame())
            self.close_transport = True
            return
        self.username = username
        self._authenticated = True
        self.send(c.response(c.SASL_AUTHENTICATE, corr, c.OK).frame())
        self.send(c.tune(SERVER_FRAME_MAX, self.broker.settings.heartbeat))

    def _tune(self, cmd: c.Command) -> None:
        frame_max, heartbeat = cmd.fields
        if frame_max:
            self.frame_max = max(c.MIN_FRAME_MAX, min(frame_max, SERVER_FRAME_MAX))
        self.reader.frame_max = self.frame_max
        self.heartbeat = min(heartbeat, self.broker.settings.heartbeat) if heartbeat else 0

    def _open(self, cmd: c.Command) -> None:
        vhost = cmd.fields[0]
        corr = cmd.correlation_id
        if vhost not in self.broker.vhosts or not self.broker.api.can_access_vhost(
                self.username, vhost):
            log.warning("stream connection %s: user '%s' refused access to vhost '%s'",
                        self.name, self.username, vhost)
            self.send(c.response(c.OPEN, corr, c.VIRTUAL_HOST_ACCESS_FAILURE).frame())
            self.close_transport = True
            return
        self.vhost = vhost
        self._opened = True
        host, port = self.advertised
        self.send(c.response(c.OPEN, corr, c.OK).properties(
            {"advertised_host": host, "advertised_port": str(port)}).frame())
        log.info("stream connection %s: user '%s' opened vhost '%s'", self.name,
                 self.username, vhost)

    def _close(self, cmd: c.Command) -> None:
        if cmd.key & c.RESPONSE:  # the answer to a close this side sent
            self.close_transport = True
            return
        code, reason = cmd.fields
        log.info("stream connection %s: closed by the client (%d %s)", self.name, code,
                 reason)
        self.send(c.response(c.CLOSE, cmd.correlation_id, c.OK).frame())
        self.close_transport = True

    def _heartbeat(self, cmd: c.Command) -> None:
        pass  # receiving it is what counts (``received``)

    # ------------------------------------------------------------------ streams
    def _stream(self, name: str) -> StreamQueue | None:
        vh = self.broker.vhosts.get(self.vhost)
        q = vh.queues.get(name) if vh is not None else None
        return q if isinstance(q, StreamQueue) and not q.deleted else None

    def _allowed(self, kind: str, name: str, resource: str = "queue") -> bool:
        try:
            self.broker.api.check_permission(self.username, self.vhost, kind, resource, name)
        except AccessRefused as exc:
            log.warning("stream connection %s: %s", self.name, exc)
            return False
        return True

    def _create(self, cmd: c.Command) -> None:
        name, args = cmd.fields
        corr = cmd.correlation_id

        def answer(code: int) -> None:
            self.send(c.response(c.CREATE, corr, code).frame())

        if not self._allowed("configure", name):
            return answer(c.ACCESS_REFUSED)
        if name in self.broker.vhosts[self.vhost].queues:
            return answer(c.STREAM_ALREADY_EXISTS)
        try:
            arguments = queue_arguments(args)
        except BadArgument as exc:
            log.warning("stream connection %s: create '%s': %s", self.name, name, exc)
            return answer(c.PRECONDITION_FAILED)
        try:
            self.broker.api.declare_queue(self.vhost, name, durable=True,
                                          arguments=arguments)
        except AccessRefused as exc:
            log.warning("stream connection %s: create '%s': %s", self.name, name, exc)
            return answer(c.ACCESS_REFUSED)
        except AMQPError as exc:
            log.warning("stream connection %s: create '%s': %s", self.name, name, exc)
            return answer(c.PRECONDITION_FAILED)
        answer(c.OK)

    def _delete(self, cmd: c.Command) -> None:
        name = cmd.fields[0]
        corr = cmd.correlation_id
        if not self._allowed("configure", name):
            return self.send(c.response(c.DELETE, corr, c.ACCESS_REFUSED).frame())
        # a stream another node leads is deleted from here too, as RabbitMQ deletes from
        # any node: through the cluster's queue proxy, as an AMQP queue.delete here
        if self._stream(name) is None and not self._elsewhere(name):
            return self.send(c.response(c.DELETE, corr, c.STREAM_DOES_NOT_EXIST).frame())
        # the answer goes before what the deletion makes this connection send (its own
        # publishers' and subscribers' metadata-update), in RabbitMQ 3.10.8's order
        at = len(self.out)
        try:
            self.broker.api.delete_queue(self.vhost, name)
        except AMQPError as exc:  # its leader's node out of reach (a failover under way)
            log.warning("stream connection %s: delete '%s': %s", self.name, name, exc)
            return self.send(c.response(c.DELETE, corr, c.STREAM_NOT_AVAILABLE).frame())
        self.out.insert(at, c.response(c.DELETE, corr, c.OK).frame())
        self.on_output()

    def _metadata(self, cmd: c.Command) -> None:
        """Each stream's leader and replicas, as RabbitMQ 3.10.8 answers: the stream
        listeners of the leader's node and of the stream's other members that run
        (every node once in the list of brokers), so a client publishes on the leader
        and may subscribe on any of them (:mod:`amqpd.streamproto.copies`). One node:
        this node, no replicas."""
        brokers: list[tuple[str, int]] = []
        answers: list[tuple[str, int, int, list[int]]] = []  # name, code, leader, replicas

        def reference(where: tuple[str, int]) -> int:
            if where not in brokers:
                brokers.append(where)
            return brokers.index(where)

        for name in cmd.fields:
            found, leader, replicas = self._topology(name)
            if leader is None:
                code = c.STREAM_NOT_AVAILABLE if found else c.STREAM_DOES_NOT_EXIST
                answers.append((name, code, 0xFFFF, []))
                continue
            answers.append((name, c.OK, reference(leader), [reference(r) for r in replicas]))
        w = c.Writer(c.METADATA | c.RESPONSE).u32(cmd.correlation_id)
        w.u32(len(brokers))
        for ref, (host, port) in enumerate(brokers):
            w.u16(ref).string(host).u32(port)
        w.u32(len(answers))
        for name, code, leader_ref, replica_refs in answers:
            w.string(name).u16(code).u16(leader_ref).u32(len(replica_refs))
            for ref in replica_refs:
                w.u16(ref)
        self.send(w.frame())

    def _elsewhere(self, name: str) -> bool:
        """A stream of this vhost that another node of the cluster leads."""
        vh = self.broker.vhosts.get(self.vhost)
        q = vh.queues.get(name) if vh is not None else None
        return self.broker.api.cluster() is not None and q is not None and \
            not q.deleted and not isinstance(q, StreamQueue) and q.listed_type() == "stream"

    def _topology(self, name: str) -> tuple[bool, tuple[str, int] | None,
                                             list[tuple[str, int]]]:
        """(the stream exists, its leader's stream listener or None if unknown, those
        of its other members that run), from the stream's group record in a cluster
        (:meth:`amqpd.cluster.stream_group.StreamGroups.queue_fields`)."""
        here = self._stream(name) is not None
        cluster = self.broker.api.cluster()
        if cluster is None or not (here or self._elsewhere(name)):
            return here, self.advertised if here else None, []
        groups = getattr(cluster, "stream_groups", None)
        fields: dict[str, Any] = groups.queue_fields(self.vhost, name) \
            if groups is not None else {}
        leader = self.broker.api.node_name() if here else (
            cluster.queue_leader(self.vhost, name) or fields.get("leader"))
        if not leader:
            return True, None, []
        replicas: list[tuple[str, int]] = []
        for member in fields.get("online", []):
            if member == leader:
                continue
            where = self._address_of(cluster, member)
            if where is not None:
                replicas.append(where)
        return True, self._address_of(cluster, leader), replicas

    def _address_of(self, cluster: Any, node: str) -> tuple[str, int] | None:
        """``node``'s stream listener (this node's: the one clients reach it by)."""
        if node == self.broker.api.node_name():
            return self.advertised
        where: tuple[str, int] | None = cluster.stream_address_of(node)
        return where

    def _ask_leader(self, key: int, corr: int, stream: str, reference: str) -> None:
        """Answer a query about stream ``stream`` led elsewhere with what its leader's
        node keeps (:mod:`amqpd.streamproto.forwarding`), once that node answered;
        0x02 at once if no node leads it, 0x10 if the user may not read it."""
        if not self._elsewhere(stream):
            return self.send(c.response(key, corr, c.STREAM_DOES_NOT_EXIST).u64(0).frame())
        if not self._allowed("read", stream):
            return self.send(c.response(key, corr, c.ACCESS_REFUSED).u64(0).frame())
        f = self.forwarder
        ask = f.query_offset if key == c.QUERY_OFFSET else f.query_sequence

        def send(code: int, value: int) -> None:
            self.send(c.response(key, corr, code).u64(value).frame())

        f.answer(ask(self.vhost, stream, reference, self.name), send)

    def _copy_for(self, name: str) -> tuple[CopySource | None, int]:
        """This node's copy of stream ``name`` led elsewhere, when its subscribers may
        read it now (:mod:`amqpd.streamproto.copies`); else None and the refusal's
        code (no such stream; no copy here that may be read: ``STREAM_NOT_AVAILABLE``,
        as RabbitMQ answers on a node with no running member)."""
        if not self._elsewhere(name):
            return None, c.STREAM_DOES_NOT_EXIST
        groups = getattr(self.broker.api.cluster(), "stream_groups", None)
        replica = groups.readable_copy(self.vhost, name) if groups is not None else None
        if replica is None:
            log.warning("stream connection %s: stream '%s' has no copy on this node that "
                        "may be read now (not a member, or its leader has not told it a "
                        "commit point yet)", self.name, name)
            return None, c.STREAM_NOT_AVAILABLE
        source = self._copies.get(name)
        if source is None or source.replica is not replica or not source.current():
            if source is not None:
                self._copy_gone(source)
            source = self._copies[name] = CopySource(name, replica,
                                                     lambda: self._copy_moved(name))
        return source, c.OK

    def _copy_moved(self, name: str) -> None:
        """This node's copy of ``name`` moved: deliver what it committed, or end its
        subscriptions if it started again or went."""
        source = self._copies.get(name)
        if source is None:
            return
        if not source.current():
            self._copy_gone(source)
            return
        for sid in [s.id for s in self.subscriptions.values() if s.queue is source]:
            self.deliver(sid)

    def _copy_gone(self, source: CopySource) -> None:
        """The copy can no longer be read as it was: its subscriptions end and the
        client hears of it (metadata-update, STREAM_NOT_AVAILABLE), as from RabbitMQ
        when the member it reads goes down."""
        source.close()
        if self._copies.get(source.name) is source:
            del self._copies[source.name]
        sids = [s.id for s in self.subscriptions.values() if s.queue is source]
        for sid in sids:
            self._drop_subscription(sid)
        if sids:
            log.info("stream connection %s: this node's copy of stream '%s' changed: "
                     "%d subscription(s) end", self.name, source.name, len(sids))
            self.send(c.metadata_update(c.STREAM_NOT_AVAILABLE, source.name))

    def stream_gone(self, queue: QueueType) -> None:
        """The stream was deleted (or, led here, is led here no more; led elsewhere,
        its stand-in was replaced by this node's election): its publishers -- those
        writing through another node too -- and subscriptions end, and the client
        hears of it at once (metadata-update, STREAM_NOT_AVAILABLE), as RabbitMQ
        3.10.8 tells every connection with a publisher or subscriber on a deleted
        stream. A forwarded publisher's ids not yet answered get publish-error 0x06
        (:meth:`RemotePublisher.ended`)."""
        self._gone_callbacks.pop(id(queue), None)
        pubs = [p for p in self.publishers.values() if p.queue is queue]
        for pub in pubs:
            del self.publishers[pub.id]
            if isinstance(pub, RemotePublisher):
                pub.ended()
        sids = [s.id for s in self.subscriptions.values() if s.queue is queue]
        for sid in sids:
            self._drop_subscription(sid)
        log.info("stream connection %s: stream '%s' is gone here: %d publisher(s) and "
                 "%d subscription(s) end", self.name, queue.name, len(pubs), len(sids))
        self.send(c.metadata_update(c.STREAM_NOT_AVAILABLE, queue.name))

    # ------------------------------------------------------------------ publishing
    def _declare_publisher(self, cmd: c.Command) -> None:
        pid, reference, stream = cmd.fields
        corr = cmd.correlation_id

        def answer(code: int) -> None:
            self.send(c.response(c.DECLARE_PUBLISHER, corr, code).frame())

        if reference is not None and len(reference) > MAX_REFERENCE:
            return answer(c.PRECONDITION_FAILED)
        q = self._stream(stream)
        if q is None and not self._elsewhere(stream):
            return answer(c.STREAM_DOES_NOT_EXIST)
        if not self._allowed("write", stream):
            return answer(c.ACCESS_REFUSED)
        if pid in self.publishers or (reference and any(
                p.reference == reference and p.queue.name == stream
                for p in self.publishers.values())):
            log.warning("stream connection %s: publisher %d (%r) already declared",
                        self.name, pid, reference)
            return answer(c.PRECONDITION_FAILED)
        if q is None:  # led by another node: its frames go there (streamproto.relay)
            remote = self._remote_publisher(pid, reference or None, stream)
            if remote is None:
                return answer(c.STREAM_NOT_AVAILABLE)
            self.publishers[pid] = remote
            return answer(c.OK)
        self.publishers[pid] = Publisher(pid, reference or None, q)
        self._watch(q, reading=False)
        answer(c.OK)

    def _remote_publisher(self, pid: int, reference: str | None,
                          stream: str) -> RemotePublisher | None:
        """A publisher for stream ``stream`` led by another node, bound to the link to
        that node; None (with a log line) when no leader is known or reachable."""
        vh = self.broker.vhosts[self.vhost]
        links = getattr(self.broker.api.cluster(), "forwarded_publishes", None)
        try:
            leader = self.forwarder.leader(self.vhost, stream)
        except NotFound as exc:
            leader, why = "", str(exc)
        else:
            why = f"no link to node '{leader}' now"
        stand_in = vh.queues[stream]
        pub = RemotePublisher(pid, reference, stand_in, self.vhost, leader, self)
        if leader and links is not None and pub.bind(links):
            log.info("stream connection %s: publisher %d of stream '%s' writes through "
                     "node '%s', its leader", self.name, pid, stream, leader)
            self._watch(stand_in, reading=False)  # the stream's deletion is heard here
            return pub
        log.warning("stream connection %s: publisher %d for stream '%s' refused: %s",
                    self.name, pid, stream, why)
        return None

    def _delete_publisher(self, cmd: c.Command) -> None:
        pid = cmd.fields[0]
        pub = self.publishers.pop(pid, None)
        if isinstance(pub, RemotePublisher):
            pub.close()
        code = c.OK if pub is not None else c.PUBLISHER_DOES_NOT_EXIST
        self.send(c.response(c.DELETE_PUBLISHER, cmd.correlation_id, code).frame())

    def _publish(self, cmd: c.Command) -> None:
        pid, entries = cmd.fields
        pub = self.publishers.get(pid)
        if pub is None or pub.queue.deleted:
            log.warning("stream connection %s: publish for unknown publisher %d",
                        self.name, pid)
            self.send(c.publish_error(pid, [(i, c.PUBLISHER_DOES_NOT_EXIST)
                                            for i, _ in entries]))
            return
        if isinstance(pub, RemotePublisher):
            pub.forward(entries)  # to the leader's node (streamproto.relay)
            return
        assert isinstance(pub.queue, StreamQueue)
        self.writer.publish(pub, pub.queue, entries, self)

    def confirm(self, pub: Publisher, ids: list[int]) -> None:
        """Publish-confirm frames for ``ids`` (the writer's :class:`Sink`), as many as
        the frame size takes."""
        step = max(1, (self.frame_max - 16) // 8)  # ids per confirm frame
        for at in range(0, len(ids), step):
            self.send(c.publish_confirm(pub.id, ids[at:at + step]))

    def error(self, pub: Publisher, errors: list[tuple[int, int]]) -> None:
        self.send(c.publish_error(pub.id, errors))

    def in_flight(self, change: int) -> None:
        """Forwarded publishes not yet answered (:meth:`RemotePublisher.forward`): past
        :data:`FORWARD_HIGH_WATER` bytes the client is not read from until the
        answers bring them below half of it."""
        before = self._forwarding
        self._forwarding = now = before + change
        if before <= FORWARD_HIGH_WATER < now:
            self.reading(False)
        elif now < FORWARD_HIGH_WATER // 2 <= before:
            self.reading(True)

    def publisher_lost(self, pub: RemotePublisher) -> None:
        """A publisher lost its stream's leader (:meth:`RemotePublisher.lost`)."""
        if self.publishers.get(pub.id) is pub:
            del self.publishers[pub.id]

    def stored_sequence(self, pub: Publisher) -> int | None:
        """A named publisher's highest confirmed publishing id, as kept for
        deduplication (None for an unnamed one or before its first confirm). A
        publisher writing through another node has the figure the leader's answers
        carry (None until its first answer)."""
        if pub.reference is None:
            return None
        if isinstance(pub, RemotePublisher):
            return pub.stored
        assert isinstance(pub.queue, StreamQueue)
        return pub.queue.stream_tracking().publishers.get(pub.reference)

    def _query_publisher_sequence(self, cmd: c.Command) -> None:
        reference, stream = cmd.fields
        corr = cmd.correlation_id
        q = self._stream(stream)
        if q is None:
            return self._ask_leader(c.QUERY_PUBLISHER_SEQUENCE, corr, stream, reference)
        if not self._allowed("read", stream):
            return self.send(c.response(c.QUERY_PUBLISHER_SEQUENCE, corr,
                                        c.ACCESS_REFUSED).u64(0).frame())
        seq = q.stream_tracking().publishers.get(reference, 0)
        self.send(c.response(c.QUERY_PUBLISHER_SEQUENCE, corr, c.OK).u64(seq).frame())

    # ------------------------------------------------------------------ consuming
    def _subscribe(self, cmd: c.Command) -> None:
        sid, stream, kind, value, credit, props = cmd.fields
        corr = cmd.correlation_id

        def answer(code: int) -> None:
            self.send(c.response(c.SUBSCRIBE, corr, code).frame())

        if sid in self.subscriptions:
            return answer(c.SUBSCRIPTION_ID_ALREADY_EXISTS)
        q: StreamSource | None = self._stream(stream)
        if q is None and not self._elsewhere(stream):
            return answer(c.STREAM_DOES_NOT_EXIST)
        if not self._allowed("read", stream):
            return answer(c.ACCESS_REFUSED)
        if q is None:  # led by another node: this node's copy
            q, code = self._copy_for(stream)
            if q is None:
                return answer(code)
        if props.get("single-active-consumer") == "true":
            return self._subscribe_in_group(cmd, q)
        start = _start_offset(q, kind, value)
        self.subscriptions[sid] = Subscription(sid, q, q.log.reader(start), credit, props,
                                               (kind, value))
        if isinstance(q, StreamQueue):
            self._watch(q, reading=True)
        answer(c.OK)
        self.deliver(sid)

    def _subscribe_in_group(self, cmd: c.Command, q: StreamSource) -> None:
        """A single active consumer (RabbitMQ 3.11+, :mod:`amqpd.streamproto.sac`): it
        joins its group and reads nothing until a consumer update made it active and
        the client answered with the offset to start from."""
        sid, stream, kind, value, credit, props = cmd.fields
        group_name = props.get("name")
        if not group_name:
            log.warning("stream connection %s: subscription %d to '%s': a single active "
                        "consumer must have a name", self.name, sid, stream)
            self.send(c.response(c.SUBSCRIBE, cmd.correlation_id,
                                 c.PRECONDITION_FAILED).frame())
            return
        key = (self.vhost, stream, group_name)
        self.subscriptions[sid] = Subscription(sid, q, None, credit, props, (kind, value),
                                               group=key, active=False)
        if isinstance(q, StreamQueue):
            self._watch(q, reading=True)
        self.send(c.response(c.SUBSCRIBE, cmd.correlation_id, c.OK).frame())
        _, notices = self.coordinator.register(key, self._partition_index(stream, props),
                                               self, sid)
        _notify(notices)

    def _partition_index(self, stream: str, props: dict[str, str]) -> int:
        """The stream's index in the super stream named by the ``super-stream``
        property, as RabbitMQ finds it: its binding's ``x-stream-partition-order``,
        else the number after the name's last '-'; -1 for a plain stream."""
        bindings = self._super_stream_bindings(props.get("super-stream") or "")
        for b in bindings or ():
            if b.destination.name != stream:
                continue
            order = b.arguments.get("x-stream-partition-order")
            if isinstance(order, int):
                return order
            suffix = stream.rpartition("-")[2]
            return int(suffix) if suffix.isdigit() else -1
        return -1

    def consumer_update(self, notice: Notice) -> None:
        """The group's coordinator made a subscription of this connection active or
        not: tell the client (a consumer update request); an active one starts reading
        once the client answered."""
        sub = self.subscriptions.get(notice.subscription_id)
        if sub is None:
            return
        sub.active = notice.active
        if not notice.active:
            sub.cut = None
        self._correlation += 1
        self._updates[self._correlation] = (sub.id, notice.stepping_down)
        log.info("stream connection %s: subscription %d to '%s' in group '%s' is %s%s",
                 self.name, sub.id, sub.queue.name, sub.group[2] if sub.group else "",
                 "active" if notice.active else "inactive",
                 " (stepping down)" if notice.stepping_down else "")
        self.send(c.consumer_update(self._correlation, sub.id, notice.active))

    def _consumer_update_answer(self, cmd: c.Command) -> None:
        """The client's answer to a consumer update: the offset an active consumer
        starts from (type 0: the subscription's own offset specification); from a
        consumer stepping down, the signal to activate the group's next one."""
        code, kind, value = cmd.fields
        entry = self._updates.pop(cmd.correlation_id, None)
        if entry is None:
            log.warning("stream connection %s: a consumer-update answer for unknown "
                        "correlation id %d ignored", self.name, cmd.correlation_id)
            return
        if code != c.OK:
            log.info("stream connection %s: consumer-update answer with code 0x%02x",
                     self.name, code)
        sid, stepping_down = entry
        sub = self.subscriptions.get(sid)
        if sub is None:
            return
        if sub.active:
            if sub.cut is None:
                spec = sub.offset_spec if kind == c.OFFSET_NONE else (kind, value)
                sub.cut = Cutter(sub.queue.log.reader(_start_offset(sub.queue, *spec)))
                self.deliver(sid)
        elif stepping_down and sub.group is not None:
            _notify(self.coordinator.activate(sub.group, self, sid))

    def _watch(self, q: QueueType, reading: bool) -> None:
        """Hear of the stream's deletion (once per stream; ``q`` is the stand-in of a
        stream led elsewhere for a forwarded publisher) and, for a subscription
        (``reading``), of its commit point moving (:meth:`StreamQueue.commit_moved`)."""
        if id(q) not in self._gone_callbacks:
            gone: Callable[[Any], None] = lambda queue: self.stream_gone(q)  # noqa: E731
            self._gone_callbacks[id(q)] = (q, gone)
            q.on_removed.append(gone)
        if reading and isinstance(q, StreamQueue) and \
                self._on_records not in q.commit_watchers:
            q.commit_watchers.append(self._on_records)

    def _on_records(self) -> None:
        for sid in list(self.subscriptions):
            self.deliver(sid)

    def deliver_all(self) -> None:
        """The transport's buffer drained: go on delivering."""
        self._on_records()

    def deliver(self, sid: int) -> None:
        """Send chunks while the subscription has credit and records are readable
        (:func:`amqpd.streamproto.chunks.next_chunk`). A deliver frame goes to the
        output as three parts (its head, the chunk's header, its entries): the tick's
        output is joined once for the socket, the entries copied only then."""
        sub = self.subscriptions.get(sid)
        if sub is None:
            return
        limit = min(CHUNK_BYTES, self.frame_max - 64)
        source = sub.queue
        cache = source.chunk_cache
        upto = source.commit_point()  # nothing beyond it (once per call, not per chunk)
        out = self.out
        sent = False
        while sub.credit > 0 and not self.paused:
            cut = sub.cut
            if cut is None:
                break
            chunk = next_chunk(cut, cache, limit, _as_amqp10, upto)
            if chunk is None:
                break
            sub.credit -= 1
            sub.chunks += 1
            sub.consumed += chunk.records
            out.append(c.deliver_head(sid, chunk.size))
            out.append(chunk.header)
            out.append(chunk.entries)
            sent = True
        if sent:
            self.on_output()

    def _credit(self, cmd: c.Command) -> None:
        sid, credit = cmd.fields
        sub = self.subscriptions.get(sid)
        if sub is None:
            log.warning("stream connection %s: credit for unknown subscription %d",
                        self.name, sid)
            self.send(c.credit_error(c.SUBSCRIPTION_ID_DOES_NOT_EXIST, sid))
            return
        sub.credit = min(sub.credit + credit, 0xFFFF)
        self.deliver(sid)

    def _unsubscribe(self, cmd: c.Command) -> None:
        sid = cmd.fields[0]
        code = c.OK if sid in self.subscriptions else c.SUBSCRIPTION_ID_DOES_NOT_EXIST
        self._drop_subscription(sid)
        self.send(c.response(c.UNSUBSCRIBE, cmd.correlation_id, code).frame())

    def _drop_subscription(self, sid: int) -> None:
        sub = self.subscriptions.pop(sid, None)
        if sub is None:
            return
        if sub.group is not None:
            _notify(self.coordinator.unregister(sub.group, self, sid))
        source = sub.queue
        if any(s.queue is source for s in self.subscriptions.values()):
            return
        # the stream's last subscription here: stop hearing of its commit point
        if isinstance(source, CopySource):
            source.close()
            if self._copies.get(source.name) is source:
                del self._copies[source.name]
        elif isinstance(source, StreamQueue) and self._on_records in source.commit_watchers:
            source.commit_watchers.remove(self._on_records)

    def _store_offset(self, cmd: c.Command) -> None:
        reference, stream, offset = cmd.fields
        q = self._stream(stream)
        if (q is None and not self._elsewhere(stream)) or not reference or \
                len(reference) > MAX_REFERENCE:
            log.warning("stream connection %s: store-offset for '%s' (reference %r) "
                        "ignored: no such stream or a bad reference", self.name, stream,
                        reference)
            return  # the command has no response (RabbitMQ logs and ignores it too)
        if not self._allowed("read", stream):
            return
        if q is None:  # led by another node, which keeps the offsets
            return self.forwarder.store_offset(self.vhost, stream, reference, offset,
                                               self.name)
        t = q.stream_tracking()
        t.store_offset(reference, offset)
        loop = self.broker._loop
        assert loop is not None
        t.save(loop)

    def _query_offset(self, cmd: c.Command) -> None:
        reference, stream = cmd.fields
        corr = cmd.correlation_id
        q = self._stream(stream)
        if q is None:
            return self._ask_leader(c.QUERY_OFFSET, corr, stream, reference)
        if not self._allowed("read", stream):
            return self.send(c.response(c.QUERY_OFFSET, corr,
                                        c.ACCESS_REFUSED).u64(0).frame())
        offset = q.stream_tracking().offsets.get(reference)
        if offset is None:
            return self.send(c.response(c.QUERY_OFFSET, corr, c.NO_OFFSET).u64(0).frame())
        self.send(c.response(c.QUERY_OFFSET, corr, c.OK).u64(offset).frame())

    def _super_stream_bindings(self, name: str) -> list[Any] | None:
        """The queue bindings of super stream ``name`` (its exchange), in partition
        order (``x-stream-partition-order``, then binding order); None without it. The
        empty name is the default exchange, never a super stream (it binds every queue,
        so a plain stream named ``x-7`` would otherwise count as partition 7)."""
        if not name:
            return None
        vh = self.broker.vhosts.get(self.vhost)
        exchange = vh.exchanges.get(name) if vh is not None else None
        if exchange is None:
            return None
        bindings = [b for b in exchange.bindings.values() if b.destination_type == "queue"]

        def order(item: tuple[int, Any]) -> tuple[int, int]:
            value = item[1].arguments.get("x-stream-partition-order")
            return (value if isinstance(value, int) else 1 << 62, item[0])

        return [b for _, b in sorted(enumerate(bindings), key=order)]

    def _route(self, cmd: c.Command) -> None:
        """The partition streams a routing key goes to (super streams: bindings of a
        direct exchange); 0x02 when there is no such exchange."""
        key, super_stream = cmd.fields
        bindings = self._super_stream_bindings(super_stream)
        if bindings is None:
            self.send(c.response(c.ROUTE, cmd.correlation_id, c.STREAM_DOES_NOT_EXIST)
                      .u32(0).frame())
            return
        streams = [b.destination.name for b in bindings if b.routing_key == key]
        w = c.response(c.ROUTE, cmd.correlation_id, c.OK).u32(len(streams))
        for name in streams:
            w.string(name)
        self.send(w.frame())

    def _partitions(self, cmd: c.Command) -> None:
        """Every partition stream of a super stream, in partition order."""
        bindings = self._super_stream_bindings(cmd.fields[0])
        if bindings is None:
            self.send(c.response(c.PARTITIONS, cmd.correlation_id, c.STREAM_DOES_NOT_EXIST)
                      .u32(0).frame())
            return
        names = list(dict.fromkeys(b.destination.name for b in bindings))
        w = c.response(c.PARTITIONS, cmd.correlation_id, c.OK).u32(len(names))
        for name in names:
            w.string(name)
        self.send(w.frame())

    def _create_super_stream(self, cmd: c.Command) -> None:
        """RabbitMQ 3.13's create-super-stream (beyond 3.10): the layout ``amqpctl
        add_super_stream`` makes (:mod:`amqpd.streamproto.superstreams`), with the
        partition streams and binding keys the client names, with RabbitMQ's codes: a
        bad name, layout or argument 0x11, a name taken 0x05, a permission missing
        (configure and read on the exchange, configure and write on each stream, as
        add_super_stream asks) 0x10."""
        name, partitions, keys, args = cmd.fields
        corr = cmd.correlation_id

        def answer(code: int, why: str) -> None:
            log.warning("stream connection %s: create super stream '%s' refused: %s",
                        self.name, name, why)
            self.send(c.response(c.CREATE_SUPER_STREAM, corr, code).frame())

        problem = superstreams.layout_problem(name, partitions, keys)
        if problem is not None:
            return answer(c.PRECONDITION_FAILED, problem)
        if not (self._allowed("configure", name, "exchange")
                and self._allowed("read", name, "exchange")
                and all(self._allowed("configure", p) and self._allowed("write", p)
                        for p in partitions)):
            return answer(c.ACCESS_REFUSED, "access refused")
        try:
            arguments = queue_arguments(args)
        except BadArgument as exc:
            return answer(c.PRECONDITION_FAILED, str(exc))
        api = self.broker.api
        taken = superstreams.existing(api, self.vhost, name, partitions)
        if taken is not None:
            return answer(c.STREAM_ALREADY_EXISTS, taken)
        try:
            superstreams.create(api, self.vhost, name, list(zip(partitions, keys,
                                                                strict=True)), arguments)
        except AccessRefused as exc:
            return answer(c.ACCESS_REFUSED, str(exc))
        except AMQPError as exc:
            return answer(c.PRECONDITION_FAILED, str(exc))
        log.info("stream connection %s: super stream '%s' created with %d partitions",
                 self.name, name, len(partitions))
        self.send(c.response(c.CREATE_SUPER_STREAM, corr, c.OK).frame())

    def _delete_super_stream(self, cmd: c.Command) -> None:
        """RabbitMQ 3.13's delete-super-stream (beyond 3.10): the exchange and its
        partition streams go (``amqpctl delete_super_stream``); 0x02 without the
        exchange, 0x10 without configure permission on it and every partition."""
        name = cmd.fields[0]
        corr = cmd.correlation_id
        bindings = superstreams.partition_bindings(self.broker.api, self.vhost, name)
        if bindings is None:
            log.warning("stream connection %s: delete super stream '%s': no such "
                        "exchange", self.name, name)
            self.send(c.response(c.DELETE_SUPER_STREAM, corr,
                                 c.STREAM_DOES_NOT_EXIST).frame())
            return
        streams = list(dict.fromkeys(b.destination.name for b in bindings))
        if not (self._allowed("configure", name, "exchange")
                and all(self._allowed("configure", s) for s in streams)):
            self.send(c.response(c.DELETE_SUPER_STREAM, corr, c.ACCESS_REFUSED).frame())
            return
        superstreams.delete(self.broker.api, self.vhost, name, streams)
        log.info("stream connection %s: super stream '%s' deleted with %d partitions",
                 self.name, name, len(streams))
        self.send(c.response(c.DELETE_SUPER_STREAM, corr, c.OK).frame())

    def _exchange_command_versions(self, cmd: c.Command) -> None:
        """The commands this server takes and their versions (all version 1): asked
        by newer clients (RabbitMQ 3.11+'s command; rabbitmq-stream-js-client always
        asks)."""
        keys = sorted({c.CONSUMER_UPDATE} | {k for k in _HANDLERS if not k & c.RESPONSE})
        w = c.response(c.EXCHANGE_COMMAND_VERSIONS, cmd.correlation_id, c.OK)
        w.u32(len(keys))
        for key in keys:
            w.u16(key).u16(1).u16(1)
        self.send(w.frame())

    # ------------------------------------------------------------------ the end
    def closed(self) -> None:
        """The socket ended: forget publishers and subscriptions (a group member's
        group picks another active consumer)."""
        for pub in self.publishers.values():
            if isinstance(pub, RemotePublisher):
                pub.close()
        self.publishers.clear()
        for sid in list(self.subscriptions):
            self._drop_subscription(sid)
        for source in list(self._copies.values()):
            source.close()
        self._copies.clear()
        watched, self._gone_callbacks = self._gone_callbacks, {}
        for q, gone in watched.values():
            if isinstance(q, StreamQueue) and self._on_records in q.commit_watchers:
                q.commit_watchers.remove(self._on_records)
            if gone in q.on_removed:
                q.on_removed.remove(gone)


def _start_offset(q: StreamSource, kind: int, value: int | None) -> int:
    """Where a subscription with this offset specification starts reading."""
    slog = q.log
    if kind == c.OFFSET_FIRST:
        return slog.first_offset
    if kind == c.OFFSET_LAST:
        return slog.last_chunk_offset
    if kind == c.OFFSET_OFFSET and value is not None:
        return min(max(value, slog.first_offset), slog.next_offset)
    if kind == c.OFFSET_TIMESTAMP and value is not None:
        return slog.offset_for_timestamp(value)
    return slog.next_offset


def _notify(notices: list[Notice]) -> None:
    """Send each consumer update the coordinator asked for (to any connection)."""
    for notice in notices:
        notice.owner.consumer_update(notice)


def _as_amqp10(payload: bytes) -> bytes:
    """A record an AMQP 0-9-1 publisher wrote, as the AMQP 1.0 message a stream
    client reads."""
    return data_message(decode_payload(payload).body)


_HANDLERS: Final = {
    c.PEER_PROPERTIES: "_peer_properties", c.SASL_HANDSHAKE: "_sasl_handshake",
    c.SASL_AUTHENTICATE: "_sasl_authenticate", c.TUNE: "_tune", c.OPEN: "_open",
    c.CLOSE: "_close", c.CLOSE | c.RESPONSE: "_close", c.HEARTBEAT: "_heartbeat",
    c.CREATE: "_create", c.DELETE: "_delete", c.METADATA: "_metadata",
    c.DECLARE_PUBLISHER: "_declare_publisher", c.DELETE_PUBLISHER: "_delete_publisher",
    c.PUBLISH: "_publish", c.QUERY_PUBLISHER_SEQUENCE: "_query_publisher_sequence",
    c.SUBSCRIBE: "_subscribe", c.CREDIT: "_credit", c.UNSUBSCRIBE: "_unsubscribe",
    c.STORE_OFFSET: "_store_offset", c.QUERY_OFFSET: "_query_offset",
    c.ROUTE: "_route", c.PARTITIONS: "_partitions",
    c.EXCHANGE_COMMAND_VERSIONS: "_exchange_command_versions",
    c.CREATE_SUPER_STREAM: "_create_super_stream",
    c.DELETE_SUPER_STREAM: "_delete_super_stream",
    c.CONSUMER_UPDATE | c.RESPONSE: "_consumer_update_answer",
}

__all__ = ["StreamConnection"]
