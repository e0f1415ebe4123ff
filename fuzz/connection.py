"""atheris harness: bytes from libFuzzer into a real connection (Session over a Broker,
no sockets), through the frame parser and the connection state machine.

Each input picks a starting point (the bare socket, or a connection with two channels
open), a chunking (how the bytes arrive: frames split anywhere) and either raw bytes or
a script of valid client operations with a few bits flipped. The checks are those of
tests/unit/protocol/test_fuzz.py's ``run``: ``receive_data`` never raises, everything
the server writes parses as frames, every close carries a legal reply code (never 541,
which would mean a bug was hit), and nothing follows a connection.close.

Short bounded run (CI, tests/unit/protocol/test_atheris.py)::

    python -m fuzz.connection -runs=3000 -max_total_time=60

Longer, by script (keeps a corpus under fuzz/corpus/, crashes under fuzz/crashes/)::

    fuzz/run.sh 3600
"""

from __future__ import annotations

import logging
import os
import sys
import types

os.environ.setdefault("AMQPD_PURE_PYTHON", "1")  # instrument the sources, not the build

import atheris

import amqpd.protocol.codec
import amqpd.protocol.connection
import amqpd.protocol.frames
import amqpd.session  # noqa: F401
from tests.unit.protocol.test_fuzz import OPEN, OPERATIONS, run


def _instrument_amqpd() -> int:
    """Give libFuzzer coverage of amqpd's own code. atheris' import hook does not see
    modules loaded through amqpd.hotpath's finder, and ``instrument_all`` hung on the
    whole interpreter: so instrument amqpd's functions and methods in place."""
    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "amqpd" or name.startswith("amqpd.")):
            continue
        for attr, obj in list(vars(module).items()):
            if isinstance(obj, types.FunctionType) and obj.__module__ == name:
                setattr(module, attr, atheris.instrument_func(obj))
                count += 1
            elif isinstance(obj, type) and obj.__module__ == name:
                for key, value in list(vars(obj).items()):
                    if isinstance(value, types.FunctionType):
                        try:
                            setattr(obj, key, atheris.instrument_func(value))
                        except (AttributeError, TypeError):  # compiled or frozen class
                            continue
                        count += 1
    return count


INSTRUMENTED = _instrument_amqpd()

logging.disable(logging.CRITICAL)  # a close per input would flood the output


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 2)
    chunks = [fdp.ConsumeIntInRange(1, 256) for _ in range(fdp.ConsumeIntInRange(0, 12))]
    if mode == 0:  # anything, from the first byte on the socket
        stream = fdp.ConsumeBytes(fdp.remaining_bytes())
    elif mode == 1:  # anything, once the handshake is done and two channels are open
        stream = OPEN + fdp.ConsumeBytes(fdp.remaining_bytes())
    else:  # a valid script, a few bits flipped
        ops = [OPERATIONS[fdp.ConsumeIntInRange(0, len(OPERATIONS) - 1)]
               for _ in range(fdp.ConsumeIntInRange(1, 10))]
        buf = bytearray(OPEN + b"".join(ops))
        for _ in range(fdp.ConsumeIntInRange(0, 4)):
            bit = fdp.ConsumeIntInRange(0, len(buf) * 8 - 1)
            buf[bit // 8] ^= 1 << (bit % 8)
        stream = bytes(buf)
    run(stream, chunks)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
