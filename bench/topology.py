"""Topology at scale (issue 22): durable declares with bindings, amqpd beside RabbitMQ.

    python -m bench.topology [--sizes 1000,10000,100000] [--declares 1000] [--clients 4]
                             [--routed 50000] [--only amqpd|rabbitmq] [--out FILE]

Both brokers run at once (fresh data dirs); every measurement alternates between them,
``--reps`` times, so load from other processes hits both alike: read the ratio. For
each size S in ascending order:

1. *prefill* to S existing durable queues, each bound to ``amq.topic`` with the key
   ``k.<queue>`` (4 processes, pipelined ``nowait`` declares and binds, then one round
   trip each; not timed as a figure);
2. **one client waiting for each -ok**: a fresh connection declares ``--declares`` new
   durable queues and binds each to ``amq.topic``, one RPC at a time; the figure is
   declare+bind pairs per second. The client's own CPU time is recorded beside it, so
   one can see it is not the limit;
3. **several clients at once**: ``--clients`` processes, released together, each doing
   the same for ``--declares / clients`` queues; the figure is all pairs over the time
   from release to the last -ok.

After the last size (plus the queues the measurements made): **topic routing with
that many bindings** (``--routed`` transient 16-byte messages to ``amq.topic``, keys
drawn from the existing bindings so that each message reaches one queue; one
raw-socket publisher, ended by a round trip), then the
broker's **RSS** with every queue idle, a **graceful restart** (time until an AMQP
connection is accepted) and the RSS after it, and, for amqpd, a **kill -9 restart**.
The memory per idle durable queue is (RSS after the graceful restart - RSS of the same
broker freshly started empty) / queues, bindings included.

The load generator is ``bench.loadgen.Conn`` (raw sockets, pamqp only for these setup
methods); RabbitMQ is Debian's 3.10 through ``devtools.rabbitmq``. Everything is printed
as JSON lines and, with ``--out``, as a markdown table of raw numbers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pamqp import commands

from bench.brokers import AmqpdBroker, Broker, RabbitBroker, cpu_seconds, rss_bytes
from bench.loadgen import Conn, PublisherSpec, Target, run_publisher

PREFILL_PROCS = 4


def _prefill_part(url: str, names: list[str]) -> None:
    conn = Conn(url, timeout=600.0)
    ch = conn.open_channel(1)
    for i in range(0, len(names), 500):
        frames: list[Any] = []
        for name in names[i:i + 500]:
            frames.append(commands.Queue.Declare(queue=name, durable=True, nowait=True))
            frames.append(commands.Queue.Bind(queue=name, exchange="amq.topic",
                                              routing_key=f"k.{name}", nowait=True))
        conn.send(ch, *frames)
        # one round trip per batch: nowait work is done, socket buffers stay small
        conn.rpc(ch, commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)
    conn.close(timeout=120.0)


def prefill(url: str, start: int, end: int) -> None:
    names = [f"pre-{i}" for i in range(start, end)]
    parts = [names[k::PREFILL_PROCS] for k in range(PREFILL_PROCS)]
    procs = [mp.Process(target=_prefill_part, args=(url, p)) for p in parts if p]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"prefill process failed with {p.exitcode}")


def _declare_loop(url: str, prefix: str, n: int, go: Any, out: Any) -> None:
    conn = Conn(url, timeout=120.0)
    ch = conn.open_channel(1)
    if go is not None:
        go.wait()
    cpu0 = time.process_time()
    t0 = time.monotonic()
    for i in range(n):
        name = f"{prefix}-{i}"
        conn.declare_queue(ch, name, durable=True)
        conn.bind(ch, name, "amq.topic", f"k.{name}")
    t1 = time.monotonic()
    out.put((t0, t1, n, time.process_time() - cpu0))
    conn.close()


def one_client(url: str, prefix: str, n: int) -> dict[str, float]:
    q: Any = mp.Queue()
    p = mp.Process(target=_declare_loop, args=(url, prefix, n, None, q))
    p.start()
    t0, t1, done, cpu = q.get(timeout=3600)
    p.join()
    return {"pairs": done, "seconds": t1 - t0, "rate": done / (t1 - t0),
            "client_cpu_s": cpu}


def many_clients(url: str, prefix: str, n: int, clients: int) -> dict[str, float]:
    q: Any = mp.Queue()
    go = mp.Event()
    each = max(1, n // clients)
    procs = [mp.Process(target=_declare_loop, args=(url, f"{prefix}c{k}", each, go, q))
             for k in range(clients)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every client connect before the release
    go.set()
    res = [q.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    t0 = min(r[0] for r in res)
    t1 = max(r[1] for r in res)
    total = sum(r[2] for r in res)
    return {"pairs": total, "seconds": t1 - t0, "rate": total / (t1 - t0),
            "client_cpu_s": sum(r[3] for r in res), "clients": clients}


def routing(url: str, keys: list[str], count: int) -> dict[str, float]:
    rnd = random.Random(7)
    targets = [Target("amq.topic", k) for k in rnd.sample(keys, min(len(keys), 20000))]
    spec = PublisherSpec(pubid=1, targets=targets, count=count, body_size=16)
    res = run_publisher(url, spec)
    if res.error:
        raise RuntimeError(res.error)
    secs = res.t_end - res.t_start if res.t_start else 0.0
    return {"published": res.published, "seconds": secs,
            "rate": res.published / secs if secs else 0.0, "client_cpu_s": res.cpu}


def settled_rss(pid: int | None, seconds: float = 3.0) -> int:
    time.sleep(seconds)
    return rss_bytes(pid or 0)


def run_side_by_side(brokers: list[Broker], sizes: list[int], declares: int, clients: int,
                     routed: int, reps: int, restart: bool = True) -> list[dict[str, Any]]:
    """Both brokers run at once; each measurement alternates between them, ``reps``
    times, so a noisy neighbour hits both alike (the ratio is the figure to read)."""
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    def timed(b: Broker, fn: Any, *args: Any) -> dict[str, Any]:
        """fn's figures plus the broker's own CPU seconds meanwhile (beam.smp: all its
        scheduler threads), to tell a disk-bound rate from a CPU-bound one."""
        cpu0 = cpu_seconds(b.pid or 0)
        out: dict[str, Any] = fn(*args)
        out["broker_cpu_s"] = cpu_seconds(b.pid or 0) - cpu0
        return out

    empty: dict[str, int] = {}
    for b in brokers:
        b.start()
        empty[b.name] = settled_rss(b.pid)
        emit({"broker": b.name, "what": "rss_empty", "rss_bytes": empty[b.name]})
    existing = 0
    keys: list[str] = []
    created = 0
    for size in sizes:
        for b in brokers:
            t0 = time.monotonic()
            prefill(b.url, existing, size)
            emit({"broker": b.name, "what": "prefill", "size": size,
                  "seconds": time.monotonic() - t0})
        keys += [f"k.pre-{i}" for i in range(existing, size)]
        existing = size
        for rep in range(reps):
            for b in brokers:
                emit({"broker": b.name, "what": "one_client", "size": existing + created,
                      "rep": rep, **timed(b, one_client, b.url, f"one{size}r{rep}",
                                          declares)})
            created += declares
            for b in brokers:
                emit({"broker": b.name, "what": "many_clients", "size": existing + created,
                      "rep": rep, **timed(b, many_clients, b.url, f"many{size}r{rep}",
                                          declares, clients)})
            created += declares
    total = existing + created
    if routed:
        for rep in range(reps):
            for b in brokers:
                emit({"broker": b.name, "what": "topic_routing", "bindings": total,
                      "rep": rep, **timed(b, routing, b.url, keys, routed)})
        for b in brokers:
            purge_all(b.url, keys)
    for b in brokers:
        emit({"broker": b.name, "what": "rss_loaded", "queues": total,
              "rss_bytes": settled_rss(b.pid)})
    for b in brokers:
        if not restart:
            b.stop()
            continue
        t = b.restart()
        rss_after = settled_rss(b.pid)
        emit({"broker": b.name, "what": "restart", "queues": total, "seconds": t,
              "rss_bytes": rss_after,
              "bytes_per_queue": round((rss_after - empty[b.name]) / total)})
        if isinstance(b, AmqpdBroker):
            assert b.proc.proc is not None
            b.proc.kill()
            t = b.start()
            emit({"broker": b.name, "what": "restart_after_kill9", "queues": total,
                  "seconds": t, "rss_bytes": settled_rss(b.pid)})
        check = Conn(b.url)
        ch = check.open_channel(1)
        ok = check.rpc(ch, commands.Queue.Declare(queue=f"pre-{existing - 1}", passive=True),
                       commands.Queue.DeclareOk)
        del ok
        check.close()
        b.stop()
    return rows


def purge_all(url: str, keys: list[str]) -> None:
    """Empty the queues the routing run filled, so RSS counts idle queues only."""
    conn = Conn(url, timeout=600.0)
    ch = conn.open_channel(1)
    rnd = random.Random(7)
    for key in rnd.sample(keys, min(len(keys), 20000)):
        conn.rpc(ch, commands.Queue.Purge(queue=key[2:]), commands.Queue.PurgeOk)
    conn.close()


def to_markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| broker | what | size / queues | figure | raw |", "|---|---|---|---|---|"]
    for r in rows:
        what = r["what"]
        size = r.get("size", r.get("queues", r.get("bindings", "")))
        if "rate" in r:
            fig = f"{r['rate']:.0f}/s"
        elif what.startswith("restart"):
            fig = f"{r['seconds']:.2f} s, RSS {r['rss_bytes'] / 2**20:.0f} MiB"
        elif "rss_bytes" in r:
            fig = f"RSS {r['rss_bytes'] / 2**20:.0f} MiB"
        else:
            fig = f"{r.get('seconds', 0):.1f} s"
        raw = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
               if k not in ("broker", "what")}
        out.append(f"| {r['broker']} | {what} | {size} | {fig} | `{json.dumps(raw)}` |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--declares", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--routed", type=int, default=50000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-restart", action="store_true", help="skip the restarts")
    ap.add_argument("--only", choices=("amqpd", "rabbitmq"))
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="topology-bench-") as tmp:
        work = Path(tmp)
        brokers: list[Broker] = []
        if args.only != "rabbitmq":
            brokers.append(AmqpdBroker(work / "a"))
        if args.only != "amqpd":
            brokers.append(RabbitBroker(work / "r"))
        rows = run_side_by_side(brokers, sizes, args.declares, args.clients, args.routed,
                                args.reps, not args.no_restart)
    md = to_markdown(rows)
    print(md)
    if args.out:
        Path(args.out).write_text(md)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
