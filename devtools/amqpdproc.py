"""Start, stop and restart an amqpd process on fixed free loopback ports (for the
conformance report and benchmarks), the same way devtools.rabbitmq does for RabbitMQ:

    python -m devtools.amqpdproc start --dir /tmp/a    # prints {"amqp_url", "http_url", ...}
    python -m devtools.amqpdproc start --dir /tmp/a --workers 2   # a multi-worker node
    python -m devtools.amqpdproc restart --dir /tmp/a  # same ports, data and workers
    python -m devtools.amqpdproc stop --dir /tmp/a

The state (ports, pid) lives in DIR/amqpd.json; data in DIR/data; output in DIR/amqpd.out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devtools.rabbitmq import _amqp_ready, _pid_alive, free_ports

STATE = "amqpd.json"


def _spawn(d: Path, amqp_port: int, http_port: int, timeout: float,
           workers: int | None = None) -> dict[str, object]:
    """Start amqpd; ``workers`` None leaves the setting to the environment and the
    defaults (``AMQPD_WORKERS``), a number passes ``--workers`` (docs/workers.md)."""
    out = open(d / "amqpd.out", "ab")  # noqa: SIM115 - handed to the child
    extra = [] if workers is None else ["--workers", str(workers)]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "amqpd", "--bind", "127.0.0.1", "--port", str(amqp_port),
             "--http-port", str(http_port), "--data-dir", str(d / "data"),
             "--log-level", "warning", *extra],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            cwd=os.getcwd())
    finally:
        out.close()
    state: dict[str, object] = {
        "amqp_url": f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F",
        "http_url": f"http://127.0.0.1:{http_port}", "pid": proc.pid, "dir": str(d),
        "amqp_port": amqp_port, "http_port": http_port, "workers": workers,
    }
    (d / STATE).write_text(json.dumps(state, sort_keys=True) + "\n")
    deadline = time.monotonic() + timeout
    while not _amqp_ready(amqp_port):
        if proc.poll() is not None:
            raise RuntimeError(f"amqpd exited with {proc.returncode}; see {d / 'amqpd.out'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"amqpd did not accept AMQP within {timeout:.0f} s")
        time.sleep(0.1)
    return state


def start(directory: str | os.PathLike[str], timeout: float = 30,
          workers: int | None = None) -> dict[str, object]:
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    amqp_port, http_port = free_ports(2)
    return _spawn(d, amqp_port, http_port, timeout, workers)


def _load(d: Path) -> dict[str, object]:
    return dict(json.loads((d / STATE).read_text()))


def stop(directory: str | os.PathLike[str], timeout: float = 30) -> None:
    d = Path(directory).resolve()
    pid = int(str(_load(d)["pid"]))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.05)


def restart(directory: str | os.PathLike[str], timeout: float = 30) -> dict[str, object]:
    """Stop gracefully, start again on the same ports with the same data directory (and
    the same ``workers``)."""
    d = Path(directory).resolve()
    state = _load(d)
    stop(d, timeout)
    workers = state.get("workers")
    return _spawn(d, int(str(state["amqp_port"])), int(str(state["http_port"])), timeout,
                  None if workers is None else int(str(workers)))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.amqpdproc", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=("start", "stop", "restart"))
    ap.add_argument("--dir", required=True)
    ap.add_argument("--workers", type=int, default=None,
                    help="start: the node's workers (restart keeps what start was given)")
    args = ap.parse_args(argv)
    if args.cmd == "stop":
        stop(args.dir)
        return 0
    state = (start(args.dir, workers=args.workers) if args.cmd == "start"
             else restart(args.dir))
    print(json.dumps(state, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
