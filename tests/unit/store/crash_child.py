"""Child process for test_crash.py (not a test): publish, commit, settle, forever.

Prints to stdout, one line each, only after the commit callback confirmed it:
``C <position> <i>`` message i is durable at position; ``S <position>`` its settle is.
"""

from __future__ import annotations

import queue
import struct
import sys
import threading
from pathlib import Path

from amqpd.store.api import StoredMessage
from amqpd.store.log import SharedLog

QUEUE = "/\x00crash"


def body(i: int) -> bytes:
    return struct.pack("<Q", i) * 4


def main() -> None:
    directory, start = Path(sys.argv[1]), int(sys.argv[2])
    store = SharedLog(directory, segment_size=64 * 1024, checkpoint_every_bytes=48 * 1024)
    store.open()
    out = sys.stdout
    lock = threading.Lock()
    confirmed: queue.SimpleQueue[list[int]] = queue.SimpleQueue()

    def emit(lines: list[str]) -> None:
        with lock:
            out.write("".join(lines))
            out.flush()

    i = start
    while True:
        batch = []
        for _ in range(20):
            pos = store.append_enqueue([QUEUE], StoredMessage("", "k", b"\x00\x00", body(i)))
            batch.append((pos, i))
            i += 1

        def on_enqueue(exc: BaseException | None, batch: list[tuple[int, int]] = batch) -> None:
            if exc is None:
                emit([f"C {p} {n}\n" for p, n in batch])
                confirmed.put([p for p, n in batch if n % 3 == 0])

        store.commit(on_enqueue)
        try:
            settle = confirmed.get_nowait()
        except queue.Empty:
            continue
        store.append_settle(QUEUE, settle)

        def on_settle(exc: BaseException | None, settle: list[int] = settle) -> None:
            if exc is None:
                emit([f"S {p}\n" for p in settle])

        store.commit(on_settle)


if __name__ == "__main__":
    main()
