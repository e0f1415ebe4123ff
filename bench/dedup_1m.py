"""A deduplication exchange with a 1,000,000-entry cache, in process, against fanout.

    python -m bench.dedup_1m [N]          (default N = 1,000,000)

Measures, on this machine, what deduplication itself costs in the publish pipeline (no
sockets, no client; the same pre-encoded messages for every exchange):

1. RSS per cached entry: N distinct header values through an unbound memory-cache
   exchange (the messages go nowhere, only the cache grows).
2. Publish rate with the cache full (every new value evicts the oldest) against a plain
   fanout exchange, both bound to one transient queue; and the rate of duplicates.
3. The same with ``x-cache-persistence: disk`` on a durable exchange, persistent messages
   to a durable queue (a real SharedLog, fsync never) against a durable fanout; then the
   restart: how long recovery takes to rebuild the cache from the log.

End-to-end rates with real clients belong to ``python -m bench``; this isolates the
cache's cost per message.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from pathlib import Path

from amqpd.broker.exchanges.dedup import DedupExchange, recover, store_key
from amqpd.broker.message import Message
from amqpd.protocol import codec
from amqpd.server import Broker
from bench.delayed_1m import make_broker, restart, rss_mb


def props_for(start: int, n: int, persistent: bool) -> list[bytes]:
    extra = {"delivery_mode": 2} if persistent else {}
    return [codec.encode_properties({**extra, "headers": {
        "x-deduplication-header": f"order-{i:012d}"}}) for i in range(start, start + n)]


def publish_rate(b: Broker, exchange: str, props: list[bytes], persistent: bool) -> float:
    vh = b.vhosts["/"]
    publish = b.publisher.publish
    body = b"x" * 16
    t0 = time.perf_counter()
    for p in props:
        publish(vh, exchange, Message(exchange, "", p, body, persistent=persistent), None)
    return len(props) / (time.perf_counter() - t0)


def purge(b: Broker, queue: str) -> None:
    b.vhosts["/"].queues[queue].purge()


async def run(n: int, m: int) -> None:
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="dedup-bench-") as tmp:
        data = Path(tmp)
        b = make_broker(data, loop)
        assert b.store is not None
        b.store.open()
        vh = b.vhosts["/"]
        print(f"preparing {n + 2 * m:,} distinct header values...")
        fill = props_for(0, n, False)
        fresh = props_for(n, m, False)

        # 1. memory per cached entry
        vh.declare_exchange("dm", "x-message-deduplication", arguments={"x-cache-size": n})
        ex = vh.exchanges["dm"]
        assert isinstance(ex, DedupExchange)
        gc.collect()
        r0 = rss_mb()
        rate_fill = publish_rate(b, "dm", fill, False)
        gc.collect()
        grown = rss_mb() - r0
        print(f"cache of {len(ex.cache):,} entries: RSS +{grown:.0f} MB "
              f"({grown * 2**20 / len(ex.cache):.0f} B/entry); filled at {rate_fill:,.0f} msg/s")

        # 2. transient: full cache vs fanout, one transient queue each
        vh.declare_queue("q")
        vh.bind("queue", "q", "dm", "")
        vh.declare_exchange("fx", "fanout")
        vh.bind("queue", "q", "fx", "")
        rate_dedup = publish_rate(b, "dm", fresh, False)
        purge(b, "q")
        rate_fanout = publish_rate(b, "fx", fresh, False)
        purge(b, "q")
        rate_dups = publish_rate(b, "dm", fresh, False)  # all seen: none routed
        assert b.vhosts["/"].queues["q"].message_count == 0
        print(f"transient, 16-byte body, {m:,} msgs: dedup (cache full, evicting) "
              f"{rate_dedup:,.0f} msg/s, fanout {rate_fanout:,.0f} msg/s "
              f"({rate_dedup / rate_fanout:.0%}); duplicates dropped {rate_dups:,.0f} msg/s")

        # 3. disk persistence, persistent messages, durable queue
        vh.declare_exchange("dd", "x-message-deduplication", durable=True, arguments={
            "x-cache-size": n, "x-cache-persistence": "disk"})
        vh.declare_queue("dq", durable=True)
        vh.bind("queue", "dq", "dd", "")
        vh.declare_exchange("df", "fanout", durable=True)
        vh.bind("queue", "dq", "df", "")
        pfresh = props_for(n + m, m, True)
        rate_disk = publish_rate(b, "dd", pfresh, True)
        purge(b, "dq")
        rate_dfan = publish_rate(b, "df", pfresh, True)
        purge(b, "dq")
        b.store.commit(lambda _e: None)
        await asyncio.sleep(0.5)
        print(f"persistent to a durable queue, {m:,} msgs: dedup disk {rate_disk:,.0f} msg/s, "
              f"fanout {rate_dfan:,.0f} msg/s ({rate_disk / rate_dfan:.0%})")
        b.store.close()

        # 4. restart: rebuild the disk cache from the log
        b2, ex2, open_s, rebuild_s = restart(data, loop, "dd", "x-message-deduplication", {
            "x-cache-size": n, "x-cache-persistence": "disk"}, recover, store_key("/", "dd"))
        assert isinstance(ex2, DedupExchange)
        print(f"restart: log open {open_s:.1f} s, cache of {len(ex2.cache):,} entries "
              f"rebuilt in {rebuild_s:.1f} s")
        assert b2.store is not None
        b2.store.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.dedup_1m",
                                 description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("n", nargs="?", type=int, default=1_000_000,
                    help="cache size, and values to fill it with (default 1,000,000)")
    ap.add_argument("--messages", type=int, default=200_000,
                    help="messages per rate measurement (default 200,000)")
    args = ap.parse_args(argv)
    asyncio.run(run(args.n, args.messages))


if __name__ == "__main__":
    main()
