"""fdatasync latency of the log's write pattern on this machine's disk, without amqpd
(issue 34: what a node alone and a synchronous pair pay the disk for one group commit).

Each writer thread loops for ``--seconds``: write one chunk (``--chunk`` bytes, about
one group commit of 100-byte messages at full speed), then ``fdatasync``. Patterns:

``append``    the file grows with every write, as amqpd's segments do: each fdatasync
              must also make the new size durable (on ext4 a journal commit);
``prealloc``  the file is first filled with zeros (64 MiB) and fsync'd, then
              overwritten in place, from the start again when the end is reached:
              each fdatasync has only data blocks to flush.

With ``1`` and ``2`` writers (two files in one directory, as the active's and the
standby's logs on one machine). Figures are per fdatasync call, in ms; nothing is
asserted. Usage: ``python -m bench.fsync_micro [--dir /tmp] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time


def _writer(path: str, pattern: str, seconds: float, chunk_size: int,
            out: list[list[float]]) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = b"x" * chunk_size
        size = 64 << 20
        if pattern == "prealloc":
            zeros = b"\0" * (1 << 20)
            for _ in range(size >> 20):
                os.write(fd, zeros)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        lat: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if pattern == "prealloc" and os.lseek(fd, 0, os.SEEK_CUR) + chunk_size > size:
                os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, chunk)
            t = time.monotonic()
            os.fdatasync(fd)
            lat.append(time.monotonic() - t)
        out.append(lat)
    finally:
        os.close(fd)
        os.unlink(path)


def measure(directory: str, pattern: str, writers: int, seconds: float,
            chunk_size: int) -> dict[str, float]:
    outs: list[list[float]] = []
    threads = [threading.Thread(target=_writer, args=(
        os.path.join(directory, f"{pattern}-{i}"), pattern, seconds, chunk_size, outs))
        for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = sorted(x * 1e3 for o in outs for x in o)
    return {"fsyncs": len(lat), "p50_ms": round(lat[len(lat) // 2], 3),
            "mean_ms": round(statistics.fmean(lat), 3),
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fsync_micro", description=__doc__)
    p.add_argument("--dir", default="/tmp", help="where the files go (the disk measured)")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--chunk", type=int, default=80_000)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="amqpd-fsync-", dir=a.dir) as d:
        for pattern in ("append", "prealloc"):
            for writers in (1, 2):
                r = measure(d, pattern, writers, a.seconds, a.chunk)
                print(f"{pattern:8} {writers} writer(s): {r['fsyncs']} fdatasyncs, "
                      f"p50 {r['p50_ms']} ms, mean {r['mean_ms']} ms, p99 {r['p99_ms']} ms",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
