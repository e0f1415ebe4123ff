"""The replication wire format: framing, every message round trip, malformed input."""

from __future__ import annotations

import pytest

from amqpd.replication import wire


def test_frame_header_round_trip() -> None:
    data = wire.frame(wire.ACK, b"x" * 16)
    assert wire.parse_header(data[:5]) == (wire.ACK, 16)
    assert data[5:] == b"x" * 16


@pytest.mark.parametrize("header, fragment", [
    (bytes([0, 0, 0, 0, 0]), "unknown frame type 0"),
    (bytes([99, 0, 0, 0, 0]), "unknown frame type 99"),
    (bytes([wire.ACK]) + (wire.MAX_CONTROL + 1).to_bytes(4, "big"), "exceeds"),
    (bytes([wire.DATA]) + (wire.MAX_DATA + 17).to_bytes(4, "big"), "exceeds"),
    (b"\x01\x00", "short"),
])
def test_bad_headers_are_protocol_errors(header: bytes, fragment: str) -> None:
    with pytest.raises(wire.ProtocolError, match=fragment):
        wire.parse_header(header)


def test_data_header_carries_base_and_offset() -> None:
    head = wire.data_header(4096, 100, 50)
    ftype, length = wire.parse_header(head[:5])
    assert (ftype, length) == (wire.DATA, 16 + 50)
    base, offset, rest = wire.parse_data(head[5:] + b"y" * 50)
    assert (base, offset, bytes(rest)) == (4096, 100, b"y" * 50)
    with pytest.raises(ValueError):
        wire.data_header(0, 0, wire.MAX_DATA + 1)
    with pytest.raises(wire.ProtocolError):
        wire.parse_data(b"short")


def test_hello_challenge_round_trip_and_refusals() -> None:
    nonce = b"n" * wire.NONCE_SIZE
    payload = wire.hello(nonce, "node-b")[5:]
    assert wire.parse_hello(payload) == (nonce, "node-b")
    with pytest.raises(wire.ProtocolError, match="magic"):
        wire.parse_hello(b"HTTP" + payload[4:])
    with pytest.raises(wire.ProtocolError, match="version"):
        wire.parse_hello(payload[:4] + b"\x00\x09" + payload[6:])
    with pytest.raises(wire.ProtocolError):
        wire.parse_hello(payload[:10])
    with pytest.raises(wire.ProtocolError, match="string"):
        wire.parse_hello(payload[:-2])  # the name runs past the frame
    assert wire.parse_challenge(wire.challenge(nonce, "a")[5:]) == (nonce, "a")


def test_macs_depend_on_secret_role_nonces_and_name() -> None:
    a, b = b"a" * 16, b"b" * 16
    m = wire.mac(b"secret", b"standby", a, b, "n")
    wire.check_mac(m, wire.mac(b"secret", b"standby", a, b, "n"))
    for other in (wire.mac(b"Secret", b"standby", a, b, "n"),
                  wire.mac(b"secret", b"active", a, b, "n"),
                  wire.mac(b"secret", b"standby", b, a, "n"),
                  wire.mac(b"secret", b"standby", a, b, "m"), b"", b"\0" * 32):
        with pytest.raises(wire.AuthError):
            wire.check_mac(m, other)
    assert wire.mac(b"", b"standby", a, b, "n") == b""  # TLS-only: nothing to prove


def test_follow_and_welcome_round_trip() -> None:
    f = wire.Follow(3, 1000, 67108864, 4242)
    assert wire.parse_follow(wire.follow(f)[5:]) == f
    with pytest.raises(wire.ProtocolError):
        wire.parse_follow(b"\0" * 31)
    w = wire.Welcome(wire.SNAPSHOT, 4, 64, 0, 0, (64, 128), ((1, 1), (4, 900)))
    assert wire.parse_welcome(wire.welcome(w)[5:]) == w
    raw = wire.welcome(w)[5:]
    with pytest.raises(wire.ProtocolError, match="short"):
        wire.parse_welcome(raw[:-3])
    with pytest.raises(wire.ProtocolError, match="trailing"):
        wire.parse_welcome(raw + b"\0")
    with pytest.raises(wire.ProtocolError, match="decision"):
        wire.parse_welcome(b"\x09" + raw[1:])


def test_stream_messages_round_trip() -> None:
    assert wire.parse_u64(wire.delete(77)[5:], "DELETE") == 77
    assert wire.parse_promise(wire.promise("/\0q", 12345)[5:]) == ("/\0q", 12345)
    assert wire.parse_pair(wire.pair(wire.ACK, 9, 10)[5:], "ACK") == (9, 10)
    assert wire.parse_error(wire.error("nope")[5:]) == "nope"
    with pytest.raises(wire.ProtocolError):
        wire.parse_pair(b"\0" * 15, "ACK")
    with pytest.raises(wire.ProtocolError):
        wire.parse_promise(wire.promise("q", 1)[5:] + b"x")
