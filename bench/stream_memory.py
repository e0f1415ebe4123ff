"""A broker's resident memory with a stream queue, at rest and under stream consumers
(issue 30's "RSS <= 0.2x RabbitMQ's and flat in the number of consumers").

    python -m bench.stream_memory [--broker amqpd|rabbitmq] [--messages 100000] \\
        [--body 1024] [--consumers 1,20] [--runs 3] [--out bench/RESULTS-stream-memory.json]

Each run starts a fresh broker (amqpd: the Python running this script, so the build
installed in its virtualenv, compiled or pure; rabbitmq: Debian's RabbitMQ 3.10.8 as
bench/streams.py starts it, its ``beam.smp`` measured), declares one stream,
publishes ``--messages`` persistent messages of ``--body`` bytes with confirms, then reads
``/proc/PID/smaps_rollup`` after a second at rest; then, for each count in
``--consumers``, that many consumers at offsets spread evenly over the stream read it
to the end (bench/streams.py's consumers, checked for order and gaps), with the RSS
sampled every 0.1 s (peak) and ``smaps_rollup`` read once they are done and gone.
Anonymous memory (``Anonymous``) is the process's own; file pages (``Rss -
Anonymous``) are the interpreter's and its extensions' code and data. Last, for amqpd,
one request to the management API (``GET /api/overview``) and ``smaps_rollup`` once
more: amqpd loads the API's modules at its first connection (amqpd/http/listener.py),
so this is what a broker that is asked over HTTP carries.
The medians over ``--runs`` runs are printed; ``--out`` keeps every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.brokers import AmqpdBroker, Broker, RabbitBroker, Sampler
from bench.streams import _consume, _declare, _publish

FIELDS = ("Rss", "Anonymous", "Pss_File")


def smaps(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup``'s Rss, Anonymous and Pss_File, in bytes."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            out[key] = int(rest.split()[0]) * 1024
    return out


def _http_get(broker: AmqpdBroker, path: str) -> int:
    """One management API request (the broker's first): its HTTP status."""
    import base64
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", broker.proc.http_port, timeout=60)
    try:
        auth = base64.b64encode(b"guest:guest").decode()
        conn.request("GET", path, headers={"Authorization": f"Basic {auth}"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def one_run(kind: str, n: int, body: int, consumer_counts: list[int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="amqpd-mem-") as tmp:
        broker: Broker = AmqpdBroker(Path(tmp)) if kind == "amqpd" else RabbitBroker(Path(tmp))
        broker.start()
        try:
            _declare(broker)
            assert broker.pid is not None
            started = smaps(broker.pid)
            _publish(broker, n, body)
            with Sampler(broker.pid, interval=0.1):
                time.sleep(1.0)  # a measurement window, not synchronisation
            out: dict[str, Any] = {"started": started, "rest": smaps(broker.pid)}
            for k in consumer_counts:
                res = _consume(broker, [i * n // k for i in range(k)], n, 2 if k > 1 else 1)
                out[f"consumers_{k}"] = {"rss_peak": res["rss_peak"],
                                         "after": smaps(broker.pid)}
            if isinstance(broker, AmqpdBroker) and broker.proc.http_port:
                if _http_get(broker, "/api/overview") != 200:
                    raise RuntimeError("GET /api/overview failed")
                time.sleep(0.5)  # a measurement window, not synchronisation
                out["after_http"] = smaps(broker.pid)
            return out
        finally:
            broker.stop()


def _mb(x: float) -> str:
    return f"{x / 1e6:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", choices=("amqpd", "rabbitmq"), default="amqpd")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--body", type=int, default=1024)
    p.add_argument("--consumers", default="1,20")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    counts = [int(c) for c in a.consumers.split(",") if c]
    runs = [one_run(a.broker, a.messages, a.body, counts) for _ in range(a.runs)]
    if a.out:
        Path(a.out).write_text(json.dumps(runs, indent=1))

    def med(get: Any) -> str:
        return _mb(statistics.median(get(r) for r in runs))

    print(f"{a.broker}: MB, median of {len(runs)} runs: Rss (Anonymous)")
    print(f"  started, empty stream:  {med(lambda r: r['started']['Rss'])} "
          f"({med(lambda r: r['started']['Anonymous'])})")
    print(f"  at rest after publish:  {med(lambda r: r['rest']['Rss'])} "
          f"({med(lambda r: r['rest']['Anonymous'])})")
    for k in counts:
        key = f"consumers_{k}"
        print(f"  {k} consumers: peak {med(lambda r, key=key: r[key]['rss_peak'])}, "
              f"after {med(lambda r, key=key: r[key]['after']['Rss'])} "
              f"({med(lambda r, key=key: r[key]['after']['Anonymous'])})")
    if all("after_http" in r for r in runs):
        print(f"  after one HTTP API request: {med(lambda r: r['after_http']['Rss'])} "
              f"({med(lambda r: r['after_http']['Anonymous'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
