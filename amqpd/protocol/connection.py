"""The AMQP 0-9-1 connection state machine: bytes in, bytes out, no sockets.

Theory of operation
-------------------
``receive_data(bytes)`` drives everything. The machine checks the protocol header, runs
the handshake (start/start-ok, tune/tune-ok, open/open-ok), then splits frames per
channel and assembles content (``basic.publish`` method + header + body frames) before
handing complete commands to its *delegate*: the broker side, which knows about users,
vhosts, queues and consumers. Output accumulates in a buffer that the transport drains
with ``data_to_send()`` once per event-loop tick.

Faults are raised as :mod:`amqpd.protocol.errors` exceptions wherever they are found
(here or in the delegate) and translated in exactly one place, :meth:`_dispatch_guarded`:
a :class:`ChannelError` closes that channel, a :class:`ConnectionError_` closes the
connection, and anything else is a bug reported as 541 INTERNAL_ERROR. The peer's bytes
never raise out of ``receive_data``.

States::

    HEADER --hdr--> START_OK --start-ok--> TUNE_OK --tune-ok--> OPEN_WAIT --open--> OPEN
       any state --we send close--> CLOSING --close-ok--> CLOSED
       any state --peer sends close--> (we reply close-ok) CLOSED
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, cast

from pamqp import commands
from pamqp.base import Frame as PamqpFrame

from amqpd.protocol import codec
from amqpd.protocol.constants import (
    ACCESS_REQUEST,
    ACCESS_REQUEST_OK,
    BASIC_ACK,
    BASIC_PUBLISH,
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CHANNEL_OPEN,
    CHANNEL_OPEN_OK,
    CLASS_BASIC,
    CLASS_CONNECTION,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    CONNECTION_OPEN_OK,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    class_of,
    method_of,
)
from amqpd.protocol.errors import (
    AMQPError,
    ChannelError,
    ChannelErrorCode,
    ChannelMaxReached,
    CommandInvalid,
    ConnectionAccessRefused,
    ConnectionError_,
    FrameError,
    InternalError,
    PreconditionFailed,
    SyntaxError_,
    UnexpectedFrame,
)
from amqpd.protocol.frames import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    FrameReader,
)

log = logging.getLogger("amqpd.connection")


def _is_u64(buf: bytes, at: int, value: int) -> bool:
    """Whether the big-endian unsigned 64-bit integer at ``buf[at:at + 8]`` is ``value``,
    a size below 4 GiB (no slice, no tuple). Compiled, shifts into the top octets of a
    64-bit integer overflow the tagged ``int`` into boxed longs: the high half need
    only be zero, and the low half fits a tagged ``int``."""
    return (buf[at] == 0 and buf[at + 1] == 0 and buf[at + 2] == 0 and buf[at + 3] == 0
            and ((buf[at + 4] << 24) | (buf[at + 5] << 16) | (buf[at + 6] << 8)
                 | buf[at + 7]) == value)


# Exchange names and routing keys seen in publishes (raw bytes -> str), shared by every
# connection: queued messages share one string per name instead of a copy each. Bounded;
# a publisher with a new routing key per message just keeps refilling it.
NAMES_MAX: Final = 4096
_NAMES: Final[dict[bytes, str]] = {}
# (class id, method id) of basic.publish, for errors found in its content frames
_PUB_CLASS: Final = class_of(BASIC_PUBLISH)
_PUB_METHOD: Final = method_of(BASIC_PUBLISH)

# Frames handled per slice before the event loop gets a turn (about 1000 publishes).
FRAME_BUDGET: Final = 3000
# Frames handled per slice while the connection is in flow (it publishes into a queue
# whose consumers are falling behind): ~100 publishes, then deliveries and acks get the
# loop. See docs/ARCHITECTURE.md, "Fairness and flow control".
FLOW_FRAME_BUDGET: Final = 300
PRE_TUNE_FRAME_MAX: Final = 4096
CLOSING_TIMEOUT: Final = 30.0  # seconds to wait for connection.close-ok (RabbitMQ's value)
FRAME_MIN_SIZE: Final = 4096
# connection.start is the same bytes for every connection of a node: the broker hands
# each the same properties dict (Broker.server_properties), and pamqp's field-table
# encoding of it was ~4 % of the broker's CPU per connection under churn. Keyed by the
# dict's identity and the mechanisms; the entry holds the dict, so the id stays its own.
_START_CACHE: Final[dict[tuple[int, str], tuple[dict[str, Any], bytes]]] = {}


class State(enum.Enum):
    HEADER = "header"
    START_OK = "start-ok"
    TUNE_OK = "tune-ok"
    OPEN_WAIT = "open"
    OPEN = "open-done"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(slots=True)
class Limits:
    """What the server proposes in connection.tune (RabbitMQ 3.10 defaults)."""

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 134217728
    handshake_timeout: float = 10.0


@dataclass(slots=True)
class ChannelSlot:
    """Protocol-level state of one channel: open/closing, and content being assembled."""

    closing: bool = False
    publish: tuple[str, str, bool, bool] | None = None
    expect_header: bool = False
    body_size: int = 0
    properties: bytes = b""
    parts: list[bytes] = field(default_factory=list)
    received: int = 0


class ConnectionDelegate(Protocol):
    """The broker side of a connection. Methods may raise AMQPError subclasses."""

    def authenticate(self, mechanism: str, response: bytes, client_properties: dict) -> None: ...
    def open_vhost(self, vhost: str) -> None: ...
    def channel_opened(self, channel: int) -> None: ...
    def channel_closed(self, channel: int) -> None: ...
    def on_method(self, channel: int, method: PamqpFrame) -> None: ...
    def on_publish(
        self, channel: int, exchange: str, routing_key: str, mandatory: bool,
        immediate: bool, properties: bytes, body: bytes,
    ) -> None: ...
    def on_ack(self, channel: int, delivery_tag: int, multiple: bool) -> None: ...
    def on_connection_closed(self) -> None: ...


class PublishTarget:
    """A delegate that takes publishes natively: :class:`~amqpd.session.Session` derives
    from it. The fast path calls ``on_publish`` once per message; through the
    ``Protocol``-typed delegate the compiled build makes that a Python method call (name
    look-up, seven arguments boxed and parsed again), through this class a direct one.
    Any other delegate (a test's recorder) is called through the protocol, as before."""

    def on_publish(
        self, channel: int, exchange: str, routing_key: str, mandatory: bool,
        immediate: bool, properties: bytes, body: bytes,
    ) -> None:
        raise NotImplementedError


class _Detached:
    """The delegate of a connection whose socket is gone (:meth:`AMQPConnection.detach`).
    A closed connection ignores input and calls no delegate method: one that reached
    this would be a bug, so each says so instead of acting on a dead session."""

    def _gone(self) -> None:
        raise RuntimeError("a detached connection called its delegate")

    def authenticate(self, mechanism: str, response: bytes, client_properties: dict) -> None:
        self._gone()

    def open_vhost(self, vhost: str) -> None:
        self._gone()

    def channel_opened(self, channel: int) -> None:
        self._gone()

    def channel_closed(self, channel: int) -> None:
        self._gone()

    def on_method(self, channel: int, method: PamqpFrame) -> None:
        self._gone()

    def on_publish(
        self, channel: int, exchange: str, routing_key: str, mandatory: bool,
        immediate: bool, properties: bytes, body: bytes,
    ) -> None:
        self._gone()

    def on_ack(self, channel: int, delivery_tag: int, multiple: bool) -> None:
        self._gone()

    def on_connection_closed(self) -> None:
        pass  # a second close of a closed connection: nothing left to release


_DETACHED: Final = _Detached()


class AMQPConnection:
    """Sans-IO server side of one AMQP 0-9-1 connection."""

    def __init__(
        self,
        delegate: ConnectionDelegate,
        server_properties: dict[str, Any],
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.delegate = delegate
        self.server_properties = server_properties
        self.mechanisms = "PLAIN AMQPLAIN"  # offered in connection.start (set by the delegate)
        self.limits = limits or Limits()
        self.clock = clock
        self.state = State.HEADER
        self.reader = FrameReader(PRE_TUNE_FRAME_MAX)
        self._header_buf = b""
        self._out: list[bytes] = []
        # property sections already validated, each mapped to itself (the shared copy)
        self._valid_props: dict[bytes, bytes] = {}
        self._more = False  # complete frames wait in the reader (a slice was used up)
        self.out_bytes = 0  # queued for the peer this tick: deliveries stop past a cap
        self.channels: dict[int, ChannelSlot] = {}
        self.channel_max = self.limits.channel_max
        self.frame_max = PRE_TUNE_FRAME_MAX
        self.heartbeat = 0
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.vhost = ""
        self.created = clock()
        self.closing_since = 0.0
        # Set by the transport while it does not read the socket (resource alarm, backlog):
        # the peer's silence is then ours, so it must not count as missed heartbeats.
        self.reading_paused = False
        # Set by the broker after each publish: it went into a queue whose consumers are
        # falling behind (RabbitMQ shows such a connection in state "flow").
        self.in_flow = False
        self.last_received = self.created
        self.last_sent = self.created
        # heartbeat monitor state (see heartbeat_check / heartbeat_send)
        self.sent_bytes = 0
        self.received_bytes = 0  # every byte read (Prometheus connection_coarse_metrics)
        self._beat_mark = -1  # sent_bytes at the last sender check (+8 if it beat)
        self._checked_at = self.created
        self._missed_checks = 0
        self.should_close_transport = False  # transport closes the socket once drained
        # After a client's connection.close: the socket is not closed at once but drained
        # until the peer closes it or linger_timeout passes (see _finish_close).
        self.linger = False
        self.close_reason: str = ""
        self.on_output: Callable[[], None] | None = None  # transport: "flush this tick"

    # ------------------------------------------------------------------ output
    def write(self, data: bytes) -> None:
        """Queue bytes for the peer (frames already encoded)."""
        self._out.append(data)
        self.out_bytes += len(data)
        if self.on_output is not None:
            self.on_output()

    def write_delivery(self, frames: codec.DeliveryFrames, consumer_tag: bytes,
                       delivery_tag: int, redelivered: bool, exchange: str, routing_key: str,
                       properties: bytes, body: bytes) -> None:
        """Queue a basic.deliver with its content, in parts (:class:`codec.DeliveryFrames`:
        the body is copied once, when :meth:`data_to_send` joins the tick's output)."""
        self.out_bytes += frames.append_to(self._out, consumer_tag, delivery_tag, redelivered,
                                           exchange, routing_key, properties, body,
                                           self.frame_max)
        if self.on_output is not None:
            self.on_output()

    def send_method(self, channel: int, method: PamqpFrame) -> None:
        self.write(codec.pamqp_frame(channel, method))

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self.out_bytes = 0
        self.sent_bytes += len(data)
        self.last_sent = self.clock()
        return data

    @property
    def is_open(self) -> bool:
        return self.state is State.OPEN

    # ------------------------------------------------------------------ input
    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer. Never raises for anything the peer sends."""
        if self.state is State.CLOSED:
            return
        self.last_received = self.clock()
        self.received_bytes += len(data)
        if self.state is State.HEADER:
            data = self._receive_header(data)
            if not data:
                return
        self.reader.append(data)  # after any frames of a backlog still being worked off
        self.process_pending()

    @property
    def has_pending(self) -> bool:
        """Frames received but not yet handled (the transport stops reading meanwhile)."""
        return self._more

    def process_pending(self, budget: int = 0) -> bool:
        """Handle up to ``budget`` received frames; True if some are left for later.

        One socket read can hold thousands of publishes. Handling them in slices lets
        the event loop run deliveries, acks and other connections in between, so a
        flooding publisher cannot starve its own consumers (RabbitMQ gets the same
        fairness from credit flow between processes).
        """
        if not budget:  # smaller slices while in flow (see FLOW_FRAME_BUDGET)
            budget = FLOW_FRAME_BUDGET if self.in_flow else FRAME_BUDGET
        try:
            self._more = self._dispatch_frames(budget)
        except FrameError as exc:
            # The frames before the bad one were handled; now the connection closes. The
            # byte stream cannot be framed any more, so no close-ok could be found in it:
            # the socket closes once connection.close is written.
            self._more = False
            self.reader.clear()
            self._close_connection(exc)
            self.should_close_transport = True
        return self._more

    def _dispatch_frames(self, budget: int) -> bool:
        """Handle complete frames in order, up to ``budget``; True if more are waiting.

        Frames are read in place in the reader's buffer. Complete publish triplets take
        a fast path: the common shape of a publish on an open channel (method, content
        header, one body frame, all on that channel, sizes consistent) does exactly what
        the general path would, minus the per-frame state machine and minus any tuple or
        slice but the two the message keeps (its property and body bytes). Anything
        else, including every error case, goes through :meth:`_dispatch_guarded`. A
        malformed frame raises :class:`FrameError` once the frames before it are handled.
        """
        reader = self.reader
        buf = reader.data
        pos = reader.pos
        channels = self.channels
        max_size = self.limits.max_message_size
        valid = self._valid_props
        names = _NAMES
        delegate = self.delegate
        # declared, not inferred: narrowed by isinstance the variable would be an
        # intersection type, which the compiled build calls by name again
        target: PublishTarget | None = (
            delegate if isinstance(delegate, PublishTarget) else None)
        handled = 0
        # the last publish on this read: its property bytes (the shared copy), its method
        # payload and what that decoded to
        last_props = b""
        last_method = b""
        last_publish: tuple[str, str, bool, bool] = ("", "", False, False)
        try:
            while True:
                stop = reader.frame_end(pos)
                if stop < 0:
                    return False
                if handled >= budget:
                    return True
                ftype = buf[pos]
                channel = (buf[pos + 1] << 8) | buf[pos + 2]
                # basic.publish (class and method ids are below 256: high octets 0)
                if (ftype == FRAME_METHOD and stop - pos >= 11 and buf[pos + 8] == _PUB_CLASS
                        and buf[pos + 10] == _PUB_METHOD and buf[pos + 7] == 0
                        and buf[pos + 9] == 0 and self.state is State.OPEN):
                    h = stop + 1
                    hstop = reader.frame_end(h, False)
                    # content header of class basic, weight 0, on the same channel
                    if (hstop > 0 and buf[h] == FRAME_HEADER and hstop - h >= 21
                            and (buf[h + 1] << 8) | buf[h + 2] == channel
                            and buf[h + 7] == 0 and buf[h + 8] == CLASS_BASIC
                            and buf[h + 9] == 0 and buf[h + 10] == 0):
                        b = hstop + 1
                        bstop = reader.frame_end(b, False)
                        slot = channels.get(channel)
                        if (bstop > 0 and buf[b] == FRAME_BODY
                                and (buf[b + 1] << 8) | buf[b + 2] == channel
                                and slot is not None and not slot.closing
                                and slot.publish is None
                                and _is_u64(buf, h + 11, bstop - b - 7)
                                and 0 < bstop - b - 7 <= max_size):
                            props = buf[h + 19:hstop]
                            body = buf[b + 7:bstop]
                            method_at = pos + 7
                            pos = bstop + 1
                            handled += 3
                            try:
                                # one shared copy of each property section (and name)
                                # seen before, validated once: queued messages share it
                                # a publisher repeats itself: the same properties and
                                # method as the publish before cost a compare, not a
                                # hash and a dict look-up per name (nor their slices)
                                if props == last_props:
                                    props = last_props
                                else:
                                    shared = valid.get(props)
                                    if shared is None:
                                        codec.validate_properties(props)
                                        if len(valid) < 256:
                                            valid[props] = props
                                    else:
                                        props = shared
                                    last_props = props
                                method = buf[method_at:stop]
                                if method != last_method:
                                    if len(names) > NAMES_MAX:
                                        names.clear()
                                    last_publish = codec.decode_publish_at(
                                        buf, method_at, stop, names)
                                    last_method = method
                                exchange, routing_key, mandatory, immediate = last_publish
                                if target is not None:
                                    target.on_publish(channel, exchange, routing_key,
                                                      mandatory, immediate, props, body)
                                else:
                                    delegate.on_publish(channel, exchange, routing_key,
                                                        mandatory, immediate, props, body)
                            except Exception as exc:
                                if isinstance(exc, AMQPError) and not exc.class_id:
                                    exc.class_id, exc.method_id = _PUB_CLASS, _PUB_METHOD
                                self._handle_error(exc, channel, ftype)
                                if self.state is State.CLOSED:
                                    reader.clear()
                                    return False
                            continue
                payload = buf[pos + 7:stop]
                pos = stop + 1
                handled += 1
                self._dispatch_guarded(ftype, channel, payload)
                if self.state is State.CLOSED:
                    reader.clear()
                    return False
        finally:
            if reader.data is buf:
                reader.pos = pos

    def _receive_header(self, data: bytes) -> bytes:
        buf = self._header_buf + data
        if len(buf) < 8 and PROTOCOL_HEADER.startswith(buf):
            self._header_buf = buf
            return b""
        if buf[:8] != PROTOCOL_HEADER:
            # The spec: reply with the header we support, then close the socket.
            log.info("bad protocol header %r: replying with AMQP 0-9-1 header", buf[:8])
            self.write(PROTOCOL_HEADER)
            self.state = State.CLOSED
            self.close_reason = "bad protocol header"
            self.should_close_transport = True
            return b""
        self._header_buf = b""
        self.state = State.START_OK
        self.write(self._start_frame())
        return buf[8:]

    def _start_frame(self) -> bytes:
        props = self.server_properties
        key = (id(props), self.mechanisms)
        hit = _START_CACHE.get(key)
        if hit is not None and hit[0] is props:
            return hit[1]
        frame = codec.pamqp_frame(0, commands.Connection.Start(
            version_major=0, version_minor=9, server_properties=props,
            mechanisms=self.mechanisms, locales="en_US"))
        if len(_START_CACHE) >= 16:  # properties replaced (a new cluster name): forget
            _START_CACHE.clear()
        _START_CACHE[key] = (props, frame)
        return frame

    def _dispatch_guarded(self, ftype: int, channel: int, payload: bytes) -> None:
        try:
            self._dispatch(ftype, channel, payload)
        except Exception as exc:
            if isinstance(exc, AMQPError) and not exc.class_id and exc.names_method \
                    and ftype == FRAME_METHOD and len(payload) >= 4:
                exc.class_id = (payload[0] << 8) | payload[1]
                exc.method_id = (payload[2] << 8) | payload[3]
            self._handle_error(exc, channel, ftype)

    def _handle_error(self, exc: Exception, channel: int, ftype: int) -> None:
        """The one place where faults become channel.close / connection.close."""
        if isinstance(exc, ChannelError):
            if channel == 0 or self.state is not State.OPEN:
                self._close_connection(exc)
            else:
                self._close_channel(channel, exc)
        elif isinstance(exc, ConnectionError_):
            self._close_connection(exc)
        else:  # a bug: the connection dies, the broker does not
            log.error("internal error handling frame type %s on channel %s", ftype, channel,
                      exc_info=exc)
            self._close_connection(InternalError(f"internal error: {type(exc).__name__}"))

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self, ftype: int, channel: int, payload: bytes) -> None:
        if ftype == FRAME_HEARTBEAT:
            if channel != 0:
                raise UnexpectedFrame("heartbeat frame on non-zero channel")
            return
        if self.state is State.CLOSING:
            # After sending connection.close we only wait for close-ok (or close).
            if ftype == FRAME_METHOD and channel == 0:
                index = codec.method_id(payload)
                if index in (CONNECTION_CLOSE_OK, CONNECTION_CLOSE):
                    self._finish_close(reply=index == CONNECTION_CLOSE)
            return
        if channel == 0:
            if ftype != FRAME_METHOD:
                raise UnexpectedFrame(f"unexpected frame type {ftype} on channel 0")
            self._connection_method(payload)
            return
        if self.state is not State.OPEN:
            raise UnexpectedFrame(f"frame on channel {channel} before the connection is open")
        slot = self.channels.get(channel)
        if ftype == FRAME_METHOD:
            self._channel_method(channel, slot, payload)
        elif ftype == FRAME_HEADER:
            self._content_header(channel, slot, payload)
        else:
            self._content_body(channel, slot, payload)

    def _channel_method(self, channel: int, slot: ChannelSlot | None, payload: bytes) -> None:
        index = codec.method_id(payload)
        if slot is None:
            if index != CHANNEL_OPEN:
                raise ChannelErrorCode(f"expected 'channel.open' on channel {channel}")
            # RabbitMQ counts open channels (any channel number is accepted).
            if self.channel_max and len(self.channels) >= self.channel_max:
                raise ChannelMaxReached(
                    f"number of channels opened ({len(self.channels)}) has reached the "
                    f"negotiated channel_max ({self.channel_max})"
                )
            self.channels[channel] = ChannelSlot()
            self.delegate.channel_opened(channel)
            self.write(codec.method_frame(channel, CHANNEL_OPEN_OK, b"\x00\x00\x00\x00"))
            return
        if slot.closing:
            if index == CHANNEL_CLOSE_OK:
                del self.channels[channel]
            elif index == CHANNEL_CLOSE:  # crossed ours
                self.write(codec.method_frame(channel, CHANNEL_CLOSE_OK))
            elif index == CHANNEL_OPEN:
                # reopened before its close-ok: the number is still taken (RabbitMQ: 504)
                raise ChannelErrorCode("second 'channel.open' seen")
            return
        if slot.publish is not None:
            raise UnexpectedFrame(
                "expected content header for class 60, got non content header frame instead",
                _PUB_CLASS, _PUB_METHOD,
            )
        if index == BASIC_PUBLISH:
            slot.publish = codec.decode_publish(payload)
            slot.expect_header = True
            return
        if index == BASIC_ACK:
            tag, multiple = codec.decode_ack(payload)
            self.delegate.on_ack(channel, tag, multiple)
            return
        if index == CHANNEL_OPEN:
            raise ChannelErrorCode(f"second 'channel.open' seen on channel {channel}")
        if index == ACCESS_REQUEST:  # access.request (gone from 0-9-1): RabbitMQ grants ticket 1
            self.write(codec.method_frame(channel, ACCESS_REQUEST_OK, b"\x00\x01"))
            return
        method = codec.decode_method(payload)
        if index == CHANNEL_CLOSE:  # from the peer
            del self.channels[channel]
            self.delegate.channel_closed(channel)
            self.write(codec.method_frame(channel, CHANNEL_CLOSE_OK))
            return
        if index == CHANNEL_CLOSE_OK:  # without a close (RabbitMQ: 503)
            raise CommandInvalid(f"unexpected 'channel.close-ok' on channel {channel}")
        if class_of(index) == CLASS_CONNECTION:
            raise CommandInvalid(
                f"connection method {method.name} on channel {channel}", class_of(index),
                method_of(index),
            )
        try:
            self.delegate.on_method(channel, method)
        except AMQPError as exc:
            if not exc.class_id:
                exc.class_id, exc.method_id = class_of(index), method_of(index)
            raise

    def _content_header(self, channel: int, slot: ChannelSlot | None, payload: bytes) -> None:
        if slot is None:
            raise ChannelErrorCode(f"expected 'channel.open' on channel {channel}")
        if slot.closing:
            return
        if not slot.expect_header:
            raise UnexpectedFrame("expected method frame, got non method frame instead")
        class_id, size, props = codec.decode_content_header(payload)
        if class_id != CLASS_BASIC:
            raise UnexpectedFrame(f"expected content header for class 60, got one for class "
                                  f"{class_id} instead", _PUB_CLASS, _PUB_METHOD)
        codec.validate_properties(props)
        slot.expect_header = False
        slot.body_size = size
        slot.properties = props
        slot.parts = []
        slot.received = 0
        if size > self.limits.max_message_size:
            slot.publish = None
            raise PreconditionFailed(
                f"message size {size} is larger than configured max size "
                f"{self.limits.max_message_size}", _PUB_CLASS, _PUB_METHOD
            )
        if size == 0:
            self._publish_complete(channel, slot)

    def _content_body(self, channel: int, slot: ChannelSlot | None, payload: bytes) -> None:
        if slot is None:
            raise ChannelErrorCode(f"expected 'channel.open' on channel {channel}")
        if slot.closing:
            return
        if slot.expect_header:
            raise UnexpectedFrame("expected content header for class 60, got non content "
                                  "header frame instead", _PUB_CLASS, _PUB_METHOD)
        if slot.publish is None:
            raise UnexpectedFrame("expected method frame, got non method frame instead")
        slot.received += len(payload)
        if slot.received > slot.body_size:
            raise UnexpectedFrame(
                f"content body is larger than the {slot.body_size} bytes its header declared"
            )
        slot.parts.append(payload)
        if slot.received == slot.body_size:
            self._publish_complete(channel, slot)

    def _publish_complete(self, channel: int, slot: ChannelSlot) -> None:
        publish = slot.publish
        assert publish is not None
        parts = slot.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        slot.publish = None
        slot.parts = []
        exchange, routing_key, mandatory, immediate = publish
        try:
            self.delegate.on_publish(
                channel, exchange, routing_key, mandatory, immediate, slot.properties, body
            )
        except AMQPError as exc:
            if not exc.class_id:
                exc.class_id, exc.method_id = _PUB_CLASS, _PUB_METHOD
            raise

    # ------------------------------------------------------------------ channel 0
    def _connection_method(self, payload: bytes) -> None:
        index = codec.method_id(payload)
        if class_of(index) != CLASS_CONNECTION:
            raise ChannelErrorCode(
                f"non-connection method on channel 0 (class {class_of(index)})")
        method = codec.decode_method(payload)
        name = type(method).__name__
        if isinstance(method, commands.Connection.Close):
            log.debug("client closed connection: %s %s", method.reply_code, method.reply_text)
            self.close_reason = f"client closed: {method.reply_code} {method.reply_text}"
            self._finish_close(reply=True)
            return
        expected = {
            State.START_OK: commands.Connection.StartOk,
            State.TUNE_OK: commands.Connection.TuneOk,
            State.OPEN_WAIT: commands.Connection.Open,
        }.get(self.state)
        if isinstance(method, commands.Connection.UpdateSecret):
            self.send_method(0, commands.Connection.UpdateSecretOk())
            return
        if expected is None or not isinstance(method, expected):
            if self.state is State.OPEN:
                raise ChannelErrorCode(f"unexpected method connection.{name} in state running",
                                       CLASS_CONNECTION, method_of(index))
            # During the handshake RabbitMQ just drops a peer that breaks the sequence.
            log.info("handshake violation: connection.%s in state %s; dropping", name,
                     self.state.value)
            self.close_reason = f"unexpected connection.{name} during handshake"
            self.connection_lost()
            self.should_close_transport = True
            return
        if isinstance(method, commands.Connection.StartOk):
            self._start_ok(method)
        elif isinstance(method, commands.Connection.TuneOk):
            self._tune_ok(method)
        elif isinstance(method, commands.Connection.Open):
            self.delegate.open_vhost(method.virtual_host)
            self.vhost = method.virtual_host
            self.state = State.OPEN
            self.write(codec.method_frame(0, CONNECTION_OPEN_OK, b"\x00"))

    def _start_ok(self, method: commands.Connection.StartOk) -> None:
        self.client_properties = dict(method.client_properties or {})
        caps = self.client_properties.get("capabilities")
        self.capabilities = dict(caps) if isinstance(caps, dict) else {}
        # pamqp hands a long string back as str when it is valid UTF-8 and as bytes when
        # it is not (its stub says str: read it untyped, or compiled code raises
        # TypeError on a non-UTF-8 response); undo exactly that.
        raw: Any = cast(Any, method).response
        response = raw.encode("utf-8") if isinstance(raw, str) else raw or b""
        try:
            self.delegate.authenticate(method.mechanism, response, self.client_properties)
        except ConnectionAccessRefused as exc:
            self.refuse_login(exc)
            return
        except AMQPError as exc:
            # Unknown mechanism, unparseable response: RabbitMQ calls these handshake errors
            # and drops the peer without a connection.close.
            log.info("handshake error: %s; dropping", exc.reply_text)
            self.close_reason = exc.reply_text
            self.connection_lost()
            self.should_close_transport = True
            return
        self.state = State.TUNE_OK
        lim = self.limits
        self.send_method(
            0,
            commands.Connection.Tune(
                channel_max=lim.channel_max, frame_max=lim.frame_max, heartbeat=lim.heartbeat
            ),
        )

    def _tune_ok(self, method: commands.Connection.TuneOk) -> None:
        lim = self.limits
        frame_max = method.frame_max
        # RabbitMQ's rule: 0 means "no limit", so it is too high whenever the server has
        # one. A failed negotiation gets no close frame: the peer is simply dropped.
        for field_, value, minimum, server in (
            ("frame_max", frame_max, FRAME_MIN_SIZE, lim.frame_max),
            ("channel_max", method.channel_max, 1, lim.channel_max),
        ):
            if value and value < minimum:
                problem = f"{value} is lower than the minimum allowed value ({minimum})"
            elif server and (value == 0 or value > server):
                detail = " (no limit)" if value == 0 else ""
                problem = f"{value}{detail} is higher than the maximum allowed value ({server})"
            else:
                continue
            log.info("failed to negotiate connection parameters: negotiated %s = %s",
                     field_, problem)
            self.close_reason = f"negotiated {field_} = {problem}"
            self.connection_lost()
            self.should_close_transport = True
            return
        self.frame_max = frame_max or lim.frame_max
        self.channel_max = method.channel_max or lim.channel_max or 65535
        self.heartbeat = method.heartbeat
        self._checked_at = self.clock()  # the heartbeat monitor and sender start here
        self._beat_mark = -1  # the sender's first check always beats (as RabbitMQ's)
        self.reader.frame_max = self.frame_max
        self.state = State.OPEN_WAIT

    # ------------------------------------------------------------------ closing
    def _close_channel(self, channel: int, exc: AMQPError) -> None:
        slot = self.channels.get(channel)
        if slot is None or slot.closing:
            return
        log.info("closing channel %s: %s", channel, exc.reply_text)
        slot.closing = True
        slot.publish = None
        slot.parts = []
        self.delegate.channel_closed(channel)
        self.write(codec.close_method(channel, exc.reply_code, exc.reply_text, exc.class_id,
                                      exc.method_id))

    def _close_connection(self, exc: AMQPError) -> None:
        """Send connection.close and wait for close-ok (ignoring everything else)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        log.info("closing connection: %s", exc.reply_text)
        self.close_reason = exc.reply_text
        pre_open = self.state in (State.HEADER, State.START_OK)
        self.state = State.CLOSING
        self.closing_since = self.clock()
        self._release_channels()
        # The connection is over for the broker now, not at close-ok: RabbitMQ deletes
        # its exclusive queues before it sends connection.close, so a client that
        # reconnects at once can declare them again.
        self.delegate.on_connection_closed()
        self.write(codec.close_method(0, exc.reply_code, exc.reply_text, exc.class_id,
                                      exc.method_id))
        if pre_open and exc.reply_code != 403:
            self.should_close_transport = True

    def close(self, code: int, text: str) -> None:
        """Server-initiated close (shutdown, management API, a failed transaction):
        e.g. 320 CONNECTION_FORCED, 541 INTERNAL_ERROR. ``text`` may carry the name."""
        name = {320: "CONNECTION_FORCED", 541: "INTERNAL_ERROR"}.get(code, "CONNECTION_FORCED")
        prefix = f"{name} - "
        err = ConnectionError_(text[len(prefix):] if text.startswith(prefix) else text)
        err.reply_code = code
        err.name = name
        self._close_connection(err)

    def refuse_login(self, exc: AMQPError) -> None:
        """Failed authentication: close with 403 if the client can take it, else drop."""
        self.close_reason = exc.reply_text
        if self.capabilities.get("authentication_failure_close"):
            self._close_connection(exc)
            self.should_close_transport = True
        else:
            self.state = State.CLOSED
            self.should_close_transport = True
            self._release_channels()
            self.delegate.on_connection_closed()

    def _finish_close(self, reply: bool) -> None:
        if reply:
            self.write(codec.method_frame(0, CONNECTION_CLOSE_OK))
            # The peer may have written more after its close (amqplib interleaves
            # channels, so publishes can follow the close on the wire). Closing a socket
            # with unread data makes the kernel answer with a reset, and the client sees
            # ECONNRESET instead of close-ok: drain and discard until it closes instead.
            self.linger = True
        self.state = State.CLOSED
        self.should_close_transport = True
        self._release_channels()
        self.delegate.on_connection_closed()

    def _release_channels(self) -> None:
        for channel in list(self.channels):
            slot = self.channels.pop(channel)
            if not slot.closing:
                self.delegate.channel_closed(channel)

    def connection_lost(self) -> None:
        """The socket went away: release everything as if the channels closed."""
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self._release_channels()
        self.delegate.on_connection_closed()

    def detach(self) -> None:
        """The socket is gone (the transport calls this last): close if still open, then
        drop the references back to the session and the transport. Without this every
        connection (machine, session, protocol, timers) is a reference cycle that only
        the cyclic collector frees; with the broker's collector thresholds
        (server.tune_gc) connections that lived through a young collection waited for a
        rare old one, so under overloaded churn tens of thousands of dead connections
        (~86,000 objects after one 30 s round) held memory that kept RSS growing."""
        self.connection_lost()
        self.delegate = _DETACHED
        self.on_output = None

    # ------------------------------------------------------------------ timers
    def tick(self, now: float) -> None:
        """Called about once a second: handshake and closing timeouts."""
        if self.state is State.CLOSED:
            return
        if self.state is not State.OPEN and self.state is not State.CLOSING:
            if now - self.created > self.limits.handshake_timeout:
                log.info("handshake timeout after %.0fs", self.limits.handshake_timeout)
                self.close_reason = "handshake timeout"
                self.connection_lost()
                self.should_close_transport = True
            return
        if self.state is State.CLOSING and now - self.closing_since > CLOSING_TIMEOUT:
            log.info("no connection.close-ok after %ss; dropping", CLOSING_TIMEOUT)
            self.connection_lost()
            self.should_close_transport = True
            return

    # Heartbeats run on timers of their own (the transport calls these), as RabbitMQ's two
    # heartbeat processes do: a sender every heartbeat/2 s and a monitor every heartbeat s.
    @property
    def linger_timeout(self) -> float:
        """How long a closed connection's socket is drained before it is closed anyway:
        RabbitMQ's rule, the heartbeat interval if below 30 s, else 30 s."""
        hb = self.heartbeat
        return float(hb) if 0 < hb < CLOSING_TIMEOUT else CLOSING_TIMEOUT

    def heartbeat_send(self) -> None:
        """Every heartbeat/2 s: a heartbeat frame unless something else was sent since the
        last call (RabbitMQ sends one every half interval on an idle connection)."""
        if self.state is not State.OPEN and self.state is not State.OPEN_WAIT:
            return
        pending = self.sent_bytes + self.out_bytes
        if pending == self._beat_mark or self._beat_mark < 0:
            self.write(HEARTBEAT_FRAME)
            pending += len(HEARTBEAT_FRAME)
        self._beat_mark = pending

    def heartbeat_check(self, now: float) -> None:
        """Every heartbeat s: any byte received since the last check is a sign of life;
        the second check in a row without one drops the peer (RabbitMQ's monitor: 2-3
        intervals of silence). Paused while the transport does not read the socket."""
        if self.state is not State.OPEN and self.state is not State.OPEN_WAIT:
            return
        if self.reading_paused or self.last_received > self._checked_at:
            self._missed_checks = 0
        else:
            self._missed_checks += 1
        self._checked_at = now
        if self._missed_checks >= 2:
            hb = self.heartbeat
            log.warning("missed heartbeats from client, timeout: %ss", hb)
            self.close_reason = f"missed heartbeats from client, timeout: {hb}s"
            self.connection_lost()
            self.should_close_transport = True


__all__ = ["AMQPConnection", "ConnectionDelegate", "Limits", "PublishTarget", "State",
           "SyntaxError_"]
