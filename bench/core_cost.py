"""What one message costs the broker's core, measured without sockets or an event loop.

    python -m bench.core_cost [--body 1024] [--messages 60000] [--batch 60] [--repeat 5]
    python -m bench.core_cost --callgrind [--body 1024] [--messages 6000]
    python -m bench.core_cost --confirms [--body 16] [--callgrind | --fsync-split]
    python -m bench.core_cost --publish-only [--body 16] [--callgrind]
    python -m bench.core_cost --stream [--body 1024] [--tick-reads 4] [--callgrind]

The socket benchmarks (``python -m bench``) need a quiet machine: on a shared one the
broker, the load generator and everybody else's processes fight for the same cores and
their rates move by 10-40 % between runs. This drives the real code instead, sans-IO,
the way tests/unit/protocol/peer.py does: a real :class:`~amqpd.server.Broker` with the
shared log open, one publishing and one consuming :class:`~amqpd.session.Session`, fed
``--batch`` publish triplets per read (60 x 1 KiB is about what one 64 KiB read holds),
the queue dispatched after each read and the consumer's deliveries acked with one
``multiple`` ack (prefetch 1000), as the pubsub scenarios do. What it leaves out is the
transport (uvloop, socket reads and writes) and the per-tick callbacks.

``--confirms`` is the ``confirms`` scenario's shape instead: persistent messages to a
durable queue, the publisher in confirm mode. Its per-tick callbacks matter (the group
commit, the coalesced acks, the DELIVERED marks), so a small stand-in for the event loop
runs them after each read, and each batch waits for its group commit (write and
fdatasync in the store's writer thread) to come back confirmed before the consumer's
deliveries are read: one fsync per ``--batch`` messages. ``--fsync-split`` runs that
shape twice, with the store's fsync on and off, and prints both (CPU µs and wall µs per
message): what the fsync itself costs beside the per-message work.

``--publish-only`` is the ``publish`` scenario's shape: transient publish triplets, the
same ``--batch`` per read, to a queue with no consumer, which grows for the whole run
(the queue is dispatched after each read, as the event loop would, and finds nobody).
The cyclic collector is tuned as the broker tunes it (``server.tune_gc``): every queued
message is a tracked object, and what the collector costs depends on its thresholds.
Use ``--messages`` of 20000 or more with ``--callgrind`` so young collections (one per
~25,000 messages) fall into the difference of the two runs.

``--stream`` is ``python -m bench.streams --publish-only``'s shape: persistent publishes
with confirms into a stream queue (``x-queue-type: stream``), ``--tick-reads`` reads of
``--batch`` publishes per event-loop tick (4 x 60 ~ the 255 messages per tick a
publisher with 1,000 confirms in flight gave the broker there), then the tick's
callbacks: the stream's flush (one ``pwrite``), the publisher's commit (the stream's
sync job in a worker thread, the shared store's commit) and the coalesced acks, which
wait for the fsync (:meth:`~amqpd.broker.stream.StreamQueue._sync_rounds`) as a confirm
does. One fsync per tick; the next tick starts when the last one's acks went out.

Two figures:

* the default run prints the process CPU time per message (``--repeat`` runs; the
  minimum is the least disturbed by other processes);
* ``--callgrind`` runs the same loop twice under valgrind's callgrind, with N and 3N
  messages, and prints the instructions per message (the difference over 2N, so start-up
  and imports cancel out) with the functions that take most of them. Instruction counts
  do not depend on the machine's load: two builds compare exactly, run after run.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.server import Broker
    from tests.unit.protocol.peer import Pair


class _Ticks:
    """The event loop's part in the confirms shape: ``call_soon`` queues a callback,
    :meth:`run` runs everything queued (the end of a tick); the store's writer thread
    hands its commit callbacks back through ``call_soon_threadsafe`` and wakes
    :meth:`wait`."""

    def __init__(self) -> None:
        import collections
        import threading

        self.ready: collections.deque = collections.deque()
        self.woken = threading.Event()

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.ready.append((callback, args))

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> None:
        self.ready.append((callback, args))  # deque.append is atomic
        self.woken.set()

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:
        """A worker thread's job (a stream's sync job): its future's done callbacks
        come back through :meth:`call_soon_threadsafe`, as asyncio's would."""
        import concurrent.futures

        if not hasattr(self, "pool"):
            self.pool = concurrent.futures.ThreadPoolExecutor(2)
        return _LoopFuture(self, self.pool.submit(func, *args))

    def close(self) -> None:
        if hasattr(self, "pool"):
            self.pool.shutdown()

    def run(self) -> None:
        ready = self.ready
        while ready:
            callback, args = ready.popleft()
            callback(*args)

    def wait(self, timeout: float) -> bool:
        woken = self.woken.wait(timeout)
        self.woken.clear()
        return woken


class _LoopFuture:
    """What :meth:`_Ticks.run_in_executor` returns: a thread's future whose done
    callbacks run on the loop (the part of ``asyncio.Future`` the broker uses)."""

    def __init__(self, ticks: _Ticks, future: Any) -> None:
        self.ticks = ticks
        self.future = future

    def add_done_callback(self, callback: Any) -> None:
        self.future.add_done_callback(
            lambda _f: self.ticks.call_soon_threadsafe(callback, self))

    def exception(self) -> BaseException | None:
        return self.future.exception()  # type: ignore[no-any-return]

    def result(self) -> Any:
        return self.future.result()


def run_stream(body_size: int, messages: int, batch: int, tick_reads: int,
               repeat: int) -> list[tuple[float, float]]:
    """(CPU µs, wall µs) per message of each run of the stream shape (module docstring)."""
    from pamqp import commands

    from tests.support import wire
    from tests.unit.protocol.peer import Pair, real_broker

    data_dir = tempfile.mkdtemp(prefix="amqpd-core-cost-")
    try:
        broker = real_broker(persistence=True, data_dir=data_dir, fsync="batch")
        ticks = _Ticks()
        broker._loop = ticks  # type: ignore[assignment]
        broker.publisher.loop = ticks  # type: ignore[assignment]
        broker._open_store()
        publisher = Pair(broker=broker)
        publisher.open()
        publisher.open_channel(1)
        publisher.call(1, commands.Queue.Declare(queue="core-cost", durable=True,
                                                 arguments={"x-queue-type": "stream"}))
        publisher.call(1, commands.Confirm.Select())
        ticks.run()
        stream = broker.vhosts["/"].queues["core-cost"]
        if stream.type_name != "stream":
            raise RuntimeError(f"declared a {stream.type_name} queue, not a stream")
        chunk = wire.publish(1, "", "core-cost", b"\0" * body_size, delivery_mode=2) * batch
        pub = publisher.server
        assert publisher.session is not None
        channel = publisher.session.channels[1]
        per_tick = batch * tick_reads
        tag = 0
        confirmed = 0  # bytes of confirms the publisher was sent
        results = []
        for _ in range(repeat):
            started, wall = time.process_time(), time.perf_counter()
            for _ in range(messages // per_tick):
                for _ in range(tick_reads):
                    pub.receive_data(chunk)
                ticks.run()  # flush, commit: the sync job starts in its thread
                tag += per_tick
                deadline = time.monotonic() + 30
                while channel._acked_upto < tag:
                    if not ticks.wait(max(0.0, deadline - time.monotonic())):
                        raise RuntimeError(f"confirms stopped at {channel._acked_upto}")
                    ticks.run()
                confirmed += len(pub.data_to_send())
            n = messages // per_tick * per_tick
            results.append((1e6 * (time.process_time() - started) / n,
                            1e6 * (time.perf_counter() - wall) / n))
        held = stream.message_count
        if held != tag or not confirmed:
            raise RuntimeError(f"{held} records in the stream for {tag} confirmed "
                               f"publishes ({confirmed} bytes of confirms): the loop lost "
                               "track")
        stream.shutdown()  # type: ignore[attr-defined]
        broker.store.close()
        ticks.close()
        return results
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def run_confirms(body_size: int, messages: int, batch: int, repeat: int,
                 fsync: bool = True) -> list[tuple[float, float]]:
    """(CPU µs, wall µs) per message of each run of the confirms shape."""
    from pamqp import commands

    from tests.support import wire
    from tests.unit.protocol.peer import Pair, real_broker

    data_dir = tempfile.mkdtemp(prefix="amqpd-core-cost-")
    try:
        broker = real_broker(persistence=True, data_dir=data_dir,
                             fsync="batch" if fsync else "never")
        ticks = _Ticks()
        broker._loop = ticks  # type: ignore[assignment]
        broker.publisher.loop = ticks  # type: ignore[assignment]
        broker._open_store()
        publisher, consumer = Pair(broker=broker), Pair(broker=broker)
        for pair in (publisher, consumer):
            pair.open()
            pair.open_channel(1)
        publisher.call(1, commands.Queue.Declare(queue="core-cost", durable=True))
        publisher.call(1, commands.Confirm.Select())
        consumer.call(1, commands.Basic.Qos(prefetch_count=1000))
        consumer.call(1, commands.Basic.Consume(queue="core-cost", consumer_tag="c"))
        ticks.run()
        chunk = wire.publish(1, "", "core-cost", b"\0" * body_size, delivery_mode=2) * batch
        pub, con = publisher.server, consumer.server
        assert publisher.session is not None
        channel = publisher.session.channels[1]
        tag = 0
        delivered = 0
        confirmed = 0  # bytes of confirms the publisher was sent
        results = []
        for _ in range(repeat):
            started, wall = time.process_time(), time.perf_counter()
            for _ in range(messages // batch):
                pub.receive_data(chunk)
                ticks.run()  # dispatch, the tick's group commit handed to the writer
                tag += batch
                deadline = time.monotonic() + 30
                while channel._acked_upto < tag:
                    if not ticks.wait(max(0.0, deadline - time.monotonic())):
                        raise RuntimeError(f"confirms stopped at {channel._acked_upto}")
                    ticks.run()
                confirmed += len(pub.data_to_send())
                delivered += len(con.data_to_send())
                con.receive_data(wire.method(1, commands.Basic.Ack(delivery_tag=tag,
                                                                   multiple=True)))
                ticks.run()
                delivered += len(con.data_to_send())
            n = messages // batch * batch
            results.append((1e6 * (time.process_time() - started) / n,
                            1e6 * (time.perf_counter() - wall) / n))
        left = broker.vhosts["/"].queues["core-cost"].message_count
        if left or delivered < tag * body_size or not confirmed:
            raise RuntimeError(f"{left} messages left in the queue, {delivered} bytes "
                               f"delivered for {tag} messages: the loop lost track")
        broker.store.close()
        return results
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def _transient_setup() -> Iterator[tuple[Broker, Pair]]:
    """The shape the transient runs share: a real broker with the shared log open in a
    temporary directory, and a publishing session on channel 1 that has declared the
    queue ``core-cost``. The store is given an event loop that never runs (it only keeps
    it for callbacks); store and loop are closed after a run that did not fail, and the
    directory is removed in any case."""
    import asyncio

    from pamqp import commands

    from tests.unit.protocol.peer import Pair, real_broker

    data_dir = tempfile.mkdtemp(prefix="amqpd-core-cost-")
    try:
        broker = real_broker(persistence=True, data_dir=data_dir)
        loop = asyncio.new_event_loop()
        broker._loop = loop
        broker._open_store()
        publisher = Pair(broker=broker)
        publisher.open()
        publisher.open_channel(1)
        publisher.call(1, commands.Queue.Declare(queue="core-cost"))
        yield broker, publisher
        broker.store.close()
        loop.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def run_publish_only(body_size: int, messages: int, batch: int, repeat: int) -> list[float]:
    """CPU µs per message of each of ``repeat`` runs: publishes, no consumer."""
    from amqpd.server import tune_gc
    from tests.support import wire

    with _transient_setup() as (broker, publisher):
        chunk = wire.publish(1, "", "core-cost", b"\0" * body_size, delivery_mode=1) * batch
        pub = publisher.server
        tune_gc()  # as the broker does at start-up: the queue grows, the collector walks it
        sent = 0
        results = []
        for _ in range(repeat):
            started = time.process_time()
            for _ in range(messages // batch):
                pub.receive_data(chunk)
                broker._run_dispatch()
                pub.data_to_send()
                sent += batch
            results.append(1e6 * (time.process_time() - started) / (messages // batch * batch))
        held = broker.vhosts["/"].queues["core-cost"].message_count
        if held != sent:
            raise RuntimeError(f"{held} messages in the queue for {sent} published: "
                               "the loop lost track")
    return results


def run_loop(body_size: int, messages: int, batch: int, repeat: int) -> list[float]:
    """CPU µs per message of each of ``repeat`` runs of ``messages`` messages."""
    from pamqp import commands

    from tests.support import wire
    from tests.unit.protocol.peer import Pair

    with _transient_setup() as (broker, publisher):
        consumer = Pair(broker=broker)
        consumer.open()
        consumer.open_channel(1)
        consumer.call(1, commands.Basic.Qos(prefetch_count=1000))
        consumer.call(1, commands.Basic.Consume(queue="core-cost", consumer_tag="c"))
        chunk = wire.publish(1, "", "core-cost", b"\0" * body_size, delivery_mode=1) * batch
        pub, con = publisher.server, consumer.server
        tag = 0
        delivered = 0  # bytes the consumer was sent
        results = []
        for _ in range(repeat):
            started = time.process_time()
            for _ in range(messages // batch):
                pub.receive_data(chunk)
                broker._run_dispatch()
                pub.data_to_send()
                delivered += len(con.data_to_send())
                tag += batch
                con.receive_data(wire.method(1, commands.Basic.Ack(delivery_tag=tag,
                                                                   multiple=True)))
                broker._run_dispatch()
                delivered += len(con.data_to_send())
            results.append(1e6 * (time.process_time() - started) / (messages // batch * batch))
        left = broker.vhosts["/"].queues["core-cost"].message_count
        if left or delivered < tag * body_size:
            raise RuntimeError(f"{left} messages left in the queue, {delivered} bytes "
                               f"delivered for {tag} messages: the loop lost track")
    return results


_LINE = re.compile(r"\s*([\d,]+) \([ \d.]+%\)\s+(.*)$")


def _costs(outfile: Path) -> dict[str, int]:
    """Self instructions per function from a callgrind output file."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=no",
                           str(outfile)], capture_output=True, text=True, check=True).stdout
    costs: dict[str, int] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name = re.sub(r" \[.*\]$", "", m.group(2)).rpartition(":")[2]
        name = re.sub(r"'\d+$", "", name)  # recursion levels
        costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


def callgrind(body_size: int, messages: int, batch: int, top: int,
              confirms: bool = False, publish_only: bool = False,
              stream: bool = False, tick_reads: int = 4) -> int:
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        print("valgrind (callgrind) not found: apt-get install valgrind", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory(prefix="amqpd-callgrind-") as tmp:
        runs = {}
        for n in (messages, 3 * messages):
            out = Path(tmp) / f"callgrind.{n}"
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                            sys.executable, "-m", "bench.core_cost", "--body", str(body_size),
                            "--messages", str(n), "--batch", str(batch), "--repeat", "1",
                            *(["--confirms"] if confirms else []),
                            *(["--publish-only"] if publish_only else []),
                            *(["--stream", "--tick-reads", str(tick_reads)] if stream
                              else [])],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            runs[n] = _costs(out)
    small, big = runs[messages], runs[3 * messages]
    per = {k: (big.get(k, 0) - small.get(k, 0)) / (2 * messages) for k in set(small) | set(big)}
    total = per.pop("PROGRAM TOTALS", 0.0)
    shape = "confirms, " if confirms else "publish-only, " if publish_only else \
        f"stream, {tick_reads} reads per tick, " if stream else ""
    print(f"{shape}body {body_size} B, batch {batch}: {total:,.0f} instructions per message")
    for name, cost in sorted(per.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {cost:8,.0f}  {100 * cost / total:5.1f}%  {name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.core_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--body", type=int, default=1024, help="body size in bytes")
    p.add_argument("--messages", type=int, default=60_000)
    p.add_argument("--batch", type=int, default=60, help="publishes per read")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--callgrind", action="store_true",
                   help="instructions per message under valgrind (load-independent)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--confirms", action="store_true",
                   help="persistent messages, durable queue, publisher confirms (fsync)")
    p.add_argument("--fsync-split", action="store_true",
                   help="with --confirms: the same with the store's fsync on and off")
    p.add_argument("--publish-only", action="store_true",
                   help="transient publishes to a queue with no consumer (it grows)")
    p.add_argument("--stream", action="store_true",
                   help="persistent publishes with confirms into a stream queue")
    p.add_argument("--tick-reads", type=int, default=4,
                   help="with --stream: reads of --batch publishes per event-loop tick")
    args = p.parse_args(argv)
    if args.callgrind:
        return callgrind(args.body, args.messages, args.batch, args.top, args.confirms,
                         args.publish_only, args.stream, args.tick_reads)
    from amqpd import hotpath

    if args.stream:
        runs = run_stream(args.body, args.messages, args.batch, args.tick_reads, args.repeat)
        cpu = sorted(r[0] for r in runs)
        wall = sorted(r[1] for r in runs)
        print(f"stream, body {args.body} B, {args.tick_reads} x {args.batch} publishes per "
              f"tick, {hotpath.MODE}: CPU µs/msg min {cpu[0]:.2f} median "
              f"{cpu[len(cpu) // 2]:.2f}; wall µs/msg min {wall[0]:.2f} median "
              f"{wall[len(wall) // 2]:.2f}")
        return 0

    if args.publish_only:
        results = run_publish_only(args.body, args.messages, args.batch, args.repeat)
        print(f"publish-only, body {args.body} B, batch {args.batch}, {hotpath.MODE}: CPU "
              f"µs/msg min {min(results):.2f} median {sorted(results)[len(results) // 2]:.2f}")
        return 0

    if args.confirms:
        for fsync in (True, False) if args.fsync_split else (True,):
            runs = run_confirms(args.body, args.messages, args.batch, args.repeat, fsync)
            cpu = sorted(r[0] for r in runs)
            wall = sorted(r[1] for r in runs)
            print(f"confirms, body {args.body} B, batch {args.batch}, fsync "
                  f"{'on' if fsync else 'off'}, {hotpath.MODE}: CPU µs/msg min {cpu[0]:.2f}"
                  f" median {cpu[len(cpu) // 2]:.2f}; wall µs/msg min {wall[0]:.2f} median "
                  f"{wall[len(wall) // 2]:.2f}")
        return 0

    results = run_loop(args.body, args.messages, args.batch, args.repeat)
    print(f"body {args.body} B, batch {args.batch}, {hotpath.MODE}: CPU µs/msg "
          f"min {min(results):.2f} median {sorted(results)[len(results) // 2]:.2f} "
          f"(runs: {', '.join(f'{r:.2f}' for r in results)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
