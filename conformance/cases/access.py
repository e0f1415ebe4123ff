"""Access control: users, vhost access and configure/write/read permissions.

Each case creates its own user through the management API (so it is skipped without
--http-url), gives it the permissions under test in the case's vhost, connects as that
user, and deletes the user afterwards. Resource names are matched by the permission
regular expressions, as in RabbitMQ.
"""

from __future__ import annotations

import re
import secrets
import time
from urllib.parse import quote

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from conformance.framework import CaseFailure, Context, case, check, eq

A = "access-control"
NOTHING = "^nothing-matches-this$"  # a permission no resource name matches


def _user(ctx: Context, configure: str | None = ".*", write: str | None = ".*",
          read: str | None = ".*") -> tuple[str, str]:
    """A new user; with permissions in the vhost unless configure is None."""
    name = ctx.name("user")
    password = secrets.token_hex(8)
    status, body = ctx.http("PUT", f"/api/users/{quote(name, safe='')}",
                            {"password": password, "tags": ""})
    check(status in (201, 204), "user created (201/204)", f"{status} {body}")
    ctx.on_cleanup(lambda: ctx.http("DELETE", f"/api/users/{quote(name, safe='')}"))
    if configure is not None:
        status, body = ctx.http(
            "PUT", f"/api/permissions/{quote(ctx.vhost, safe='')}/{quote(name, safe='')}",
            {"configure": configure, "write": write, "read": read})
        check(status in (201, 204), "permissions set (201/204)", f"{status} {body}")
    return name, password


def _connect_as(ctx: Context, user: str, password: str) -> BlockingConnection:
    return ctx.connect(credentials=pika.PlainCredentials(user, password))


def _only(prefix: str) -> str:
    return "^" + re.escape(prefix) + ".*"


def _channel_as(ctx: Context, configure: str = ".*", write: str = ".*",
                read: str = ".*") -> BlockingChannel:
    """A channel of a connection as a new user with these permissions in the vhost."""
    user, pw = _user(ctx, configure, write, read)
    return _connect_as(ctx, user, pw).channel()


@case("access/user-with-full-permissions-can-work", A)
def full(ctx: Context) -> None:
    ch = _channel_as(ctx)
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"as-user")
    eq(ctx.must_get(ch, q).body, b"as-user", "body")


@case("access/user-without-vhost-permissions-530-NOT_ALLOWED", A)
def no_vhost(ctx: Context) -> None:
    user, pw = _user(ctx, configure=None)
    try:
        conn = _connect_as(ctx, user, pw)
    except pex.ConnectionClosedByBroker as exc:
        eq(exc.reply_code, 530, "connection.close code")
        ctx.note(f"Connection.Close {exc.reply_code} {exc.reply_text!r}")
        return
    except pex.ProbableAccessDeniedError as exc:  # pika's wrapper around the 530 close
        check("(530)" in str(exc), "connection.close 530 on connection.open", repr(exc))
        ctx.note(f"Connection.Close (pika: {exc})")
        return
    conn.close()
    raise CaseFailure("connection.close 530", "an open connection")


@case("access/wrong-password-refused", A)
def wrong_password(ctx: Context) -> None:
    user, _ = _user(ctx)
    try:
        conn = _connect_as(ctx, user, "not-the-password")
    except (pex.ProbableAuthenticationError, pex.ConnectionClosedByBroker) as exc:
        code = getattr(exc, "reply_code", 403)
        eq(code, 403, "reply code")
        return
    conn.close()
    raise CaseFailure("login refused (403)", "an open connection")


@case("access/configure-regex-limits-queue-declare-403", A)
def configure_declare(ctx: Context) -> None:
    allowed = ctx.name("ok")
    ch = _channel_as(ctx, configure=_only(allowed))
    ctx.queue(ch, name=allowed + "-q")
    denied = ctx.name("denied")
    ctx.track_queue(denied)
    ctx.channel_error(ch, lambda: ch.queue_declare(denied), 403, "ACCESS_REFUSED")


@case("access/configure-regex-limits-exchange-declare-403", A)
def configure_exchange(ctx: Context) -> None:
    ch = _channel_as(ctx, configure=NOTHING)
    x = ctx.name("x")
    ctx.track_exchange(x)
    ctx.channel_error(ch, lambda: ch.exchange_declare(x, exchange_type="fanout"), 403)


@case("access/configure-regex-limits-queue-delete-403", A)
def configure_delete(ctx: Context) -> None:
    q = ctx.queue(ctx.channel())
    ch = _channel_as(ctx, configure=NOTHING)
    ctx.channel_error(ch, lambda: ch.queue_delete(q), 403)


@case("access/passive-declare-needs-no-configure-permission", A)
def passive_no_configure(ctx: Context) -> None:
    q = ctx.queue(ctx.channel())
    ch = _channel_as(ctx, configure=NOTHING)
    ch.queue_declare(q, passive=True)


@case("access/write-regex-limits-publish-403", A)
def write_publish(ctx: Context) -> None:
    x = ctx.exchange(ctx.channel(), "fanout")
    ch = _channel_as(ctx, write=NOTHING)
    ctx.channel_error(ch, lambda: ch.basic_publish(x, "", b"no"), 403, "ACCESS_REFUSED")


@case("access/default-exchange-publish-needs-write-on-amq-default", A)
def write_default(ctx: Context) -> None:
    """Publishing through the default exchange checks write permission on the resource
    named "amq.default"."""
    q = ctx.queue(ctx.channel())
    ch = _channel_as(ctx, write="^amq\\.default$")
    ch.basic_publish("", q, b"allowed")
    ctx.sync(ch)
    ch2 = _channel_as(ctx, write=_only(q))
    ctx.channel_error(ch2, lambda: ch2.basic_publish("", q, b"denied"), 403)


@case("access/read-regex-limits-consume-403", A)
def read_consume(ctx: Context) -> None:
    q = ctx.queue(ctx.channel())
    ch = _channel_as(ctx, read=NOTHING)
    ctx.channel_error(ch, lambda: ch.basic_consume(q, lambda *a: None), 403)


@case("access/read-regex-limits-basic-get-403", A)
def read_get(ctx: Context) -> None:
    q = ctx.queue(ctx.channel())
    ch = _channel_as(ctx, read=NOTHING)
    ctx.channel_error(ch, lambda: ch.basic_get(q), 403)


@case("access/read-regex-limits-queue-purge-403", A)
def read_purge(ctx: Context) -> None:
    q = ctx.queue(ctx.channel())
    ch = _channel_as(ctx, read=NOTHING)
    ctx.channel_error(ch, lambda: ch.queue_purge(q), 403)


@case("access/queue-bind-needs-write-on-queue-403", A)
def bind_write_queue(ctx: Context) -> None:
    ch0 = ctx.channel()
    q = ctx.queue(ch0)
    x = ctx.exchange(ch0, "fanout")
    ch = _channel_as(ctx, write=NOTHING)
    ctx.channel_error(ch, lambda: ch.queue_bind(q, x, ""), 403)


@case("access/queue-bind-needs-read-on-exchange-403", A)
def bind_read_exchange(ctx: Context) -> None:
    ch0 = ctx.channel()
    q = ctx.queue(ch0)
    x = ctx.exchange(ch0, "fanout")
    ch = _channel_as(ctx, read=_only(q))
    ctx.channel_error(ch, lambda: ch.queue_bind(q, x, ""), 403)


@case("access/queue-bind-allowed-with-write-queue-and-read-exchange", A)
def bind_ok(ctx: Context) -> None:
    ch0 = ctx.channel()
    q = ctx.queue(ch0)
    x = ctx.exchange(ch0, "fanout")
    ch = _channel_as(ctx, configure=NOTHING, write=_only(q), read=_only(x))
    ch.queue_bind(q, x, "")
    ch0.basic_publish(x, "", b"bound-by-user")
    eq(ctx.must_get(ch0, q).body, b"bound-by-user", "body")


@case("access/user-id-must-be-the-connecting-user", A)
def user_id(ctx: Context) -> None:
    q = ctx.queue(ctx.channel())
    user, pw = _user(ctx)
    ch = _connect_as(ctx, user, pw).channel()
    ch.basic_publish("", q, b"mine", pika.BasicProperties(user_id=user))
    ctx.sync(ch)
    ctx.channel_error(ch, lambda: ch.basic_publish("", q, b"x", pika.BasicProperties(
        user_id=ctx.user)), 406)


@case("access/deleted-user-cannot-log-in", A)
def deleted_user(ctx: Context) -> None:
    user, pw = _user(ctx)
    status, _ = ctx.http("DELETE", f"/api/users/{quote(user, safe='')}")
    eq(status, 204, "DELETE status")
    try:
        conn = _connect_as(ctx, user, pw)
    except (pex.ProbableAuthenticationError, pex.ConnectionClosedByBroker):
        return
    conn.close()
    raise CaseFailure("login refused", "an open connection")


# -- virtual hosts ------------------------------------------------------------------------------


def _vhost(ctx: Context) -> str:
    """A new vhost with full permissions for the suite's user; deleted afterwards."""
    vh = ctx.name("vhost")
    status, body = ctx.http("PUT", f"/api/vhosts/{quote(vh, safe='')}", {})
    check(status in (201, 204), "vhost created (201/204)", f"{status} {body}")
    ctx.on_cleanup(lambda: ctx.http("DELETE", f"/api/vhosts/{quote(vh, safe='')}"))
    status, body = ctx.http("PUT", f"/api/permissions/{quote(vh, safe='')}/"
                                   f"{quote(ctx.user, safe='')}",
                            {"configure": ".*", "write": ".*", "read": ".*"})
    check(status in (201, 204), "permissions set (201/204)", f"{status} {body}")
    return vh


def _connect_vhost(ctx: Context, vh: str) -> BlockingConnection:
    return ctx.connect(virtual_host=vh)


@case("vhost/new-vhost-has-the-standard-exchanges", A)
def vhost_exchanges(ctx: Context) -> None:
    vh = _vhost(ctx)
    ch = _connect_vhost(ctx, vh).channel()
    for x in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        ch.exchange_declare(x, passive=True)


@case("vhost/queues-are-isolated-between-vhosts", A)
def vhost_isolation(ctx: Context) -> None:
    vh = _vhost(ctx)
    q = ctx.queue(ctx.channel())
    ch = _connect_vhost(ctx, vh).channel()
    ctx.channel_error(ch, lambda: ch.queue_declare(q, passive=True), 404)


@case("vhost/deleting-vhost-closes-its-connections-320-CONNECTION_FORCED", A)
def vhost_delete(ctx: Context) -> None:
    vh = _vhost(ctx)
    conn = _connect_vhost(ctx, vh)
    conn.channel()
    status, _ = ctx.http("DELETE", f"/api/vhosts/{quote(vh, safe='')}")
    eq(status, 204, "DELETE status")
    try:
        ctx.pump(conn, lambda: False, 3)
    except pex.ConnectionClosedByBroker as exc:
        ctx.note(f"Connection.Close {exc.reply_code} {exc.reply_text!r}")
        eq(exc.reply_code, 320, "connection.close code")
        return
    raise CaseFailure("connection.close 320", "connection still open")


@case("http-api/closing-a-connection-320-CONNECTION_FORCED", "http-api")
def api_close_connection(ctx: Context) -> None:
    conn = ctx.connect()
    conn.channel()
    name = None
    deadline = time.monotonic() + 8
    while name is None and time.monotonic() < deadline:
        status, body = ctx.http("GET", "/api/connections")
        for c in body if status == 200 else []:
            if (c.get("client_properties") or {}).get("connection_name") == ctx.case_id:
                name = c.get("name")
        if name is None:
            time.sleep(0.2)
    check(name is not None, "the connection listed by the API", "not listed")
    status, _ = ctx.http("DELETE", f"/api/connections/{quote(str(name), safe='')}")
    eq(status, 204, "DELETE status")
    try:
        ctx.pump(conn, lambda: False, 3)
    except pex.ConnectionClosedByBroker as exc:
        ctx.note(f"Connection.Close {exc.reply_code} {exc.reply_text!r}")
        eq(exc.reply_code, 320, "connection.close code")
        return
    raise CaseFailure("connection.close 320", "connection still open")
