"""The case registry, the per-case context and the helpers cases share.

A case is a function taking a :class:`Context`, registered with ``@case(id, area=...)``.
It passes by returning, fails by raising :class:`CaseFailure` (or any AssertionError),
and is skipped by raising :class:`Skip`. Everything it declares through the context is
uniquely named and deleted afterwards, even when the case fails, so cases can run in
parallel against a shared broker.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import secrets
import socket
import time
import urllib.parse
from base64 import b64encode
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from conformance.rawclient import RawClient

# ---------------------------------------------------------------------------
# Registry


@dataclass
class Case:
    id: str
    area: str
    func: Callable[[Context], Any]
    doc: str = ""
    slow: bool = False
    exclusive: bool = False  # runs alone, after all others (it affects the whole broker)
    # Restart cases: func prepares (returns state), verify checks after one broker restart
    # shared by all of them (see restart_case).
    verify: Callable[[Context, Any], None] | None = None


REGISTRY: dict[str, Case] = {}


CaseFunc = Callable[["Context"], None]


def case(case_id: str, area: str, slow: bool = False,
         exclusive: bool = False) -> Callable[[CaseFunc], CaseFunc]:
    """Register a case. The id names the method or feature and the rule it checks."""

    def deco(func: CaseFunc) -> CaseFunc:
        if case_id in REGISTRY:
            raise ValueError(f"duplicate case id {case_id}")
        REGISTRY[case_id] = Case(case_id, area, func, (func.__doc__ or "").strip(), slow,
                                 exclusive)
        return func

    return deco


def restart_case(case_id: str, area: str) -> Callable[
        [Callable[[Context], Any]], Callable[[Callable[[Context, Any], None]], None]]:
    """Register a case in two halves around a broker restart::

        @restart_case("durability/...", area="durability")
        def prepare(ctx): ...; return state
        @prepare.verify   (the decorator returns a registrar)
        def verify(ctx, state): ...

    All restart cases share one restart (``--restart-cmd``), run after every other case.
    """

    def deco(prepare: Callable[[Context], Any]) -> Callable[
            [Callable[[Context, Any], None]], None]:
        def register(verify: Callable[[Context, Any], None]) -> None:
            if case_id in REGISTRY:
                raise ValueError(f"duplicate case id {case_id}")
            REGISTRY[case_id] = Case(case_id, area, prepare, (prepare.__doc__ or "").strip(),
                                     exclusive=True, verify=verify)
        return register

    return deco


class Skip(Exception):
    """The broker does not offer what this case checks (e.g. an amqpd-only extension)."""


class CaseFailure(AssertionError):
    def __init__(self, expected: object, got: object, what: str = "") -> None:
        self.expected, self.got, self.what = expected, got, what
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}expected {expected}, got {got}")


def check(cond: bool, expected: object, got: object, what: str = "") -> None:
    if not cond:
        raise CaseFailure(expected, got, what)


def eq(got: object, expected: object, what: str = "") -> None:
    if got != expected:
        raise CaseFailure(repr(expected), repr(got), what)


# ---------------------------------------------------------------------------
# Results


@dataclass
class Message:
    method: Any
    properties: pika.BasicProperties
    body: bytes

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.headers or {})


@dataclass
class Settings:
    url: str
    http_url: str | None = None
    timeout: float = 5.0
    # Shell commands that raise and clear a resource alarm on the broker (for the
    # connection.blocked/unblocked cases); those cases skip when they are not given.
    alarm_cmd: str | None = None
    clear_alarm_cmd: str | None = None
    # Shell command that restarts the broker (same address, same data); enables the
    # durability cases, which prepare, share one restart, then verify.
    restart_cmd: str | None = None
    restart_timeout: float = 90.0
    # Seconds a case may run before its connections are cut (Context.cut_connections):
    # a broker that never answers then fails that case instead of hanging the run.
    case_timeout: float = 300.0


@dataclass
class Closed:
    """A close the broker sent: reply code and text."""

    code: int
    text: str


def _channel_close_reason(ch: BlockingChannel) -> Closed | None:
    reason = getattr(ch, "_closing_reason", None)
    if isinstance(reason, pex.ChannelClosedByBroker):
        return Closed(reason.reply_code, reason.reply_text)
    return None


# ---------------------------------------------------------------------------
# Context


@dataclass
class Context:
    case_id: str
    settings: Settings
    _cleanups: list[Callable[[], object]] = field(default_factory=list)
    _connections: list[BlockingConnection] = field(default_factory=list)
    _raws: list[RawClient] = field(default_factory=list)
    _declared_queues: list[str] = field(default_factory=list)
    _declared_exchanges: list[str] = field(default_factory=list)
    _main: BlockingConnection | None = None
    observed: list[str] = field(default_factory=list)
    cut: bool = False  # the case outlived Settings.case_timeout (cut_connections)

    def note(self, what: str) -> None:
        """Record something the broker answered (closes, returns) for the report."""
        if what not in self.observed:
            self.observed.append(what)

    # -- names ---------------------------------------------------------------------
    def name(self, kind: str = "q") -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.case_id.lower())[-40:].strip("-")
        return f"conf-{kind}-{slug}-{secrets.token_hex(4)}"

    # -- connections ---------------------------------------------------------------
    @property
    def params(self) -> pika.URLParameters:
        return pika.URLParameters(self.settings.url)

    def connect(self, **overrides: Any) -> BlockingConnection:
        params = pika.URLParameters(self.settings.url)
        params.client_properties = {"connection_name": self.case_id,
                                    "product": "amqpd-conformance"}
        params.connection_attempts = 1
        params.socket_timeout = self.settings.timeout
        params.blocked_connection_timeout = 30
        params.heartbeat = overrides.pop("heartbeat", 0)
        for k, v in overrides.items():
            setattr(params, k, v)
        conn = BlockingConnection(params)
        self._connections.append(conn)
        return conn

    @property
    def conn(self) -> BlockingConnection:
        if self._main is None or not self._main.is_open:
            self._main = self.connect()
        return self._main

    def channel(self, conn: BlockingConnection | None = None) -> BlockingChannel:
        return (conn or self.conn).channel()

    def raw(self, timeout: float | None = None) -> RawClient:
        p = self.params
        rc = RawClient(p.host, p.port, timeout=timeout or self.settings.timeout)
        rc.observer = self.note
        self._raws.append(rc)
        return rc

    @property
    def vhost(self) -> str:
        return self.params.virtual_host

    @property
    def user(self) -> str:
        creds = self.params.credentials
        return str(getattr(creds, "username", "guest"))

    @property
    def password(self) -> str:
        creds = self.params.credentials
        return str(getattr(creds, "password", "guest"))

    # -- declarations with cleanup ---------------------------------------------------
    def queue(self, ch: BlockingChannel | None = None, name: str | None = None,
              arguments: dict[str, Any] | None = None, durable: bool = False,
              exclusive: bool = False, auto_delete: bool = False) -> str:
        ch = ch or self.channel()
        name = self.name("q") if name is None else name
        ok = ch.queue_declare(name, durable=durable, exclusive=exclusive,
                              auto_delete=auto_delete, arguments=arguments)
        real = ok.method.queue
        self._declared_queues.append(real)
        return str(real)

    def exchange(self, ch: BlockingChannel | None = None, type: str = "direct",
                 name: str | None = None, arguments: dict[str, Any] | None = None,
                 durable: bool = False, auto_delete: bool = False,
                 internal: bool = False) -> str:
        ch = ch or self.channel()
        name = name or self.name("x")
        self._declared_exchanges.append(name)
        ch.exchange_declare(name, exchange_type=type, durable=durable, auto_delete=auto_delete,
                            internal=internal, arguments=arguments)
        return name

    def track_queue(self, name: str) -> None:
        self._declared_queues.append(name)

    def track_exchange(self, name: str) -> None:
        self._declared_exchanges.append(name)

    def on_cleanup(self, fn: Callable[[], object]) -> None:
        self._cleanups.append(fn)

    def bound_queue(self, ch: BlockingChannel, exchange: str, routing_key: str = "",
                    arguments: dict[str, Any] | None = None,
                    queue_args: dict[str, Any] | None = None) -> str:
        q = self.queue(ch, arguments=queue_args)
        ch.queue_bind(q, exchange, routing_key=routing_key, arguments=arguments)
        return q

    # -- messaging helpers ---------------------------------------------------------
    @staticmethod
    def publish(ch: BlockingChannel, exchange: str, routing_key: str, body: bytes = b"m",
                properties: pika.BasicProperties | None = None, mandatory: bool = False) -> None:
        ch.basic_publish(exchange, routing_key, body, properties, mandatory=mandatory)

    def get(self, ch: BlockingChannel, queue: str, timeout: float = 2.0,
            auto_ack: bool = True) -> Message | None:
        """basic.get, polling until a message arrives or *timeout* passes."""
        deadline = time.monotonic() + timeout
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
            if method is not None:
                return Message(method, props, body)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def must_get(self, ch: BlockingChannel, queue: str, timeout: float = 3.0,
                 auto_ack: bool = True) -> Message:
        m = self.get(ch, queue, timeout, auto_ack)
        if m is None:
            raise CaseFailure("a message", "an empty queue", f"basic.get from {queue}")
        return m

    def get_none(self, ch: BlockingChannel, queue: str, settle: float = 0.2) -> None:
        """The queue stays empty (after letting routing settle for *settle* seconds)."""
        self.sync(ch)
        time.sleep(settle)
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            raise CaseFailure("an empty queue", f"message {body!r}", f"basic.get from {queue}")

    def drain(self, ch: BlockingChannel, queue: str, timeout: float = 1.0) -> list[Message]:
        """Everything in the queue right now (auto-ack), stopping when it is empty."""
        out: list[Message] = []
        self.sync(ch)
        while True:
            m = self.get(ch, queue, timeout=0)
            if m is None:
                if timeout <= 0:
                    return out
                time.sleep(0.05)
                m = self.get(ch, queue, timeout=0)
                if m is None:
                    return out
            out.append(m)

    def bodies(self, ch: BlockingChannel, queue: str) -> list[bytes]:
        return [m.body for m in self.drain(ch, queue)]

    def consume(self, ch: BlockingChannel, queue: str, n: int, timeout: float = 3.0,
                auto_ack: bool = False, arguments: dict[str, Any] | None = None,
                consumer_tag: str | None = None) -> tuple[str, list[Message]]:
        """Start a consumer and collect *n* deliveries (or fewer at the deadline)."""
        got: list[Message] = []

        def on_msg(_ch: Any, method: Any, props: Any, body: bytes) -> None:
            got.append(Message(method, props, body))

        tag = ch.basic_consume(queue, on_msg, auto_ack=auto_ack, arguments=arguments,
                               consumer_tag=consumer_tag)
        self.pump(ch.connection, lambda: len(got) >= n, timeout)
        return tag, got

    @staticmethod
    def pump(conn: BlockingConnection, until: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            conn.process_data_events(time_limit=min(0.05, left))
        return True

    def settle_count(self, conn: BlockingConnection, got: list[Any], expected: int,
                     timeout: float = 3.0, settle: float = 0.3) -> int:
        """Pump until *got* has *expected* items (or *timeout*), then *settle* more seconds
        so that any delivery beyond a limit has had time to show up; return len(got)."""
        self.pump(conn, lambda: len(got) >= expected, timeout)
        self.pump(conn, lambda: len(got) > expected, settle)
        return len(got)

    @staticmethod
    def sync(ch: BlockingChannel) -> None:
        """A round trip on *ch*: everything sent before has been processed by the broker."""
        ch.exchange_declare("amq.direct", passive=True)

    # -- expecting errors ------------------------------------------------------------
    def channel_error(self, ch: BlockingChannel, action: Callable[[], Any],
                      code: int, text: str | None = None) -> Closed:
        """*action* makes the broker close *ch* with *code*; the connection stays open."""
        got: Closed | None = None
        try:
            action()
            if ch.is_open:
                self.sync(ch)
        except pex.ChannelClosedByBroker as exc:
            got = Closed(exc.reply_code, exc.reply_text)
        except pex.ChannelWrongStateError:
            got = _channel_close_reason(ch)
        except pex.ConnectionClosedByBroker as exc:
            raise CaseFailure(f"channel.close {code}",
                              f"connection.close {exc.reply_code} {exc.reply_text}")
        if got is None:
            got = _channel_close_reason(ch)
        if got is None:
            raise CaseFailure(f"channel.close {code}", "success (channel still open)")
        self.note(f"Channel.Close {got.code} {got.text!r}")
        check(got.code == code, f"channel.close {code}", f"{got.code} {got.text}")
        if text is not None:
            check(text in got.text, f"reply text containing {text!r}", repr(got.text))
        check(ch.connection.is_open, "connection still open after a channel error",
              "connection closed")
        return got

    def connection_error(self, conn: BlockingConnection, action: Callable[[], Any],
                         code: int, text: str | None = None) -> Closed:
        """*action* makes the broker close the whole connection with *code*."""
        got: Closed | None = None
        try:
            action()
            conn.process_data_events(time_limit=0.3)
            ch = conn.channel()
            self.sync(ch)
        except pex.ConnectionClosedByBroker as exc:
            got = Closed(exc.reply_code, exc.reply_text)
        except pex.ChannelClosedByBroker as exc:
            raise CaseFailure(f"connection.close {code}",
                              f"channel.close {exc.reply_code} {exc.reply_text}")
        except (pex.ConnectionWrongStateError, pex.ChannelWrongStateError,
                pex.StreamLostError) as exc:
            closed = getattr(conn, "_closed_result", None)
            reason = closed.value.error if closed is not None and closed.ready else None
            if isinstance(reason, pex.ConnectionClosedByBroker):
                got = Closed(reason.reply_code, reason.reply_text)
            else:
                raise CaseFailure(f"connection.close {code}", f"{type(exc).__name__}: {exc}")
        if got is None:
            raise CaseFailure(f"connection.close {code}", "success (connection still open)")
        self.note(f"Connection.Close {got.code} {got.text!r}")
        check(got.code == code, f"connection.close {code}", f"{got.code} {got.text}")
        if text is not None:
            check(text in got.text, f"reply text containing {text!r}", repr(got.text))
        return got

    # -- broker administration hooks ---------------------------------------------------
    def admin(self, which: str) -> None:
        """Run the configured alarm_cmd / clear_alarm_cmd shell command."""
        import subprocess

        cmd = getattr(self.settings, which)
        if not cmd:
            raise Skip(f"needs --{which.replace('_', '-')}")
        proc = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60,
                              check=False)
        if proc.returncode != 0:
            raise CaseFailure(f"{which} to succeed", f"exit {proc.returncode}: "
                              f"{(proc.stderr or proc.stdout).strip()[:200]}")

    # -- HTTP management API -----------------------------------------------------------
    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        if not self.settings.http_url:
            raise Skip("needs --http-url (management API)")
        u = urllib.parse.urlsplit(self.settings.http_url)
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 15672,
                                          timeout=self.settings.timeout)
        auth = b64encode(f"{self.user}:{self.password}".encode()).decode()
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Authorization": f"Basic {auth}",
                                                      "Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return resp.status, parsed

    # -- teardown --------------------------------------------------------------------
    def cut_connections(self) -> int:
        """Called from another thread when the case outlived its time: shut down the
        socket of every connection the case opened, so that its thread, waiting in pika
        for an answer that never comes (``basic_get`` has no timeout of its own), gets
        an error and the case ends. How many sockets were shut down. Reaches into pika's
        connection for its socket (``_impl._transport._sock``, pika 1.x): a pika without
        it cuts nothing, and the case runs on as before."""
        self.cut = True
        count = 0
        for conn in list(self._connections):
            transport = getattr(getattr(conn, "_impl", None), "_transport", None)
            sock = getattr(transport, "_sock", None)
            if isinstance(sock, socket.socket):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                    count += 1
        return count

    def disconnect(self) -> None:
        """Close this case's connections but keep what it declared (before a restart)."""
        for rc in self._raws:
            rc.close()
        self._raws.clear()
        for c in self._connections:
            with contextlib.suppress(Exception):
                if c.is_open:
                    c.close()
        self._connections.clear()
        self._main = None

    def close(self) -> None:
        if self.cut:  # the broker stopped answering this case: ask it nothing more
            for rc in self._raws:
                rc.close()
            return
        for fn in reversed(self._cleanups):
            with contextlib.suppress(Exception):
                fn()
        for rc in self._raws:
            rc.close()
        for c in self._connections:
            with contextlib.suppress(Exception):
                if c.is_open:
                    c.close()
        if not (self._declared_queues or self._declared_exchanges):
            return
        with contextlib.suppress(Exception):
            conn = self.connect()
            ch = conn.channel()
            for q in self._declared_queues:
                if q.startswith("amq.rabbitmq."):
                    continue
                try:
                    ch.queue_delete(q)
                except pex.AMQPError:
                    ch = conn.channel()
            for x in self._declared_exchanges:
                try:
                    ch.exchange_delete(x)
                except pex.AMQPError:
                    ch = conn.channel()
            conn.close()
