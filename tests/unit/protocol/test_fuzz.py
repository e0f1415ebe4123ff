"""Hypothesis throws random, truncated and bit-flipped frames at a connection.

Whatever arrives, ``receive_data`` must not raise, everything the server writes must be
well-formed frames, and any close it sends must carry a legal reply code (and never 541,
which would mean a bug was hit). The server is a real Session over a Broker, no sockets.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as C

from amqpd.protocol.frames import PROTOCOL_HEADER
from tests.support import wire
from tests.unit.protocol.peer import Pair, real_broker

LEGAL_CODES = {311, 312, 313, 320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505, 506,
               530, 540}
FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

HANDSHAKE = wire.handshake(channel_max=64, frame_max=4096)
OPEN = HANDSHAKE + wire.method(1, C.Channel.Open()) + wire.method(2, C.Channel.Open())

# valid frames a client could send once channels 1 and 2 are open
OPERATIONS = [
    wire.method(1, C.Queue.Declare(queue="fq", auto_delete=True)),
    wire.method(1, C.Queue.Declare(queue="", exclusive=True)),
    wire.method(1, C.Queue.Declare(queue="fq", passive=True)),
    wire.method(1, C.Exchange.Declare(exchange="fx", exchange_type="topic")),
    wire.method(1, C.Exchange.Declare(exchange="fh", exchange_type="headers")),
    wire.method(1, C.Queue.Bind(queue="fq", exchange="fx", routing_key="a.*")),
    wire.method(1, C.Queue.Bind(queue="fq", exchange="fh", arguments={"x-match": "any",
                                                                       "k": 1})),
    wire.method(1, C.Exchange.Bind(destination="fx", source="amq.fanout")),
    wire.publish(1, "fx", "a.b", b"topic", frame_max=4096),
    wire.publish(1, "amq.fanout", "", b"x" * 5000, frame_max=4096),
    wire.publish(1, "", "fq", b"direct", mandatory=True, frame_max=4096, delivery_mode=2,
                 headers={"k": 1}),
    wire.publish(1, "fh", "", b"hdr", frame_max=4096, headers={"k": 1}),
    wire.publish(2, "nope", "", b"x", frame_max=4096),
    wire.method(1, C.Basic.Qos(prefetch_count=2)),
    wire.method(1, C.Basic.Qos(prefetch_count=1, global_=True)),
    wire.method(1, C.Basic.Consume(queue="fq", consumer_tag="fc")),
    wire.method(2, C.Basic.Consume(queue="fq", no_ack=True)),
    wire.method(1, C.Basic.Get(queue="fq")),
    wire.method(1, C.Basic.Ack(delivery_tag=1)),
    wire.method(1, C.Basic.Ack(delivery_tag=0, multiple=True)),
    wire.method(1, C.Basic.Nack(delivery_tag=2, multiple=True, requeue=True)),
    wire.method(1, C.Basic.Reject(delivery_tag=3, requeue=False)),
    wire.method(1, C.Basic.Recover(requeue=True)),
    wire.method(1, C.Basic.Cancel(consumer_tag="fc")),
    wire.method(1, C.Confirm.Select()),
    wire.method(2, C.Tx.Select()),
    wire.method(2, C.Tx.Commit()),
    wire.method(2, C.Tx.Rollback()),
    wire.method(1, C.Queue.Purge(queue="fq")),
    wire.method(1, C.Queue.Unbind(queue="fq", exchange="fx", routing_key="a.*")),
    wire.method(1, C.Queue.Delete(queue="fq", if_unused=True)),
    wire.method(1, C.Exchange.Delete(exchange="fx")),
    wire.method(1, C.Channel.Flow(active=True)),
    wire.method(2, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)),
    wire.method(3, C.Channel.Open()),
    wire.method(1, C.Channel.CloseOk()),
    wire.HEARTBEAT,
]


def run(data: bytes, chunks: list[int]) -> Pair:
    """Feed ``data`` in the given chunk sizes; check every invariant on the way."""
    pair = Pair(broker=real_broker())
    pos = 0
    sizes = iter(chunks)
    outs = []
    while pos < len(data):
        n = next(sizes, len(data))
        pair.server.receive_data(data[pos:pos + n])  # must never raise
        pos += n
        outs.extend(pair.drain())  # pamqp parses every frame or this raises
    pair.server.tick(pair.clock.now + 1)
    outs.extend(pair.drain())
    for out in outs:
        if isinstance(out.value, C.Connection.Close | C.Channel.Close):
            assert out.value.reply_code in LEGAL_CODES, (out.value.reply_code,
                                                         out.value.reply_text)
            assert out.value.reply_text.split(" - ")[0].isupper(), out.value.reply_text
    closes = [o for o in outs if isinstance(o.value, C.Connection.Close)]
    if closes:
        # nothing but the close itself once the connection is closing
        assert isinstance(outs[-1].value, C.Connection.Close | C.Connection.CloseOk), outs[-1]
    if pair.server.should_close_transport and not closes and pair.codec.protocol_header is None:
        assert not pair.server.is_open
    return pair


chunking = st.lists(st.integers(1, 200), max_size=20)


@FUZZ
@given(st.binary(max_size=300), chunking)
def test_random_bytes_from_the_start(data: bytes, chunks: list[int]) -> None:
    run(data, chunks)


@FUZZ
@given(st.binary(max_size=300), chunking)
def test_random_bytes_after_the_handshake(data: bytes, chunks: list[int]) -> None:
    run(OPEN + data, chunks)


@FUZZ
@given(st.lists(st.integers(0, 255), min_size=7, max_size=7), st.binary(max_size=64),
       st.sampled_from([0xCE, 0x00, 0xFF]))
def test_random_frame_headers(header: list[int], payload: bytes, end: int) -> None:
    """Random frame type, channel and declared size around a random payload."""
    frame = bytes(header) + payload + bytes((end,))
    run(OPEN + frame + wire.method(1, C.Basic.Qos()), [])


script = st.lists(st.sampled_from(OPERATIONS), min_size=1, max_size=12)


@FUZZ
@given(script, st.data())
def test_truncated_valid_sequences(ops: list[bytes], data: st.DataObject) -> None:
    stream = OPEN + b"".join(ops)
    cut = data.draw(st.integers(0, len(stream)))
    run(stream[:cut], data.draw(chunking))


@FUZZ
@given(script, st.data())
def test_bit_flips_in_valid_sequences(ops: list[bytes], data: st.DataObject) -> None:
    stream = bytearray(OPEN + b"".join(ops))
    flips = data.draw(st.lists(st.integers(0, len(stream) * 8 - 1), min_size=1, max_size=4))
    for bit in flips:
        stream[bit // 8] ^= 1 << (bit % 8)
    run(bytes(stream), data.draw(chunking))


@FUZZ
@given(script, st.data())
def test_mutated_bytes_after_the_handshake(ops: list[bytes], data: st.DataObject) -> None:
    """Flip bits only past the handshake, so most runs reach the channel code."""
    body = bytearray(b"".join(ops))
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(body) - 1))
        body[pos] = data.draw(st.integers(0, 255))
    run(OPEN + bytes(body), data.draw(chunking))


def test_every_truncation_of_the_handshake() -> None:
    stream = OPEN + OPERATIONS[0] + OPERATIONS[8]
    for cut in range(len(stream) + 1):
        run(stream[:cut], [])


def test_a_valid_script_runs_clean() -> None:
    pair = run(OPEN + b"".join(OPERATIONS[:12]), [])
    assert pair.server.is_open


def test_protocol_header_only_once() -> None:
    pair = run(PROTOCOL_HEADER + PROTOCOL_HEADER, [])
    assert not pair.server.is_open


def test_access_request_is_granted_ticket_one() -> None:
    """A bit flip can turn any method into access.request (class 30, gone from 0-9-1);
    the server answers access.request-ok with ticket 1 as RabbitMQ does, and the test's
    own frame reader must read that answer (pamqp no longer knows class 30)."""
    request = wire.method(1, C.Basic.Qos())
    # basic.qos is class 60 method 10; rewrite the class id to 30 -> access.request
    payload = bytearray(request)
    payload[7:9] = (30).to_bytes(2, "big")
    payload[9:11] = (10).to_bytes(2, "big")
    pair = Pair(broker=real_broker())
    outs = pair.send(OPEN + bytes(payload))
    granted = [o for o in outs if isinstance(o.value, wire.AccessRequestOk)]
    assert [(o.channel, o.value.ticket) for o in granted] == [(1, 1)], outs
    assert pair.server.is_open
