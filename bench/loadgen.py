"""Raw-socket AMQP 0-9-1 load generator: pre-encoded frames, counted and checked deliveries.

pamqp is used only for the handshake and the setup methods, and once to encode a
publish triplet template per target. The publish loop patches a 16-byte header into
each body with ``struct.pack_into`` and writes whole batches with one ``sendall``. The
consume loop parses deliveries straight from large ``recv_into`` buffers with ``struct``.

Every body starts with ``BODY = >HHIQ``: publisher id, stream id, sequence number (from 1,
per publisher and stream), and ``time.monotonic_ns()`` at send time (CLOCK_MONOTONIC is
system-wide, so latency can be computed in another process). Consumers check that the
sequence numbers of each (consumer tag, publisher, stream) arrive in order with no gap
and no duplicate, so every figure reported is one the tool observed.

Also here: ``sink_server`` (completes a fake handshake, then discards bytes: the ceiling
of the publish loop) and ``source_server`` (streams pre-encoded deliveries: the ceiling of
the consume loop).
"""

from __future__ import annotations

import builtins
import contextlib
import resource
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
HDR = struct.Struct(">BHI")
CLS_METH = struct.Struct(">HH")
U64 = struct.Struct(">Q")
BODY = struct.Struct(">HHIQ")
BODY_MIN = BODY.size  # 16 bytes
FRAME_MAX = 131072
RECV_SIZE = 1 << 20


class ProtocolError(RuntimeError):
    """The broker closed the channel or connection, or sent something unexpected."""


def raise_nofile(n: int = 65536) -> None:
    """Raise RLIMIT_NOFILE as far as allowed (idle-connection scenarios, big fanouts)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@dataclass
class Target:
    """Where a publisher sends: exchange, routing key and the stream id put in bodies."""

    exchange: str
    routing_key: str
    stream: int = 0


def parse_url(url: str) -> tuple[str, int, str, str, str]:
    u = urlparse(url)
    vhost = unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    return (u.hostname or "127.0.0.1", u.port or 5672, u.username or "guest",
            u.password or "guest", vhost)


class Conn:
    """A blocking AMQP connection with just enough protocol for setup RPCs."""

    def __init__(self, url: str, timeout: float = 30.0, frame_max: int = FRAME_MAX) -> None:
        host, port, user, password, vhost = parse_url(url)
        self.sock = socket.create_connection((host, port), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.sock.sendall(PROTOCOL_HEADER)
        start = self.expect(0, commands.Connection.Start)
        del start
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "amqpd-bench", "capabilities": {
                "publisher_confirms": True, "basic.nack": True,
                "consumer_cancel_notify": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))
        tune = self.expect(0, commands.Connection.Tune)
        self.frame_max = min(frame_max, tune.frame_max or frame_max)
        self.send(0, commands.Connection.TuneOk(
            channel_max=tune.channel_max or 2047, frame_max=self.frame_max, heartbeat=0))
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        self.expect(0, commands.Connection.OpenOk)
        self.channels: set[int] = set()

    # -- plumbing ---------------------------------------------------------------------
    def send(self, channel: int, *frames: Any) -> None:
        self.sock.sendall(b"".join(frame.marshal(f, channel) for f in frames))

    def read_frame(self) -> tuple[int, Any]:
        while True:
            if len(self.buf) >= 7:
                size = HDR.unpack_from(self.buf, 0)[2]
                if len(self.buf) >= size + 8:
                    n, ch, fr = frame.unmarshal(bytes(self.buf[: size + 8]))
                    del self.buf[:n]
                    return ch, fr
            data = self.sock.recv(65536)
            if not data:
                raise ProtocolError("connection closed by broker")
            self.buf += data

    def expect(self, channel: int, kind: type) -> Any:
        while True:
            ch, fr = self.read_frame()
            if isinstance(fr, kind):
                return fr
            if isinstance(fr, commands.Connection.Close):
                raise ProtocolError(f"connection.close {fr.reply_code} {fr.reply_text}")
            if isinstance(fr, commands.Channel.Close):
                with contextlib.suppress(OSError):
                    self.send(ch, commands.Channel.CloseOk())
                raise ProtocolError(f"channel.close {fr.reply_code} {fr.reply_text}")
            # anything else (heartbeats, stray acks, consume-ok of others) is skipped

    def rpc(self, channel: int, method: Any, reply: type) -> Any:
        self.send(channel, method)
        return self.expect(channel, reply)

    def open_channel(self, channel: int = 1) -> int:
        self.rpc(channel, commands.Channel.Open(), commands.Channel.OpenOk)
        self.channels.add(channel)
        return channel

    # -- setup helpers ----------------------------------------------------------------
    def declare_queue(self, ch: int, name: str, durable: bool = False,
                      arguments: dict[str, Any] | None = None) -> Any:
        return self.rpc(ch, commands.Queue.Declare(queue=name, durable=durable,
                                                   arguments=arguments or {}),
                        commands.Queue.DeclareOk)

    def message_count(self, ch: int, name: str) -> int:
        ok = self.rpc(ch, commands.Queue.Declare(queue=name, passive=True),
                      commands.Queue.DeclareOk)
        return int(ok.message_count)

    def declare_exchange(self, ch: int, name: str, kind: str, durable: bool = False,
                         arguments: dict[str, Any] | None = None) -> None:
        self.rpc(ch, commands.Exchange.Declare(exchange=name, exchange_type=kind,
                                               durable=durable, arguments=arguments or {}),
                 commands.Exchange.DeclareOk)

    def bind(self, ch: int, queue: str, exchange: str, key: str = "") -> None:
        self.rpc(ch, commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=key),
                 commands.Queue.BindOk)

    def delete_queue(self, ch: int, name: str) -> None:
        self.rpc(ch, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)

    def delete_exchange(self, ch: int, name: str) -> None:
        self.rpc(ch, commands.Exchange.Delete(exchange=name), commands.Exchange.DeleteOk)

    def close(self, timeout: float = 5.0) -> None:
        self.buf = bytearray()
        with contextlib.suppress(Exception):
            self.sock.settimeout(timeout)
            self.send(0, commands.Connection.Close(reply_code=200, reply_text="bye",
                                                        class_id=0, method_id=0))
            self.expect(0, commands.Connection.CloseOk)
        with contextlib.suppress(OSError):
            self.sock.close()


# --------------------------------------------------------------------------------------
# Publishing
# --------------------------------------------------------------------------------------

def encode_publish(target: Target, body_size: int, persistent: bool,
                   frame_max: int = FRAME_MAX,
                   headers: dict[str, Any] | None = None) -> tuple[bytes, int]:
    """One publish triplet (method, header, body frames) and the offset of the body."""
    if body_size < BODY_MIN:
        raise ValueError(f"bodies must be at least {BODY_MIN} bytes")
    if body_size > frame_max - 8:
        raise ValueError("bodies larger than one frame are not supported")
    props = commands.Basic.Properties(delivery_mode=2 if persistent else 1,
                                      headers=headers)
    head = frame.marshal(commands.Basic.Publish(exchange=target.exchange,
                                                routing_key=target.routing_key), 1)
    head += frame.marshal(ContentHeader(0, body_size, props), 1)
    body = frame.marshal(ContentBody(b"\0" * body_size), 1)
    return head + body, len(head) + 7


@dataclass
class PublisherSpec:
    pubid: int
    targets: list[Target]
    body_size: int = 16
    persistent: bool = False
    confirm_window: int = 0          # 0: no confirms
    duration: float = 10.0           # seconds, used when count == 0
    count: int = 0                   # fixed number of messages (0: use duration)
    rate: float = 0.0                # messages/s, 0: as fast as possible
    batch: int = 200                 # messages per sendall
    sync_queue: str | None = None    # passive-declare it at the end: observed count
    close_after: bool = True
    headers_fn: Any = None           # optional: per-target headers (delayed exchange)


@dataclass
class PublisherResult:
    pubid: int
    published: int = 0
    confirmed: int = 0
    nacked: int = 0
    per_stream: dict[int, int] = field(default_factory=dict)
    t_start: float = 0.0
    t_sent: float = 0.0              # last byte handed to the kernel
    t_end: float = 0.0               # all confirms in / sync round trip done
    queue_count: int | None = None
    cpu: float = 0.0
    error: str | None = None


class _Confirms:
    """Tracks publisher confirms: multiple and single acks, nacks."""

    def __init__(self) -> None:
        self.low = 1            # lowest unresolved delivery tag
        self.singles: set[int] = set()
        self.acked = 0
        self.nacked = 0

    def resolved(self) -> int:
        return self.low - 1 + len(self.singles)

    def settle(self, tag: int, multiple: bool, nack: bool) -> None:
        before = self.resolved()
        if multiple:
            if tag >= self.low:
                self.singles = {t for t in self.singles if t > tag}
                self.low = tag + 1
        elif tag == self.low:
            self.low += 1
        elif tag > self.low:
            self.singles.add(tag)
        while self.low in self.singles:
            self.singles.discard(self.low)
            self.low += 1
        n = self.resolved() - before
        if nack:
            self.nacked += n
        else:
            self.acked += n


def _read_confirms(sock: socket.socket, buf: bytearray, conf: _Confirms,
                   block: bool) -> None:
    """Read what is available (or wait for something) and settle acks/nacks."""
    sock.setblocking(block)
    try:
        data = sock.recv(RECV_SIZE)
    except (BlockingIOError, InterruptedError):
        return
    finally:
        sock.setblocking(True)
    if not data:
        raise ProtocolError("connection closed by broker")
    buf += data
    settle_frames(buf, conf.settle)


def settle_frames(buf: bytearray, settle: Callable[[int, bool, bool], None]) -> None:
    """Hand each whole basic.ack / basic.nack frame in ``buf`` to ``settle(tag,
    multiple, nack)`` and drop the frames read (a partial one stays); a
    connection.close or channel.close is a :class:`ProtocolError`. Read by hand: a
    generic decoder per confirm would make the load generator the bottleneck."""
    pos = 0
    end = len(buf)
    while end - pos >= 7:
        ftype, _ch, size = HDR.unpack_from(buf, pos)
        fend = pos + 7 + size
        if fend >= end:
            break
        if ftype == 1:
            cls, meth = CLS_METH.unpack_from(buf, pos + 7)
            if cls == 60 and meth in (80, 120):
                tag = U64.unpack_from(buf, pos + 11)[0]
                settle(tag, bool(buf[pos + 19] & 1), meth == 120)
            elif (cls, meth) in ((10, 50), (20, 40)):
                _n, _c, fr = frame.unmarshal(bytes(buf[pos:fend + 1]))
                assert isinstance(fr, (commands.Connection.Close, commands.Channel.Close))
                raise ProtocolError(f"broker closed: {fr.reply_code} {fr.reply_text}")
        pos = fend + 1
    del buf[:pos]


def run_publisher(url: str, spec: PublisherSpec, go: Any = None,
                  ready: Any = None) -> PublisherResult:
    """Connect, then (after ``ready``/``go``) publish; returns what was observed."""
    res = PublisherResult(spec.pubid)
    conn = Conn(url)
    ch = conn.open_channel(1)
    if spec.confirm_window:
        conn.rpc(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
    templates = []
    for t in spec.targets:
        headers = spec.headers_fn(t) if spec.headers_fn else None
        templates.append(encode_publish(t, spec.body_size, spec.persistent, conn.frame_max,
                                        headers))
    if ready is not None:
        ready.wait()
    if go is not None:
        go.wait()
    t0 = time.process_time()
    try:
        if spec.rate:
            _publish_paced(conn, spec, templates, res)
        else:
            _publish_fast(conn, spec, templates, res)
        conn.sock.settimeout(600.0)
        if spec.close_after and not spec.confirm_window:
            # a round trip on the publishing channel: everything before it has been
            # read and routed by the broker (and nothing is lost in socket buffers
            # when the connection closes)
            conn.rpc(ch, commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)
        if spec.sync_queue is not None:
            # RabbitMQ routes through other processes: the count may lag the last
            # publish by a little; wait (bounded) until every message is observed.
            limit = time.monotonic() + 30.0
            while True:
                res.queue_count = conn.message_count(ch, spec.sync_queue)
                if res.queue_count >= res.published or time.monotonic() > limit:
                    break
                time.sleep(0.005)
        res.t_end = time.monotonic()
    except (OSError, ProtocolError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        res.t_end = time.monotonic()
    res.cpu = time.process_time() - t0
    if spec.close_after:
        conn.close(timeout=120.0)
    else:
        conn.sock.close()
    return res


def _publish_fast(conn: Conn, spec: PublisherSpec, templates: list[tuple[bytes, int]],
                  res: PublisherResult) -> None:
    ntargets = len(spec.targets)
    per_batch = max(spec.batch, ntargets)
    per_batch -= per_batch % ntargets
    if spec.confirm_window:
        per_batch = min(per_batch, max(1, spec.confirm_window // 4))
        per_batch = max(per_batch, 1)
    buf = bytearray()
    slots: list[tuple[int, int]] = []   # (offset of body, target index)
    for i in range(per_batch):
        ti = i % ntargets
        trip, boff = templates[ti]
        slots.append((len(buf) + boff, ti))
        buf += trip
    streams = [t.stream for t in spec.targets]
    seqs = [0] * ntargets
    pack = BODY.pack_into
    mono_ns = time.monotonic_ns
    sock = conn.sock
    pubid = spec.pubid
    conf = _Confirms()
    rbuf = bytearray()
    window = spec.confirm_window
    count = spec.count
    published = 0
    res.t_start = start = time.monotonic()
    deadline = start + spec.duration
    view = memoryview(buf)
    while True:
        n = per_batch
        if count:
            n = min(per_batch, count - published)
            if n <= 0:
                break
        elif time.monotonic() >= deadline:
            break
        if window:
            while published - conf.resolved() + n > window:
                _read_confirms(sock, rbuf, conf, True)
        ts = mono_ns()
        for off, ti in slots[:n] if n != per_batch else slots:
            s = seqs[ti] + 1
            seqs[ti] = s
            pack(buf, off, pubid, streams[ti], s, ts)
        if n == per_batch:
            sock.sendall(buf)
        else:
            end = slots[n][0] - templates[slots[n][1]][1] if n < len(slots) else len(buf)
            sock.sendall(view[:end])
        published += n
        if window:
            _read_confirms(sock, rbuf, conf, False)
    res.t_sent = time.monotonic()
    if window:
        sock.settimeout(120.0)
        while conf.resolved() < published:
            _read_confirms(sock, rbuf, conf, True)
    res.published = published
    res.confirmed = conf.acked
    res.nacked = conf.nacked
    res.per_stream = {}
    for ti, s in enumerate(seqs):
        res.per_stream[streams[ti]] = res.per_stream.get(streams[ti], 0) + s


def _publish_paced(conn: Conn, spec: PublisherSpec, templates: list[tuple[bytes, int]],
                   res: PublisherResult) -> None:
    """One message at a time at a fixed rate (latency scenarios)."""
    ntargets = len(spec.targets)
    bufs = [bytearray(t[0]) for t in templates]
    offs = [t[1] for t in templates]
    streams = [t.stream for t in spec.targets]
    seqs = [0] * ntargets
    sock = conn.sock
    interval = 1.0 / spec.rate
    res.t_start = start = time.monotonic()
    total = spec.count or int(spec.duration * spec.rate)
    conf = _Confirms()
    rbuf = bytearray()
    for i in range(total):
        due = start + i * interval
        delay = due - time.monotonic()
        if delay > 0.0005:  # at high rates: small bursts, no busy waiting
            time.sleep(delay)
        ti = i % ntargets
        s = seqs[ti] + 1
        seqs[ti] = s
        BODY.pack_into(bufs[ti], offs[ti], spec.pubid, streams[ti], s, time.monotonic_ns())
        sock.sendall(bufs[ti])
        if spec.confirm_window:
            _read_confirms(sock, rbuf, conf, False)
    res.t_sent = time.monotonic()
    if spec.confirm_window:
        sock.settimeout(120.0)
        while conf.resolved() < total:
            _read_confirms(sock, rbuf, conf, True)
    res.published = total
    res.confirmed = conf.acked
    res.nacked = conf.nacked
    for ti, s in enumerate(seqs):
        res.per_stream[streams[ti]] = res.per_stream.get(streams[ti], 0) + s


# --------------------------------------------------------------------------------------
# Consuming
# --------------------------------------------------------------------------------------

@dataclass
class ConsumerSpec:
    """One connection, channel 1, one consumer per queue (consumer tag = queue name)."""

    queues: list[str]
    prefetch: int = 1000
    ack_every: int = 0               # 0: prefetch // 4
    no_ack: bool = False
    latency: bool = False            # keep one latency sample per delivery
    offsets_us: list[float] | None = None  # per stream id: subtracted from latency
    arguments: dict[str, Any] | None = None  # basic.consume arguments (x-stream-offset)
    tag_suffix: str = ""             # consumer tag = queue + this (several on one queue)


@dataclass
class ConsumerResult:
    received: int = 0
    bytes: int = 0
    gaps: int = 0                    # sequence numbers skipped
    disorder: int = 0                # duplicates or out-of-order
    redelivered: int = 0
    t_first: float = 0.0
    t_last: float = 0.0
    latencies_us: list[float] = field(default_factory=list)
    # builtins.bytes: the field ``bytes`` above shadows the type inside this class body
    last_seq: dict[tuple[builtins.bytes, int, int], int] = field(default_factory=dict)
    cpu: float = 0.0
    error: str | None = None


class _ConsumerConn:
    def __init__(self, url: str, spec: ConsumerSpec) -> None:
        self.spec = spec
        self.conn = Conn(url)
        ch = self.conn.open_channel(1)
        if not spec.no_ack:
            self.conn.rpc(ch, commands.Basic.Qos(prefetch_count=spec.prefetch),
                          commands.Basic.QosOk)
        for q in spec.queues:
            self.conn.rpc(ch, commands.Basic.Consume(queue=q, consumer_tag=q + spec.tag_suffix,
                                                     no_ack=spec.no_ack,
                                                     arguments=spec.arguments or {}),
                          commands.Basic.ConsumeOk)
        self.sock = self.conn.sock
        self.buf = bytearray(RECV_SIZE * 2)
        self.view = memoryview(self.buf)
        self.end = 0
        self.ack_every = spec.ack_every or max(1, spec.prefetch // 4)
        self.unacked = 0
        self.last_tag = 0
        self.done_tag = 0            # delivery tag of the last complete message
        self.ctag = b""
        self.body_left = 0           # bytes of body still expected for current delivery
        self.need_header = False
        self.ack_frame = bytearray(HDR.pack(1, 1, 13) + CLS_METH.pack(60, 80)
                                   + U64.pack(0) + b"\x01" + bytes([FRAME_END]))
        # carried over from a preceding body frame boundary
        self.first_body = True
        self.leftover = self.conn.buf   # bytes read past consume-ok during setup
        if self.leftover:
            self.buf[: len(self.leftover)] = self.leftover
            self.end = len(self.leftover)
        self.conn.buf = bytearray()

    def send_ack(self) -> None:
        if self.unacked and not self.spec.no_ack:
            U64.pack_into(self.ack_frame, 11, self.done_tag)
            self.sock.sendall(self.ack_frame)
            self.unacked = 0


def _parse(cc: _ConsumerConn, res: ConsumerResult) -> None:
    """Parse all complete frames in cc.buf[:cc.end]; keep the partial tail."""
    buf = cc.buf
    end = cc.end
    pos = 0
    hdr_unpack = HDR.unpack_from
    body_unpack = BODY.unpack_from
    last_seq = res.last_seq
    latency = cc.spec.latency
    offsets = cc.spec.offsets_us
    lat = res.latencies_us
    received = 0
    while end - pos >= 7:
        ftype, _ch, size = hdr_unpack(buf, pos)
        fend = pos + 7 + size
        if fend >= end:
            break
        if ftype == 3:
            if cc.first_body:
                pubid, stream, seq, ts = body_unpack(buf, pos + 7)
                key = (cc.ctag, pubid, stream)
                last = last_seq.get(key, 0)
                if seq != last + 1:
                    if seq > last + 1:
                        res.gaps += seq - last - 1
                    else:
                        res.disorder += 1
                if seq > last:
                    last_seq[key] = seq
                if latency:
                    us = (time.monotonic_ns() - ts) / 1000.0
                    lat.append(us - offsets[stream] if offsets else us)
                cc.first_body = False
            cc.body_left -= size
            res.bytes += size
            if cc.body_left <= 0:
                received += 1
                cc.unacked += 1
                cc.done_tag = cc.last_tag
                cc.first_body = True
        elif ftype == 1:
            cls, meth = CLS_METH.unpack_from(buf, pos + 7)
            if cls == 60 and meth == 60:
                p = pos + 11
                tl = buf[p]
                cc.ctag = bytes(buf[p + 1:p + 1 + tl])
                p += 1 + tl
                cc.last_tag = U64.unpack_from(buf, p)[0]
                if buf[p + 8] & 1:
                    res.redelivered += 1
            elif (cls, meth) in ((10, 50), (20, 40)):
                _n, _c, fr = frame.unmarshal(bytes(buf[pos:fend + 1]))
                assert isinstance(fr, (commands.Connection.Close, commands.Channel.Close))
                raise ProtocolError(f"broker closed: {fr.reply_code} {fr.reply_text}")
            elif cls == 60 and meth == 30:
                raise ProtocolError("consumer cancelled by broker")
        elif ftype == 2:
            cc.body_left = U64.unpack_from(buf, pos + 11)[0]
            cc.first_body = True
        pos = fend + 1
    if pos:
        rest = end - pos
        if rest:
            cc.view[:rest] = cc.view[pos:end]
        cc.end = rest
    if received:
        now = time.monotonic()
        if not res.t_first:
            res.t_first = now
        res.t_last = now
        res.received += received
        if cc.unacked >= cc.ack_every:
            cc.send_ack()


def run_consumers(url: str, specs: list[ConsumerSpec], stop: Any, progress: Any = None,
                  slot: int = 0, ready: Any = None,
                  conns: list[_ConsumerConn] | None = None) -> ConsumerResult:
    """Consume on several connections from one process until ``stop`` is set.

    ``progress[slot]`` is updated with the running count so the coordinator can stop
    everyone once the expected number of deliveries has been observed.
    """
    res = ConsumerResult()
    try:
        conns = conns or [_ConsumerConn(url, s) for s in specs]
    except (OSError, ProtocolError) as exc:
        res.error = f"setup: {type(exc).__name__}: {exc}"
        if ready is not None:
            ready.wait()
        return res
    if ready is not None:
        ready.wait()
    t0 = time.process_time()
    sel = selectors.DefaultSelector()
    for cc in conns:
        cc.sock.setblocking(False)
        sel.register(cc.sock, selectors.EVENT_READ, cc)
    try:
        # deliveries that came in the same read as consume-ok (setup kept them): parsed
        # now, not at the next read -- with the prefetch spent by them nothing more
        # would come until they are acked, and the loop would wait for ever
        for cc in conns:
            if cc.end:
                _parse(cc, res)
        if progress is not None:
            progress[slot] = res.received
        while not stop.is_set():
            events = sel.select(0.05)
            if not events:
                for cc in conns:
                    cc.send_ack()
                continue
            for key, _ in events:
                cc = key.data
                try:
                    n = cc.sock.recv_into(cc.view[cc.end:])
                except (BlockingIOError, InterruptedError):
                    continue
                if not n:
                    raise ProtocolError("connection closed by broker")
                cc.end += n
                _parse(cc, res)
                if cc.end >= len(cc.buf) - 65536:
                    # a single frame bigger than the buffer: grow it
                    cc.buf.extend(bytes(len(cc.buf)))
                    cc.view = memoryview(cc.buf)
            if progress is not None:
                progress[slot] = res.received
    except (OSError, ProtocolError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.cpu = time.process_time() - t0
    for cc in conns:
        with contextlib.suppress(OSError):
            cc.sock.setblocking(True)
            cc.send_ack()
        cc.view.release()
        cc.conn.close()
    return res


# --------------------------------------------------------------------------------------
# Generator ceilings: a sink that discards, a source that floods
# --------------------------------------------------------------------------------------

def _server_handshake(sock: socket.socket) -> bytearray:
    """Server side of the handshake; returns bytes read past connection.open."""
    buf = bytearray()
    while len(buf) < 8:
        data = sock.recv(4096)
        if not data:
            raise ProtocolError("client went away")
        buf += data
    del buf[:8]
    sock.sendall(frame.marshal(commands.Connection.Start(server_properties={
        "product": "bench-sink", "capabilities": {"publisher_confirms": True}},
        mechanisms="PLAIN", locales="en_US"), 0))
    got_open = False
    while not got_open:
        fr, buf = _server_read(sock, buf)
        if isinstance(fr, commands.Connection.StartOk):
            sock.sendall(frame.marshal(commands.Connection.Tune(
                channel_max=2047, frame_max=FRAME_MAX, heartbeat=0), 0))
        elif isinstance(fr, commands.Connection.Open):
            sock.sendall(frame.marshal(commands.Connection.OpenOk(), 0))
            got_open = True
    return buf


def _server_read(sock: socket.socket, buf: bytearray,
                 with_channel: bool = False) -> Any:
    while True:
        if len(buf) >= 7:
            size = HDR.unpack_from(buf, 0)[2]
            if len(buf) >= size + 8:
                n, ch, fr = frame.unmarshal(bytes(buf[:size + 8]))
                del buf[:n]
                return ((fr, ch, buf) if with_channel else (fr, buf))
        data = sock.recv(65536)
        if not data:
            raise ProtocolError("client went away")
        buf += data


_SETUP_REPLIES = {
    commands.Channel.Open: lambda fr: commands.Channel.OpenOk(),
    commands.Queue.Declare: lambda fr: commands.Queue.DeclareOk(queue=fr.queue or "q"),
    commands.Basic.Qos: lambda fr: commands.Basic.QosOk(),
    commands.Confirm.Select: lambda fr: commands.Confirm.SelectOk(),
    commands.Connection.Close: lambda fr: commands.Connection.CloseOk(),
    commands.Channel.Close: lambda fr: commands.Channel.CloseOk(),
}


def _sink_conn(sock: socket.socket, totals: list[int], idx: int) -> None:
    with contextlib.suppress(OSError, ProtocolError):
        buf = _server_handshake(sock)
        first = 0
        while True:
            # answer setup methods until the first publish, then only count bytes
            if len(buf) >= 11 and buf[0] == 1 and CLS_METH.unpack_from(buf, 7) == (60, 40):
                break
            fr, ch, buf = _server_read(sock, buf, with_channel=True)
            if isinstance(fr, commands.Basic.Publish):
                first = 8 + HDR.unpack_from(frame.marshal(fr, ch), 0)[2]
                break
            reply = _SETUP_REPLIES.get(type(fr))
            if reply is not None:
                sock.sendall(frame.marshal(reply(fr), ch))
        total = first + len(buf)
        mem = bytearray(RECV_SIZE * 4)
        view = memoryview(mem)
        while True:
            n = sock.recv_into(view)
            if not n:
                break
            total += n
        totals[idx] = total
    sock.close()


def sink_server(listener: socket.socket, nconns: int, out: Any) -> None:
    """Accept nconns connections, discard everything after the handshake; report bytes."""
    totals = [0] * nconns
    threads = []
    for i in range(nconns):
        s, _ = listener.accept()
        t = threading.Thread(target=_sink_conn, args=(s, totals, i), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    out.put(sum(totals))


def source_server(listener: socket.socket, stop: Any, out: Any, body_size: int = 16,
                  batch: int = 500) -> None:
    """One consumer connection: answer setup, then flood deliveries until ``stop``."""
    s, _ = listener.accept()
    sent = 0
    with contextlib.suppress(OSError, ProtocolError):
        buf = _server_handshake(s)
        ctag = "q"
        while True:
            fr, ch, buf = _server_read(s, buf, with_channel=True)
            if isinstance(fr, commands.Basic.Consume):
                ctag = fr.consumer_tag or "q"
                s.sendall(frame.marshal(commands.Basic.ConsumeOk(consumer_tag=ctag), ch))
                break
            reply = _SETUP_REPLIES.get(type(fr))
            if reply is not None:
                s.sendall(frame.marshal(reply(fr), ch))
        one = frame.marshal(commands.Basic.Deliver(consumer_tag=ctag, delivery_tag=1,
                                                   exchange="", routing_key=ctag), 1)
        tag_off = 7 + 4 + 1 + len(ctag)
        one += frame.marshal(ContentHeader(0, body_size, commands.Basic.Properties()), 1)
        body_off = len(one) + 7
        one += frame.marshal(ContentBody(b"\0" * body_size), 1)
        out_buf = bytearray(one * batch)
        slots = [(i * len(one) + tag_off, i * len(one) + body_off) for i in range(batch)]
        s.setblocking(True)
        reader = threading.Thread(target=_drain, args=(s,), daemon=True)
        reader.start()
        seq = 0
        while not stop.is_set():
            ts = time.monotonic_ns()
            for toff, boff in slots:
                seq += 1
                U64.pack_into(out_buf, toff, seq)
                BODY.pack_into(out_buf, boff, 1, 0, seq, ts)
            s.sendall(out_buf)
            sent += batch
    out.put(sent)
    with contextlib.suppress(OSError):
        s.close()


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while sock.recv(1 << 16):
            pass
