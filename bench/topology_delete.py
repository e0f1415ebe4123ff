"""Deleting topology costs what is deleted, not what exists (issue 22), in process.

    python -m bench.topology_delete [--existing 10000,100000] [--delete 10000]

For each size E: a broker with a real SharedLog (``fsync="never"``: this measures the
broker's work, not the disk) gets E durable queues in vhost ``/``, each bound to
``amq.topic`` and holding one persistent message, plus a vhost ``doomed`` with
``--delete`` such queues. Timed: deleting ``--delete`` of the queues in ``/`` (the
channel's path: ``VHost.delete_queue_named``), purging as many (E >= 2 x --delete),
and deleting the vhost ``doomed`` (``BrokerAPI.delete_vhost``, what the HTTP API
calls), each followed by the store commit that makes it durable. Flat figures across E
mean linear in what is deleted. No sockets, no client: the AMQP-level declare rates
are ``python -m bench.topology``.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import threading
import time
from pathlib import Path

from amqpd.broker.message import Message
from amqpd.config import Settings
from amqpd.server import Broker
from amqpd.store.log import SharedLog

PROPS = b"\x10\x00\x02"  # delivery-mode = 2 (persistent)


def _sync(store: SharedLog) -> None:
    done = threading.Event()
    store.commit(lambda _exc: done.set())
    done.wait(60)


def _fill(b: Broker, vhost: str, prefix: str, n: int) -> None:
    vh = b.add_vhost(vhost)
    for i in range(n):
        name = f"{prefix}{i}"
        vh.declare_queue(name, durable=True)
        vh.bind("queue", name, "amq.topic", f"k.{name}")
        b.publisher.publish(vh, "", Message("", name, PROPS, b"x" * 16), None)


def run(existing: int, delete: int, no_gc: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="topology-delete-") as tmp:
        settings = Settings()
        settings.persistence = False
        b = Broker(settings)
        store = SharedLog(Path(tmp) / "log", fsync="never")
        store.open()
        b.store = store
        b.definitions.attach(store)
        _fill(b, "/", "q", existing)
        _fill(b, "doomed", "d", delete)
        b.definitions_changed()
        _sync(store)
        vh = b.vhosts["/"]
        out: dict[str, float] = {"existing": existing, "deleted": delete}
        if no_gc:  # tells the cyclic collector's share (it walks every live object)
            gc.collect()
            gc.disable()
        t0 = time.perf_counter()
        for i in range(delete):
            vh.delete_queue_named(f"q{i}")
        _sync(store)
        out["delete_queues_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(delete, 2 * delete):
            vh.purge_queue(f"q{i}")
        _sync(store)
        out["purge_queues_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        b.api.delete_vhost("doomed")
        _sync(store)
        out["delete_vhost_s"] = time.perf_counter() - t0
        store.close()
        gc.enable()
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--existing", default="20000,100000")
    ap.add_argument("--delete", type=int, default=10000)
    ap.add_argument("--no-gc", action="store_true", help="cyclic GC off while timing")
    args = ap.parse_args(argv)
    for e in (int(x) for x in args.existing.split(",")):
        print(json.dumps({**run(e, args.delete, args.no_gc), "no_gc": args.no_gc}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
