"""A client and a server machine joined by a fake link, with no sockets (h11's ConnectionPair).

``Pair.send(bytes)`` feeds the server :class:`AMQPConnection` and returns what it wrote
back, decoded with pamqp into :class:`~tests.support.wire.Out` frames. The server's delegate
is either :class:`FakeDelegate`, which records every call, or a real
:class:`~amqpd.session.Session` over a :class:`~amqpd.server.Broker` with no listeners.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands

from amqpd.config import Settings
from amqpd.protocol.connection import AMQPConnection, Limits
from amqpd.protocol.errors import ConnectionAccessRefused, NotAllowed
from amqpd.server import Broker
from amqpd.session import Session
from tests.support import wire
from tests.support.wire import ClientCodec, Out


class FakeDelegate:
    """Accepts guest/guest (PLAIN only) and vhost '/'; records everything else."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_with: BaseException | None = None  # raised by the next on_method

    def authenticate(self, mechanism: str, response: bytes, client_properties: dict) -> None:
        self.calls.append(("authenticate", mechanism, response))
        if response != wire.plain():
            raise ConnectionAccessRefused("Login was refused using authentication mechanism "
                                          f"{mechanism}. For details see the broker logfile.")

    def open_vhost(self, vhost: str) -> None:
        self.calls.append(("open_vhost", vhost))
        if vhost != "/":
            raise NotAllowed(f"vhost {vhost} not found", 10, 40)

    def channel_opened(self, channel: int) -> None:
        self.calls.append(("channel_opened", channel))

    def channel_closed(self, channel: int) -> None:
        self.calls.append(("channel_closed", channel))

    def on_method(self, channel: int, method: Any) -> None:
        self.calls.append(("on_method", channel, method))
        if self.fail_with is not None:
            exc, self.fail_with = self.fail_with, None
            raise exc

    def on_publish(self, channel: int, exchange: str, routing_key: str, mandatory: bool,
                   immediate: bool, properties: bytes, body: bytes) -> None:
        self.calls.append(("on_publish", channel, exchange, routing_key, mandatory, body))

    def on_ack(self, channel: int, delivery_tag: int, multiple: bool) -> None:
        self.calls.append(("on_ack", channel, delivery_tag, multiple))

    def on_connection_closed(self) -> None:
        self.calls.append(("on_connection_closed",))

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == name]


SERVER_PROPERTIES = {"product": "amqpd", "capabilities": {"publisher_confirms": True}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Pair:
    def __init__(self, delegate: Any = None, limits: Limits | None = None,
                 broker: Broker | None = None) -> None:
        self.clock = Clock()
        self.broker = broker
        if broker is not None:
            self.session: Session | None = Session(broker, ("127.0.0.1", 40000),
                                                   limits or broker.limits(), name="pair")
            self.server = self.session.conn
            self.server.clock = self.clock
            self.server.created = self.server.last_received = self.clock.now
        else:
            self.session = None
            self.delegate = delegate or FakeDelegate()
            self.server = AMQPConnection(self.delegate, SERVER_PROPERTIES, limits, self.clock)
        self.codec = ClientCodec()

    def send(self, *chunks: bytes) -> list[Out]:
        self.server.receive_data(b"".join(chunks))
        return self.drain()

    def drain(self) -> list[Out]:
        if self.broker is not None:
            self.broker._run_dispatch()
        return self.codec.feed(self.server.data_to_send())

    def open(self, **kwargs: Any) -> list[Out]:
        kwargs.setdefault("channel_max", 2047)
        out = self.send(wire.handshake(**kwargs))
        assert [type(o.value) for o in out] == [
            commands.Connection.Start, commands.Connection.Tune, commands.Connection.OpenOk,
        ], out
        return out

    def open_channel(self, channel: int = 1) -> None:
        out = self.send(wire.method(channel, commands.Channel.Open()))
        assert len(out) == 1 and isinstance(out[0].value, commands.Channel.OpenOk), out

    def call(self, channel: int, method: Any) -> list[Out]:
        return self.send(wire.method(channel, method))


def real_broker(**settings: Any) -> Broker:
    settings.setdefault("persistence", False)
    return Broker(Settings(**settings))


def last_close(out: list[Out]) -> Any:
    closes = [o.value for o in out
              if isinstance(o.value, commands.Connection.Close | commands.Channel.Close)]
    assert closes, f"no close frame in {out}"
    return closes[-1]
