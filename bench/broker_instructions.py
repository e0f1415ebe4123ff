"""Instructions a real broker process executes per published message, over a real socket.

    python -m bench.broker_instructions [--python VENV/bin/python] [--messages 50000]
                                        [--runs 3] [--body 16]

``bench.core_cost --callgrind`` counts the core's instructions sans-IO; this counts the
whole process (uvloop, socket reads, the session, the queue, the collector, whatever a
module imported at start-up changes), for the ``publish`` scenario's shape: transient
16-byte messages from one pika connection to a queue with no consumer. The broker runs
under valgrind's callgrind with instrumentation off; after a warm-up of 5,000 messages
it is switched on (``callgrind_control -i on``), ``--messages`` more are published, the
queue's depth is polled until the broker holds them all, and the counters are dumped.

On this shared 2-core box the socket benchmark's broker CPU per message moves by 10-20 %
from run to run with the load; instruction counts move by well under 1 %, so two builds
(or two versions of one module swapped in an editable checkout) compare exactly. They say
nothing about cache misses or time spent waiting. How the broker's reads batch the
client's frames can change the count a little (valgrind slows the broker ~50x, so its
reads are always full): compare runs made the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 5000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, ready: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def measure(python: str, messages: int, body_size: int, work: Path) -> float:
    """One broker start: instructions per message over ``messages`` publishes."""
    import pika  # the load generator's speed does not matter here: only the broker is counted

    port = _free_port()
    data, ready, out = work / "data", work / "ready.json", work / "callgrind.out"
    # the build under test only: a PYTHONPATH (e.g. to run this module from a checkout)
    # would put that checkout's pure-Python sources in front of the build's compiled ones
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AMQPD_PURE_PYTHON")}
    with open(work / "broker.err", "w") as err:
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out}", python, "-m", "amqpd", "--bind", "127.0.0.1",
             "--port", str(port), "--http-port", "0", "--data-dir", str(data),
             "--ready-file", str(ready), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=err, cwd=work, env=env)
    try:
        _wait("the broker's ready file", lambda: ready.exists() or proc.poll() is not None, 300)
        if proc.poll() is not None:
            raise RuntimeError((work / "broker.err").read_text()[-2000:])
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, socket_timeout=600, blocked_connection_timeout=600))
        ch = conn.channel()
        ch.queue_declare("instructions")
        body = b"x" * body_size

        def publish(count: int, total: int) -> None:
            for _ in range(count):
                ch.basic_publish("", "instructions", body)
            _wait("the broker to hold every message",
                  lambda: ch.queue_declare("instructions", passive=True).method.message_count
                  >= total, 600)

        publish(WARMUP, WARMUP)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True,
                       capture_output=True)
        publish(messages, WARMUP + messages)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True,
                       capture_output=True)
        conn.close()
    finally:
        proc.terminate()
        proc.wait(120)
    dump = Path(f"{out}.1")  # part 1: the dump asked for (the final one is part 2)
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1]) / messages
    raise RuntimeError(f"no totals in {dump}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter of the build to measure (its venv's python)")
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--body", type=int, default=16)
    args = parser.parse_args(argv)
    per_run = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="amqpd-instr-") as tmp:
            per_run.append(measure(args.python, args.messages, args.body, Path(tmp)))
    print(json.dumps({"python": args.python, "messages": args.messages, "body": args.body,
                      "instructions_per_message": [round(x, 1) for x in per_run],
                      "median": round(statistics.median(per_run), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
