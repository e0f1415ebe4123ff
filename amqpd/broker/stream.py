"""Stream queues on one node: RabbitMQ 3.10's ``x-queue-type: stream`` over AMQP 0-9-1.

A stream is an append-only log that consumers read without consuming: each consumer
has its own position, and a message stays until retention drops its segment. What a
client sees is what RabbitMQ 3.10.8 answered (conformance/cases/streams.py):

* Declaration: durable only, never exclusive, auto-delete or server-named (the quorum
  queue's refusals, with ``rabbit_stream_queue`` in the texts); the arguments of
  :data:`QUEUE_ARGUMENTS` are checked and compared on redeclare, the other RabbitMQ
  queue arguments (TTL, length limits, DLX, priorities, overflow...) are refused, and
  unknown ones kept. ``x-max-age`` is a positive integer and one unit of Y M D h m s.
* Consuming: ``basic.qos`` with a per-consumer prefetch is required (406), ``no_ack`` is
  refused (540); ``x-stream-offset`` picks the start (:func:`start_offset`); every
  delivery carries the ``x-stream-offset`` header (a long). An ack only gives the
  consumer its credit back; nack, reject and recover are refused (540), basic.get and
  queue.purge too (540). Per-message TTL is ignored; nothing is ever dead-lettered.
* Publishing: any exchange, confirms and transactions. A confirm waits for the fsync of
  the stream's segment file (one fsync per group commit, shared by every record of the
  tick), see :meth:`StreamQueue.sync_log` and docs/streams.md.

Where records live is :class:`amqpd.store.stream_log.StreamLog`: the stream's own
segment files under ``<data_dir>/streams/``, never the shared log. A consumer holds a
:class:`~amqpd.store.stream_log.Reader` (an offset and a file position) and reads what
its credit allows from the file, so consumers far behind cost disk reads, not memory;
those reads run in a worker thread for a consumer behind, in place at the tail
(:mod:`amqpd.broker.stream_readahead`), so a cold disk does not stall the loop. The
``x-stream-offset`` header is written into each record's properties when it is
appended (its offset is known then), so a delivery sends the record as stored.

On one node the stream is its own leader and only member. In a cluster
(:mod:`amqpd.cluster.stream_group`) this queue is the leader's: the cluster ships what
each flush made readable (:attr:`StreamQueue.watchers`) to the members, which append it
at the same offsets, and a confirm waits for its commit rule too
(:attr:`StreamQueue.commit_gate`); its consumers read only what that rule committed
(:attr:`StreamQueue.read_limit`), as RabbitMQ's read only committed chunks, so none
sees a record the next leader may not have. Stream-protocol subscribers read below
:meth:`StreamQueue.commit_point`: that rule's point in a cluster, on one node the
fsynced position (a flush with subscribers waiting asks for the fsync no confirm did).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqpd.broker.extensions import type_name
from amqpd.broker.message import Message
from amqpd.broker.queue_entry import QueueEntry, Unacked
from amqpd.broker.queue_type import QueueType, register_queue_type
from amqpd.broker.quorum import check_count_arguments, refuse_replicated_flags
from amqpd.broker.stream_readahead import ReadAhead, pool_for
from amqpd.broker.stream_records import (
    OFFSET_HEADER,
    append_message,
    decode_payload,
    deliver_stored,
    encode_payload,
    with_offset_header,
)
from amqpd.protocol.errors import NotImplemented_, PreconditionFailed
from amqpd.store.stream_log import AMQP10, DEFAULT_SEGMENT_BYTES, Record, StreamLog
from amqpd.streamproto.amqp10 import AMQP10Error, body_of
from amqpd.streamproto.chunks import ChunkCache
from amqpd.streamproto.tracking import Tracking

if TYPE_CHECKING:
    import asyncio

    from amqpd.broker.queue import Consumer
    from amqpd.broker.vhost import VHost

log = logging.getLogger("amqpd.stream")

TYPE_NAME = "stream"
MODULE = "rabbit_stream_queue"  # the name RabbitMQ's error texts use
# the queue arguments a 3.10 stream takes: checked on declare, compared on redeclare
QUEUE_ARGUMENTS = frozenset({
    "x-queue-type", "x-max-length-bytes", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size", "x-queue-leader-locator",
})
# RabbitMQ queue arguments other types take, refused "of queue type rabbit_stream_queue"
UNSUPPORTED_ARGUMENTS = frozenset({
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-priority", "x-overflow", "x-single-active-consumer",
    "x-queue-mode", "x-queue-version", "x-queue-master-locator", "x-delivery-limit",
    "x-max-in-memory-length", "x-max-in-memory-bytes", "x-quorum-initial-group-size",
    "x-quorum-target-group-size", "x-dead-letter-strategy",
})
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
_SECOND = 1000
# RabbitMQ's units for x-max-age and interval offsets (rabbit_amqqueue: M is 30 days)
UNITS_MS = {"Y": 365 * 86400 * _SECOND, "M": 30 * 86400 * _SECOND, "D": 86400 * _SECOND,
            "h": 3600 * _SECOND, "m": 60 * _SECOND, "s": _SECOND}
_DURATION = re.compile(r"([0-9]+)([YMDhms])\Z")
RETENTION_CHECK = 1.0  # seconds between max-age checks
READ_BATCH = 128  # records a consumer reads per pread at most
# stored bytes one dispatch round hands to the stream's consumers at most: the rest
# waits for the next round, after the connections wrote what this one gave them, so
# the deliveries in the node's memory at once do not grow with the consumers' number
DISPATCH_BYTES = 1024 * 1024
# fsyncs one worker-thread job chains at most (StreamQueue._sync_rounds) before it hands
# the thread back to the pool and the loop starts the next job: between two jobs no
# sync holds the log's files, which retention needs (StreamLog.retain)
SYNC_ROUNDS = 16
# seconds a sync job waits after an fsync for a waiter wanting the next one before it
# ends (about one fsync on a busy disk; the loop would take as long to start a new job)
SYNC_LINGER = 0.005


def parse_duration(value: Any) -> int | None:
    """``"7D"`` -> milliseconds; None when it is not a positive integer and a unit."""
    if not isinstance(value, str):
        return None
    match = _DURATION.match(value)
    if match is None or int(match.group(1)) <= 0:
        return None
    return int(match.group(1)) * UNITS_MS[match.group(2)]


def _where(name: str, vhost: str) -> str:
    return f"for queue '{name}' in vhost '{vhost}'"


def validate_stream_arguments(arguments: dict[str, Any], name: str, vhost: str) -> None:
    """RabbitMQ 3.10.8's checks of a stream's declare arguments (406)."""
    where = _where(name, vhost)
    check_count_arguments(arguments, ("x-max-length-bytes", "x-stream-max-segment-size-bytes",
                                      "x-initial-cluster-size"),
                          "x-initial-cluster-size", where)
    if "x-max-age" in arguments:
        age = arguments["x-max-age"]
        if not isinstance(age, str):
            raise PreconditionFailed(
                f"invalid arg 'x-max-age' {where}: {{unacceptable_type,{type_name(age)}}}")
        if parse_duration(age) is None:
            # RabbitMQ 3.10.8 closes the connection with 541 for some of these ("bad",
            # "-1s"); every one is the same clear 406 here (docs/streams.md)
            raise PreconditionFailed(f"invalid arg 'x-max-age' {where}: invalid_max_age")
    locator = arguments.get("x-queue-leader-locator")
    if locator is not None and locator not in LEADER_LOCATORS:
        raise PreconditionFailed(
            f"invalid arg 'x-queue-leader-locator' {where}: invalid_queue_locator_arg")
    for key in arguments:
        if key in UNSUPPORTED_ARGUMENTS:
            raise PreconditionFailed(f"invalid arg '{key}' {where} of queue type {MODULE}")


def start_offset(spec: Any, stream: StreamLog, now_ms: int) -> int | None:
    """Where a consumer with ``x-stream-offset: spec`` starts, as RabbitMQ 3.10.8 answers:
    ``first``; ``last`` (the first record of the last chunk); ``next`` (the default:
    only what is published from now on); an offset (below the first kept: first;
    beyond the end: next); a timestamp (the first record at or after it); an interval
    (``"1h"``: now minus that, as a timestamp). None for anything else."""
    if spec is None or spec == "next":
        return stream.next_offset
    if spec == "first":
        return stream.first_offset
    if spec == "last":
        return stream.last_chunk_offset
    if isinstance(spec, bool):
        return None
    if isinstance(spec, int):
        return min(max(spec, stream.first_offset), stream.next_offset)
    if isinstance(spec, datetime.datetime):
        when = spec if spec.tzinfo else spec.replace(tzinfo=datetime.UTC)
        return stream.offset_for_timestamp(int(when.timestamp() * 1000))
    interval = parse_duration(spec)
    if interval is not None:
        return stream.offset_for_timestamp(now_ms - interval)
    return None


def decode_record(record: Record, queue_name: str) -> Message:
    """The message an AMQP 0-9-1 consumer gets for ``record``: a stream-protocol
    (AMQP 1.0) message becomes its body, published to the default exchange with the
    stream's name as routing key and only the ``x-stream-offset`` header."""
    if not record.amqp10:
        return decode_payload(record.payload)
    try:
        body = body_of(record.payload)
    except AMQP10Error as exc:
        log.warning("stream '%s': offset %d is not an AMQP 1.0 message (%s): delivered "
                    "as it is", queue_name, record.offset, exc)
        body = record.payload
    return Message("", queue_name, with_offset_header(b"\x00\x00", record.offset), body,
                   persistent=True)


def _min(*values: Any) -> int | None:
    found = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return min(found) if found else None


def check_stream_consumer(name: str, vhost: str, consumer: Consumer) -> None:
    """A stream's consumer: no automatic acknowledgement (540), and a per-consumer
    prefetch (406). Also checked on a node where the stream is led elsewhere, which
    alone knows the channel's prefetch."""
    what = f"queue '{name}' in vhost '{vhost}'"
    if consumer.no_ack:
        raise NotImplemented_(
            f"automatic acknowledgement not supported by stream queues {what}")
    if not consumer.prefetch:
        raise PreconditionFailed(f"consumer prefetch count is not set for '{what}'")


def refuse_stream_return(name: str, vhost: str, method: str) -> None:
    """nack, reject and recover of a stream's deliveries are refused (540), as RabbitMQ
    3.10.8 refuses the first two (basic.recover crashes its channel with 541 there)."""
    what = "basic.nack and basic.reject" if method != "basic.recover" else method
    raise NotImplemented_(f"{what} not supported by stream queues queue '{name}' "
                          f"in vhost '{vhost}'")


class StreamQueue(QueueType):
    """``x-queue-type: stream`` on one node (module docstring)."""

    type_name = TYPE_NAME
    compared_arguments = QUEUE_ARGUMENTS
    own_log = True

    def __init__(
        self, vhost: VHost, name: str, durable: bool = False,
        exclusive_owner: object | None = None, auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments)
        self.in_store = False  # the shared log never holds a stream's records
        broker = vhost.broker
        self.directory = stream_directory(Path(broker.settings.data_dir), vhost.name, name)
        if not broker.settings.persistence and self.directory.exists():
            shutil.rmtree(self.directory)  # no persistence: nothing outlives a run
        self.max_bytes: int | None = None
        self.max_age_ms: int | None = None
        segment = self.arguments.get("x-stream-max-segment-size-bytes")
        self.log = StreamLog(self.directory, segment if isinstance(segment, int)
                             and not isinstance(segment, bool) else DEFAULT_SEGMENT_BYTES)
        self.log.open()
        (self.directory / "stream.json").write_text(json.dumps({"vhost": vhost.name,
                                                                 "name": name}))
        if self.log.truncated_bytes:
            log.warning("stream '%s' in vhost '%s': %d bytes of torn tail cut at recovery",
                        name, vhost.name, self.log.truncated_bytes)
        self.readers: dict[Consumer, ReadAhead] = {}  # consumer -> its position
        self._lag = -1  # flow_backlog's answer this tick (-1: not worked out yet)
        # stream-protocol chunks built lately, shared by its subscriptions
        self.chunk_cache = ChunkCache()
        self._loop: asyncio.AbstractEventLoop | None = broker._loop
        self._flush_pending = False
        self._chunk_ms = 0  # the timestamp of this tick's records (enqueue)
        self._dispatch_start = 0  # the consumer the next dispatch round starts with
        self._redispatch_due = False  # a round cut short by DISPATCH_BYTES follows
        self._syncing = False
        # (the offset below which all must be fsynced, callback), in the order they came
        self._sync_waiters: list[tuple[int, Callable[[BaseException | None], None]]] = []
        # the highest such offset yet: the worker thread syncs again while below it;
        # raised under the condition its sync job waits on (StreamQueue._sync_rounds)
        self._sync_wanted = 0
        self._sync_cond = threading.Condition(threading.Lock())  # never re-entered
        self._retention_timer: asyncio.TimerHandle | None = None
        self.segments_deleted = 0
        self._rolls_seen = 0
        # called after each flush made records readable (stream-protocol subscribers,
        # a replicated stream's leader shipping them)
        self.watchers: list[Callable[[], None]] = []
        # a replicated stream's commit rule (amqpd.cluster.stream_group): called with
        # the offset every record below which must be committed and the confirm's
        # callback, once they are fsynced here
        self.commit_gate: Callable[[int, Callable[[BaseException | None], None]],
                                   None] | None = None
        # a replicated stream's commit point (amqpd.cluster.stream_leading): consumers
        # get only records below it; None: everything written (one node)
        self.read_limit: Callable[[], int] | None = None
        # called when the commit point moved (stream-protocol subscribers, which read
        # only below it: :meth:`commit_point`)
        self.commit_watchers: list[Callable[[], None]] = []
        self._reader_sync_pending = False
        # stored offsets and publisher sequences (amqpd.streamproto.tracking), read
        # from the directory when first asked for
        self._tracking: Tracking | None = None
        broker.publisher.own_log_queues += 1
        self.on_removed.append(_removed)

    # -- declaring -------------------------------------------------------------------
    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any], name: str, vhost: str) -> None:
        validate_stream_arguments(arguments, name, vhost)

    @classmethod
    def validate_declaration(cls, arguments: dict[str, Any], name: str, vhost: str,
                             durable: bool, exclusive: bool, auto_delete: bool,
                             server_named: bool) -> None:
        """RabbitMQ 3.10.8's order: a server-generated name, the arguments, then
        auto-delete, exclusive and non-durable."""
        refuse_replicated_flags(cls, MODULE, arguments, name, vhost, durable, exclusive,
                                auto_delete, server_named)

    def check_consume(self, arguments: dict[str, Any], global_prefetch: int) -> None:
        """The offset must be one RabbitMQ understands (406 here; 541 there)."""
        if start_offset(arguments.get(OFFSET_HEADER), self.log, _now_ms()) is None:
            raise PreconditionFailed(
                f"invalid arg '{OFFSET_HEADER}' {_where(self.name, self.vhost.name)}: "
                f"{arguments.get(OFFSET_HEADER)!r} is not first, last, next, an offset, "
                "a timestamp or an interval")

    def check_consumer(self, consumer: Consumer) -> None:
        check_stream_consumer(self.name, self.vhost.name, consumer)

    def check_return(self, method: str) -> None:
        refuse_stream_return(self.name, self.vhost.name, method)

    # -- options (arguments and policies: the smaller wins, as RabbitMQ's streams) ------
    def options_changed(self) -> None:
        policy = self.policy or {}
        args = self.arguments
        self.max_bytes = _min(args.get("x-max-length-bytes"), policy.get("max-length-bytes"))
        ages = [a for a in (parse_duration(args.get("x-max-age")),
                            parse_duration(policy.get("max-age"))) if a is not None]
        self.max_age_ms = min(ages) if ages else None
        segment = _min(args.get("x-stream-max-segment-size-bytes"),
                       policy.get("stream-max-segment-size-bytes"))
        self.log.max_segment_bytes = DEFAULT_SEGMENT_BYTES if segment is None else segment
        self.apply_retention()

    def apply_retention(self) -> None:
        """Drop whole old segments the options say must go; with a max-age, look again
        every :data:`RETENTION_CHECK` seconds."""
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        if self.deleted:
            return
        if self.max_bytes is not None or self.max_age_ms is not None:
            gone = self.log.retain(self.max_bytes, self.max_age_ms, _now_ms())
            if gone:
                self.segments_deleted += gone
                log.info("stream '%s' in vhost '%s': retention deleted %d segment(s)",
                         self.name, self.vhost.name, gone)
        if self.max_age_ms is not None and self._loop is not None:
            self._retention_timer = self._loop.call_later(RETENTION_CHECK,
                                                          self.apply_retention)

    # -- state -----------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Records kept (what RabbitMQ's stream reports as its messages)."""
        return self.log.flushed_offset - self.log.first_offset

    def flow_backlog(self) -> int:
        """Credit flow's measure: the records kept are no backlog, only what the
        slowest consumer has still to read (a publisher feeding a stream read at its end
        stays running). Worked out once per tick (:meth:`flush` forgets it), not once per
        publish: a stream may have many consumers."""
        lag = self._lag
        if lag < 0:
            end = self.log.next_offset
            lag = max((end - r.offset for r in self.readers.values()), default=0)
            self._lag = lag
        return lag

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["messages"] = self.message_count  # an unacked delivery is still in the stream
        return out

    def type_info(self, node: str) -> dict[str, Any]:
        """Leader and members (one node), and the log: size on disk, segments, first and
        last offset, each consumer's position (the next offset it reads)."""
        return {
            "type": TYPE_NAME, "leader": node, "members": [node], "online": [node],
            "stream": self.stream_stats(),
        }

    def stream_stats(self) -> dict[str, Any]:
        log_ = self.log
        return {
            "size_bytes": log_.size_bytes,
            "segments": len(log_.segments),
            "first_offset": log_.first_offset,
            "last_offset": log_.last_offset,
            "committed_offset": log_.synced_offset - 1,
            "segments_deleted": self.segments_deleted,
            "consumers": [{"consumer_tag": c.tag, "channel": _channel_name(c),
                           "offset": r.offset,
                           "lag": max(0, log_.flushed_offset - r.offset)}
                          for c, r in self.readers.items()],
        }

    def stream_tracking(self) -> Tracking:
        """The stream's stored offsets and publisher sequences (``tracking.json`` in
        its directory, loaded on first use)."""
        if self._tracking is None:
            self._tracking = Tracking(self.directory)
        return self._tracking

    def use_tracking(self, tracking: Tracking) -> None:
        """Take the tracking state a member's copy kept (this node was elected its
        leader): what it learned from the old leader, a save under way included."""
        self._tracking = tracking

    # -- publishing ------------------------------------------------------------------
    def enqueue(self, message: Message) -> None:
        if not self._flush_pending:
            # one timestamp per chunk, as RabbitMQ's streams keep (osiris stamps a
            # chunk, not its entries): taken at the tick's first record, not per record
            self._chunk_ms = _now_ms()
            append_message(self.log, message, self._chunk_ms)
            self.stat_publish += 1
            self._flush_pending = True
            self.vhost.broker.publisher.own_log_written(self)
            if self._loop is not None:
                self._loop.call_soon(self.flush)
            else:
                self.flush()
            return
        append_message(self.log, message, self._chunk_ms)
        self.stat_publish += 1

    def append_amqp10(self, messages: list[bytes]) -> int:
        """Append stream-protocol messages as they came (one chunk with this tick's
        other records); the offset after the last one."""
        log_ = self.log
        now = _now_ms()
        log_.append_many(messages, now, AMQP10)
        self.stat_publish += len(messages)
        if not self._flush_pending and messages:
            self._chunk_ms = now  # for AMQP 0-9-1 records of the same tick (enqueue)
            self._flush_pending = True
            if self._loop is not None:
                self._loop.call_soon(self.flush)
            else:
                self.flush()
        return log_.next_offset

    def flush(self) -> None:
        """End of the tick: what was appended becomes readable (one write, one chunk);
        consumers get it; a segment that filled up may let retention drop old ones."""
        self._flush_pending = False
        self._lag = -1
        if self.deleted:
            return
        self.log.flush()
        if self.log.rolls != self._rolls_seen:  # a segment filled up this tick
            self._rolls_seen = self.log.rolls
            self.apply_retention()
        if self.consumers:
            self.vhost.schedule_dispatch(self)
        for watcher in list(self.watchers):
            watcher()
        if not self._reader_sync_pending and self._readers_behind():
            # after this tick's confirms asked for theirs (it then serves them too)
            self._reader_sync_pending = True
            if self._loop is not None:
                self._loop.call_soon(self._sync_for_readers)
            else:
                self._sync_for_readers()

    def commit_point(self) -> int:
        """The offset below which stream-protocol subscribers may read: a replicated
        stream's commit point (:attr:`read_limit`, what a majority of its members hold),
        on one node what is fsynced -- what a confirm promises -- so no subscriber sees
        a record a failover or a crash may lose. :attr:`commit_watchers` hear when it
        moves."""
        limit = self.read_limit
        return limit() if limit is not None else self.log.synced_offset

    def commit_moved(self) -> None:
        """The commit point may have moved: tell :attr:`commit_watchers` (the leader's
        side of a replicated stream calls it too, as its members acknowledge)."""
        for watcher in list(self.commit_watchers):
            watcher()

    def _readers_behind(self) -> bool:
        """One node, subscribers waiting for records written but not yet fsynced (no
        publisher's confirm asked for that fsync): the sync they need."""
        return bool(self.commit_watchers) and self.read_limit is None and \
            not self.deleted and self.log.synced_offset < self.log.flushed_offset

    def _sync_for_readers(self) -> None:
        """End of the tick after a flush with subscribers waiting: fsync what no
        confirm asked to (a confirm's sync under way covers it, or the next one)."""
        self._reader_sync_pending = False
        if not self._syncing and not self._sync_waiters and self._readers_behind():
            self._start_sync()

    def sync_log(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call back once everything appended so far is fsynced (or with the error):
        a worker thread fsyncs while the loop goes on; waiters that arrive meanwhile
        share the next fsync (group commit), which that thread starts as soon as its
        fsync returns (:meth:`_sync_rounds`)."""
        if self._flush_pending:
            self.flush()
        target = self.log.next_offset  # everything below it is flushed now
        gate = self.commit_gate
        if gate is not None:
            callback = _then_committed(gate, target, callback)
        self._sync_waiters.append((target, callback))
        if target > self._sync_wanted:
            with self._sync_cond:  # a sync job lingering for more hears of it
                self._sync_wanted = target
                self._sync_cond.notify()
        if not self._syncing:
            self._start_sync()

    def _start_sync(self) -> None:
        if self._loop is None or self.deleted:
            waiters, self._sync_waiters = self._sync_waiters, []
            error = None
            try:
                if not self.deleted:
                    self.log.sync()
            except OSError as exc:
                error = exc
            for _target, callback in waiters:
                callback(error)
            if error is None and self.read_limit is None:
                self.commit_moved()
            return
        self._syncing = True
        loop = self._loop
        future = loop.run_in_executor(None, self._sync_rounds, loop)

        def done(fut: asyncio.Future[int]) -> None:
            self._syncing = False
            error = fut.exception()
            if error is not None:
                log.error("stream '%s' in vhost '%s': fsync failed: %s",
                          self.name, self.vhost.name, error)
                # what earlier rounds made durable was released by them (:meth:`_synced`)
                waiters, self._sync_waiters = self._sync_waiters, []
                for _target, callback in waiters:
                    callback(error)
            # (each fsync's waiters were called by the _synced it posted, run before this)
            if self.max_bytes is not None and not self.deleted:
                self.apply_retention()  # between two jobs no sync holds the files
            if self._sync_waiters:
                if self._flush_pending:
                    self.flush()
                self._start_sync()
            elif error is None and self._readers_behind():
                self._start_sync()  # records flushed while this sync ran

        future.add_done_callback(done)

    def _sync_rounds(self, loop: asyncio.AbstractEventLoop) -> int:
        """The worker thread's job: fsync, tell the loop how far that made things
        durable (:meth:`_synced`), and fsync again at once while the loop has flushed
        records a waiter asked for since (:attr:`_sync_wanted`, raised by
        :meth:`sync_log`) -- or does within :data:`SYNC_LINGER`: the group commits
        follow one another without waiting for the loop to run each one's completion
        and start the next (a busy loop took milliseconds, the disk idle meanwhile).
        At most :data:`SYNC_ROUNDS` rounds: then the loop starts the next job, and
        applies retention in between. The last fsync's offset is the result."""
        upto = 0
        for _ in range(SYNC_ROUNDS):
            upto = self.log.sync()
            loop.call_soon_threadsafe(self._synced, upto)
            with self._sync_cond:
                if not self._sync_cond.wait_for(partial(self._sync_more, upto), SYNC_LINGER):
                    break
            if self.deleted or self.log.closed:
                break
        return upto

    def _sync_more(self, upto: int) -> bool:
        """(The sync job's test, under :attr:`_sync_cond`.) A waiter wants records past
        ``upto`` fsynced, or the job has to end (the stream was deleted or closed)."""
        return self._sync_wanted > upto or self.deleted or self.log.closed

    def _synced(self, upto: int) -> None:
        """On the loop: records below ``upto`` are fsynced; their waiters are called,
        in the order they came (their targets only grow)."""
        waiters = self._sync_waiters
        n = 0
        for target, _callback in waiters:
            if target > upto:
                break
            n += 1
        if n:
            done, self._sync_waiters = waiters[:n], waiters[n:]
            for _target, callback in done:
                callback(None)
        if self.deleted:
            return
        if self.read_limit is None:
            self.commit_moved()  # one node: the fsynced position is the commit point
        if self.max_bytes is not None:
            # segments sealed since the last sync may go now (retain waits for their
            # index files, and skips while the job's next fsync holds the files: the
            # job's end tries again)
            self.apply_retention()

    def refuses_publish(self, message: Message) -> bool:
        return False  # no overflow mode on a stream

    def restore(self, message: Message, redelivered: bool, published: int = 0,
                extra: int = 0) -> None:
        raise NotImplementedError("a stream recovers from its own log, not the shared one")

    # -- consuming -------------------------------------------------------------------
    def consume_for(self, consumer: Consumer,
                    answer: Callable[[BaseException | None], None]) -> None:
        """Attach first, then consume-ok: the start offset (``next``: the end of the
        log now) is taken before the client can hear it is registered, as RabbitMQ
        opens the consumer's reader before its consume-ok, so every record published
        after consume-ok reaches it. Attaching delivers nothing at once (it schedules
        a dispatch), so consume-ok still precedes the first delivery."""
        self.add_consumer(consumer)
        answer(None)

    def add_consumer(self, consumer: Consumer) -> None:
        offset = start_offset(consumer.arguments.get(OFFSET_HEADER), self.log, _now_ms())
        assert offset is not None  # check_consume refused the others
        self.readers[consumer] = ReadAhead(self.log, offset, pool_for(self._loop),
                                           self._wake)
        self.consumers.append(consumer)
        self.vhost.schedule_dispatch(self)

    def _wake(self) -> None:
        """A read-ahead landed: dispatch it."""
        if self.consumers and not self.deleted:
            self.vhost.schedule_dispatch(self)

    def remove_consumer(self, consumer: Consumer) -> None:
        reader = self.readers.pop(consumer, None)
        if reader is not None:
            reader.close()
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass

    def dispatch(self) -> None:
        """Each consumer reads from its own position as far as its credit goes (one
        behind gets nothing now: its read-ahead is queued and wakes the stream). The
        records go out as stored, cut into deliveries by compiled code
        (:func:`amqpd.broker.stream_records.deliver_stored`)."""
        limit = self.read_limit() if self.read_limit is not None else -1
        loop = self._loop
        # without a loop (sans-IO tests) nothing would run the next round: no budget
        budget = DISPATCH_BYTES if loop is not None else 1 << 62
        consumers = self.consumers
        # each round starts one consumer further on, so a round the budget ends early
        # does not always pass over the same ones
        start = self._dispatch_start % len(consumers) if consumers else 0
        self._dispatch_start = start + 1
        for consumer in consumers[start:] + consumers[:start]:
            reader = self.readers.get(consumer)
            if reader is None:
                continue
            if budget <= 0:
                break
            while consumer.can_receive() and budget > 0:
                # a consumer with no prefetch of its own is another node's (its
                # channel's credit is the limit: can_receive)
                credit = consumer.prefetch - consumer.unacked if consumer.prefetch \
                    else READ_BATCH
                if limit >= 0 and credit > limit - reader.offset:
                    credit = limit - reader.offset
                if credit <= 0:
                    break
                data, at, count = reader.peek(min(credit, READ_BATCH))
                if not count:
                    break
                count = min(count, credit)
                # stops early past a gap retention made (what lies beyond waits for
                # the commit) or when the consumer cannot take more
                end, sent = deliver_stored(self, consumer, data, at, count, limit,
                                           self._amqp10_message)
                reader.take(sent, end)
                budget -= end - at
                if sent < count:
                    break
        if budget <= 0 and loop is not None and not self._redispatch_due:
            # the others' turn comes once this round's deliveries are written
            self._redispatch_due = True
            loop.call_soon(self._redispatch)

    def _redispatch(self) -> None:
        """The next dispatch round, after the connections' flushes the last one
        scheduled (the loop runs callbacks in order)."""
        self._redispatch_due = False
        if not self.deleted:
            self.vhost.schedule_dispatch(self)

    def _amqp10_message(self, payload: bytes, offset: int) -> Message:
        """A record a stream-protocol client published, as its AMQP 0-9-1 delivery."""
        return decode_record(Record(offset, 0, False, payload, True), self.name)

    def take(self) -> QueueEntry | None:
        return None  # deliveries come from each consumer's reader (dispatch)

    def fetch(self) -> QueueEntry | None:
        raise NotImplemented_(f"basic.get not supported by stream queues queue "
                              f"'{self.name}' in vhost '{self.vhost.name}'")

    def delivered(self, entry: QueueEntry, acked: bool) -> None:
        """The delivery is written (its bytes are in the connection's output). An ack
        only returns credit (:meth:`settle` counts entries), so the message is never
        needed again: the entry lets it go, for an owner that keeps entries until the
        ack (a consumer on another node, through the link) rather than
        :meth:`shared_unacked`. With 20 consumers at a prefetch of 1,000 that is 20,000
        bodies (20 MB of 1 KiB messages) the node need not hold."""
        self.stat_deliver += 1
        self.unacked_count += 1
        entry.message = _DELIVERED

    def shared_unacked(self, consumer: Consumer) -> Unacked | None:
        """An ack only returns credit (:meth:`settle` counts): a channel keeps this one
        record for each of ``consumer``'s deliveries rather than one per delivery."""
        return Unacked(self, QueueEntry(_DELIVERED, -1), consumer)

    def settle(self, entries: Iterable[QueueEntry]) -> None:
        """An ack only gives credit back (the channel did): the record stays."""
        n = len(entries) if isinstance(entries, list) else sum(1 for _ in entries)
        self.unacked_count -= n
        self.stat_ack += n
        if self.consumers:
            self.vhost.schedule_dispatch(self)

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        """Deliveries given up (the channel closed): the consumer's credit came back and
        its reader has moved on; nothing is put back."""
        self.settle(entries)

    def reject(self, entries: list[QueueEntry]) -> None:
        self.settle(entries)  # refused before it gets here (check_return) for clients

    def purge(self) -> int:
        raise NotImplemented_(f"queue.purge not supported by stream queues queue "
                              f"'{self.name}' in vhost '{self.vhost.name}'")

    # -- end of life -----------------------------------------------------------------
    def delete(self) -> None:
        """Consumers are told (basic.cancel); the stream's directory goes."""
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        for consumer in list(self.consumers):
            self.consumers.remove(consumer)
            consumer.channel.consumer_cancelled_by_server(consumer)
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()
        for _target, callback in self._sync_waiters:
            callback(None)
        self._sync_waiters.clear()
        self.log.destroy()

    def shutdown(self) -> None:
        """Broker shutdown: flush, fsync and close the files."""
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        if not self.log.closed:
            self.log.flush()
            self.log.sync()
            self.log.close()


register_queue_type(StreamQueue)


def stream_directory(data_dir: Path, vhost: str, name: str) -> Path:
    """Where a stream's segments live: a digest of its vhost and name (any characters,
    any length), with ``stream.json`` inside naming it for people."""
    digest = hashlib.sha256(f"{vhost}\x00{name}".encode()).hexdigest()[:32]
    return data_dir / "streams" / digest


def _then_committed(gate: Callable[[int, Callable[[BaseException | None], None]], None],
                    upto: int, callback: Callable[[BaseException | None], None]
                    ) -> Callable[[BaseException | None], None]:
    """``callback`` once the fsync went well and ``gate`` says the records below
    ``upto`` are committed (a replicated stream's majority)."""
    def synced(error: BaseException | None) -> None:
        if error is not None:
            callback(error)
        else:
            gate(upto, callback)
    return synced


# what an entry delivered from a stream holds instead of its message (:meth:`delivered`)
_DELIVERED = Message("", "", b"\x00\x00", b"", persistent=True)


def _removed(queue: QueueType) -> None:
    queue.vhost.broker.publisher.own_log_queues -= 1


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["OFFSET_HEADER", "QUEUE_ARGUMENTS", "StreamQueue", "decode_payload", "decode_record",
           "encode_payload", "parse_duration", "start_offset", "stream_directory",
           "validate_stream_arguments", "with_offset_header"]


def _channel_name(consumer: Consumer) -> str | None:
    """The consumer's channel as the management API names channels ("<connection>
    (<number>)"), so a stream consumer's position can be matched to its channel; None
    for a consumer no AMQP channel owns."""
    ch = consumer.local
    return f"{ch.session.name} ({ch.number})" if ch is not None else None
