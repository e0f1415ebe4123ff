"""atheris harness: bytes from libFuzzer into the stream protocol's frame decoder
(amqpd.streamproto.codec: FrameReader cutting a byte stream into frames, then decode),
plus the AMQP 1.0 body extraction stream records go through for AMQP 0-9-1 consumers.

The checks: the decoder raises nothing but FrameError (a frame it refuses, with a
response code of the protocol), the reader never hands out a frame larger than its
frame max, and body_of raises nothing but AMQP10Error.

Short bounded run (CI, tests/unit/streamproto/test_codec.py)::

    python -m fuzz.stream_frames -runs=3000 -max_total_time=60
"""

from __future__ import annotations

import os
import sys
import types

os.environ.setdefault("AMQPD_PURE_PYTHON", "1")

import atheris

from amqpd.streamproto import amqp10, codec


def _instrument(*modules: types.ModuleType) -> int:
    """Coverage of the decoder's own functions and methods, instrumented in place (as
    fuzz/connection.py does: atheris' import hook misses modules amqpd loads)."""
    count = 0
    for module in modules:
        for attr, obj in list(vars(module).items()):
            if isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
                setattr(module, attr, atheris.instrument_func(obj))
                count += 1
            elif isinstance(obj, type) and obj.__module__ == module.__name__:
                for key, value in list(vars(obj).items()):
                    if isinstance(value, types.FunctionType):
                        setattr(obj, key, atheris.instrument_func(value))
                        count += 1
    # the decoder table holds the functions themselves: point it at the instrumented ones
    for key, (corr, fn) in list(codec._DECODERS.items()):
        codec._DECODERS[key] = (corr, atheris.instrument_func(fn))
    return count


INSTRUMENTED = _instrument(codec, amqp10)

FRAME_MAX = 4096


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    chunks = [fdp.ConsumeIntInRange(1, 512) for _ in range(fdp.ConsumeIntInRange(0, 8))]
    stream = fdp.ConsumeBytes(fdp.remaining_bytes())
    reader = codec.FrameReader(FRAME_MAX)
    at = 0
    for size in [*chunks, len(stream)]:
        piece, at = stream[at:at + size], at + size
        try:
            frames = reader.feed(piece)
        except codec.FrameError as exc:
            assert 0 < exc.code <= 0x13
            return
        for frame in frames:
            assert len(frame) + 4 <= FRAME_MAX
            try:
                command = codec.decode(frame)
            except codec.FrameError as exc:
                assert 0 < exc.code <= 0x13
                continue
            assert isinstance(command.fields, tuple)
    try:
        amqp10.body_of(stream)
    except amqp10.AMQP10Error:
        pass


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
