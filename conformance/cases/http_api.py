"""The management HTTP API (RabbitMQ paths and JSON shapes); skipped without --http-url.

Mostly what is immediate is checked: definitions (queues, exchanges, bindings, vhosts),
health checks and authentication. Statistics lag by the broker's stats interval (5 s in
RabbitMQ by default), so the one statistics case, an exchange's ``message_stats``, polls
for them with a deadline.
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
from typing import Any
from urllib.parse import quote

from conformance.framework import Context, case, check, eq

A = "http-api"


def _vh(ctx: Context) -> str:
    return quote(ctx.vhost, safe="")


@case("http-api/overview-has-version-and-node", A)
def overview(ctx: Context) -> None:
    status, body = ctx.http("GET", "/api/overview")
    eq(status, 200, "HTTP status")
    for key in ("management_version", "node", "rabbitmq_version"):
        check(key in body, f"key {key!r}", sorted(body)[:20])


@case("http-api/bad-credentials-401", A)
def unauthorised(ctx: Context) -> None:
    ctx.http("GET", "/api/overview")  # skips without --http-url
    u = urllib.parse.urlsplit(ctx.settings.http_url or "")
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 15672, timeout=5)
    conn.request("GET", "/api/overview", headers={"Authorization": "Basic bm9wZTpub3Bl"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    eq(resp.status, 401, "HTTP status")


@case("http-api/declared-queue-listed-with-arguments", A)
def queue_listed(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, durable=True, arguments={"x-max-length": 7})
    status, body = ctx.http("GET", f"/api/queues/{_vh(ctx)}/{quote(q, safe='')}")
    eq(status, 200, "HTTP status")
    eq((body.get("name"), body.get("durable"), body.get("arguments")),
       (q, True, {"x-max-length": 7}), "name/durable/arguments")


@case("http-api/missing-queue-404", A)
def queue_missing(ctx: Context) -> None:
    status, _ = ctx.http("GET", f"/api/queues/{_vh(ctx)}/{ctx.name()}")
    eq(status, 404, "HTTP status")


@case("http-api/put-queue-then-amqp-passive-declare-finds-it", A)
def put_queue(ctx: Context) -> None:
    q = ctx.name()
    ctx.track_queue(q)
    status, _ = ctx.http("PUT", f"/api/queues/{_vh(ctx)}/{q}",
                         {"durable": False, "auto_delete": False, "arguments": {}})
    check(status in (201, 204), "201/204", status)
    ctx.channel().queue_declare(q, passive=True)


@case("http-api/delete-queue-removes-it", A)
def delete_queue(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    status, _ = ctx.http("DELETE", f"/api/queues/{_vh(ctx)}/{q}")
    eq(status, 204, "HTTP status")
    ctx.channel_error(ch, lambda: ch.queue_declare(q, passive=True), 404)


@case("http-api/exchange-listed-with-type", A)
def exchange_listed(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic")
    status, body = ctx.http("GET", f"/api/exchanges/{_vh(ctx)}/{x}")
    eq(status, 200, "HTTP status")
    eq((body.get("name"), body.get("type")), (x, "topic"), "name/type")


@case("http-api/binding-listed", A)
def binding_listed(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, x, "rk.http")
    status, body = ctx.http("GET", f"/api/bindings/{_vh(ctx)}/e/{x}/q/{q}")
    eq(status, 200, "HTTP status")
    keys = [b.get("routing_key") for b in body]
    eq(keys, ["rk.http"], "binding routing keys")


@case("http-api/publish-and-get-through-api", A)
def publish_get(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    status, body = ctx.http("POST", f"/api/exchanges/{_vh(ctx)}/amq.default/publish",
                            {"properties": {}, "routing_key": q, "payload": "via-http",
                             "payload_encoding": "string"})
    eq((status, body), (200, {"routed": True}), "publish response")
    eq(ctx.must_get(ch, q).body, b"via-http", "body")


@case("http-api/health-check-alarms-ok", A)
def health_alarms(ctx: Context) -> None:
    status, body = ctx.http("GET", "/api/health/checks/alarms")
    eq((status, body), (200, {"status": "ok"}), "response")


@case("http-api/health-check-port-listener-amqp", A)
def health_port(ctx: Context) -> None:
    port = ctx.params.port
    status, body = ctx.http("GET", f"/api/health/checks/port-listener/{port}")
    eq((status, body), (200, {"status": "ok", "port": port}), "response")


@case("http-api/health-check-port-listener-unknown-503", A)
def health_port_bad(ctx: Context) -> None:
    status, body = ctx.http("GET", "/api/health/checks/port-listener/1")
    eq((status, body.get("status"), body.get("missing")), (503, "failed", 1), "response")


@case("http-api/aliveness-test-ok", A)
def aliveness(ctx: Context) -> None:
    status, body = ctx.http("GET", f"/api/aliveness-test/{_vh(ctx)}")
    eq((status, body), (200, {"status": "ok"}), "response")


@case("http-api/connection-name-visible", A)
def connection_name(ctx: Context) -> None:
    """The client's connection_name property is shown by /api/connections."""
    ctx.connect()
    deadline = time.monotonic() + 8
    names: list[Any] = []
    while time.monotonic() < deadline:
        status, body = ctx.http("GET", "/api/connections")
        eq(status, 200, "HTTP status")
        names = [c.get("client_properties", {}).get("connection_name") for c in body]
        if ctx.case_id in names:
            return
        time.sleep(0.25)
    check(False, f"a connection named {ctx.case_id!r}", names[:10])


@case("http-api/vhost-listed", A)
def vhost_listed(ctx: Context) -> None:
    status, body = ctx.http("GET", f"/api/vhosts/{_vh(ctx)}")
    eq((status, body.get("name")), (200, ctx.vhost), "response")


@case("http-api/no-credentials-401-with-www-authenticate", A)
def no_credentials(ctx: Context) -> None:
    ctx.http("GET", "/api/overview")  # skips without --http-url
    u = urllib.parse.urlsplit(ctx.settings.http_url or "")
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 15672, timeout=5)
    conn.request("GET", "/api/overview")
    resp = conn.getresponse()
    resp.read()
    conn.close()
    eq(resp.status, 401, "HTTP status")
    check("Basic" in (resp.getheader("WWW-Authenticate") or ""), "a Basic challenge",
          resp.getheader("WWW-Authenticate"))


@case("http-api/whoami", A)
def whoami(ctx: Context) -> None:
    status, body = ctx.http("GET", "/api/whoami")
    eq((status, body.get("name")), (200, ctx.user), "response")


@case("http-api/queue-list-contains-declared-queue", A)
def queue_list(ctx: Context) -> None:
    q = ctx.queue(ctx.channel())
    status, body = ctx.http("GET", f"/api/queues/{_vh(ctx)}")
    eq(status, 200, "HTTP status")
    check(q in [x.get("name") for x in body], f"{q} listed", len(body))


@case("http-api/exchange-list-contains-default-and-amq", A)
def exchange_list(ctx: Context) -> None:
    status, body = ctx.http("GET", f"/api/exchanges/{_vh(ctx)}")
    eq(status, 200, "HTTP status")
    names = {x.get("name") for x in body}
    for n in ("", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        check(n in names, f"exchange {n!r} listed", sorted(names)[:10])


@case("http-api/definitions-export-has-queue-exchange-binding", A)
def definitions(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct", durable=True)
    q = ctx.queue(ch, durable=True)
    ch.queue_bind(q, x, "defs")
    status, body = ctx.http("GET", "/api/definitions")
    eq(status, 200, "HTTP status")
    check(q in [i.get("name") for i in body.get("queues", [])], "queue in definitions", q)
    check(x in [i.get("name") for i in body.get("exchanges", [])], "exchange in definitions", x)
    check(any(b.get("source") == x and b.get("destination") == q
              and b.get("routing_key") == "defs" for b in body.get("bindings", [])),
          "binding in definitions", "missing")


@case("http-api/get-messages-from-queue", A)
def api_get(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"peek")
    ctx.sync(ch)
    status, body = ctx.http("POST", f"/api/queues/{_vh(ctx)}/{q}/get",
                            {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    eq(status, 200, "HTTP status")
    eq([(m.get("payload"), m.get("routing_key")) for m in body], [("peek", q)], "messages")
    ctx.get_none(ch, q, settle=0)


@case("http-api/purge-queue-contents", A)
def api_purge(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"1")
    ctx.sync(ch)
    status, _ = ctx.http("DELETE", f"/api/queues/{_vh(ctx)}/{q}/contents")
    eq(status, 204, "HTTP status")
    ctx.get_none(ch, q, settle=0.1)


@case("http-api/put-exchange-and-post-binding-then-amqp-routes", A)
def api_exchange_binding(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.name("x")
    ctx.track_exchange(x)
    q = ctx.queue(ch)
    status, _ = ctx.http("PUT", f"/api/exchanges/{_vh(ctx)}/{x}",
                         {"type": "topic", "durable": False, "auto_delete": False})
    check(status in (201, 204), "201/204", status)
    status, _ = ctx.http("POST", f"/api/bindings/{_vh(ctx)}/e/{x}/q/{q}",
                         {"routing_key": "api.*", "arguments": {}})
    eq(status, 201, "binding POST status")
    ch.basic_publish(x, "api.route", b"via-api-binding")
    eq(ctx.must_get(ch, q).body, b"via-api-binding", "body")


@case("http-api/nodes-listed", A)
def nodes(ctx: Context) -> None:
    status, body = ctx.http("GET", "/api/nodes")
    eq(status, 200, "HTTP status")
    check(isinstance(body, list) and len(body) >= 1 and "name" in body[0], "a node with a name",
          body if not isinstance(body, list) else body[:1])


for _check in ("virtual-hosts", "local-alarms", "node-is-quorum-critical"):

    def _health(ctx: Context, name: str = _check) -> None:
        status, body = ctx.http("GET", f"/api/health/checks/{name}")
        eq((status, body.get("status")), (200, "ok"), "response")

    case(f"http-api/health-check-{_check}-ok", A)(_health)


@case("http-api/port-listener-non-integer-400", A)
def port_bad(ctx: Context) -> None:
    status, _ = ctx.http("GET", "/api/health/checks/port-listener/notaport")
    eq(status, 400, "HTTP status")


@case("http-api/aliveness-test-unknown-vhost-404", A)
def aliveness_404(ctx: Context) -> None:
    status, _ = ctx.http("GET", f"/api/aliveness-test/{ctx.name('vhost')}")
    eq(status, 404, "HTTP status")


@case("http-api/exchange-message-stats-publish-in-and-out", A)
def exchange_message_stats(ctx: Context) -> None:
    """RabbitMQ 3.10.8's exchange statistics: ``publish_in`` counts the messages published
    to an exchange, ``publish_out`` the copies it routed, one per queue reached (counted
    on the exchange the publisher named, not on the exchanges the copies passed through);
    ``publish_out`` is absent while nothing was routed, ``message_stats`` is absent for an
    exchange never published to."""
    ch = ctx.channel()
    fan, unrouted, idle = (ctx.exchange(ch, "fanout"), ctx.exchange(ch, "direct"),
                           ctx.exchange(ch, "direct"))
    inner = ctx.exchange(ch, "fanout")  # fan -> inner -> a third queue
    ctx.bound_queue(ch, fan)
    ctx.bound_queue(ch, fan)
    ch.exchange_bind(inner, fan)
    ctx.bound_queue(ch, inner)
    for _ in range(3):
        ch.basic_publish(fan, "", b"m")
        ch.basic_publish(unrouted, "nowhere", b"m")

    def stats(x: str) -> Any:
        status, body = ctx.http("GET", f"/api/exchanges/{_vh(ctx)}/{quote(x, safe='')}")
        eq(status, 200, "HTTP status")
        return body.get("message_stats")

    deadline = time.monotonic() + 20  # RabbitMQ emits statistics every 5 s
    got: Any = None
    while time.monotonic() < deadline:
        got = stats(fan)
        if got and got.get("publish_out") == 9 and (stats(unrouted) or {}).get("publish_in"):
            break
        time.sleep(0.5)
    check(bool(got), "message_stats of the fanout exchange", got)
    eq((got.get("publish_in"), got.get("publish_out")), (3, 9),
       "publish_in/publish_out of an exchange routing to three queues")
    check("rate" in got["publish_in_details"] and "rate" in got["publish_out_details"],
          "publish_in_details.rate and publish_out_details.rate", got)
    routed_nowhere = stats(unrouted) or {}
    eq((routed_nowhere.get("publish_in"), "publish_out" in routed_nowhere), (3, False),
       "an exchange that routed nothing: publish_in, no publish_out")
    eq(stats(inner), None, "message_stats of an exchange only routed through")
    eq(stats(idle), None, "message_stats of an exchange never published to")
