"""The management API the way client libraries drive it (AMQPStorm's management client,
rabbitmqadmin-style scripts): paths, status codes, headers and bodies as RabbitMQ 3.10.8
answers them, including where it answers with no body at all. Skipped without --http-url.

RabbitMQ lists a new connection or channel only once its statistics were emitted (every
5 s), so the cases that look one up poll for it with a deadline.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from base64 import b64encode
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions as pex

from conformance.framework import CaseFailure, Context, Skip, case, check, eq

A = "http-api"
LISTED_WITHIN = 20.0  # seconds: RabbitMQ's stats interval is 5 s


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    raw: bytes

    def json(self) -> Any:
        return json.loads(self.raw)


def _request(ctx: Context, method: str, path: str, body: Any = None, raw: bytes | None = None,
             headers: dict[str, str] | None = None) -> Reply:
    """One request with the case's credentials; headers come back with lower-case names."""
    if not ctx.settings.http_url:
        raise Skip("needs --http-url (management API)")
    u = urllib.parse.urlsplit(ctx.settings.http_url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 15672,
                                      timeout=ctx.settings.timeout)
    auth = b64encode(f"{ctx.user}:{ctx.password}".encode()).decode()
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={
        "Authorization": f"Basic {auth}", "Content-Type": "application/json",
        **(headers or {})})
    resp = conn.getresponse()
    reply = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    conn.close()
    return reply


def _vh(ctx: Context) -> str:
    return quote(ctx.vhost, safe="")


def _poll(what: str, find: Callable[[], Any], within: float = LISTED_WITHIN) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = find()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise CaseFailure(what, f"nothing within {within:.0f} s")
        time.sleep(0.25)


# -- 3.x node health check --------------------------------------------------------------------

@case("http-api/healthchecks-node-ok", A)
def healthchecks_node(ctx: Context) -> None:
    for path in ("/api/healthchecks/node", "/api/healthchecks/node/"):
        r = _request(ctx, "GET", path)
        eq((r.status, r.json()), (200, {"status": "ok"}), f"GET {path}")
    node = _request(ctx, "GET", "/api/overview").json()["node"]
    r = _request(ctx, "GET", f"/api/healthchecks/node/{quote(node, safe='')}")
    eq((r.status, r.json()), (200, {"status": "ok"}), "GET the node by name")


@case("http-api/healthchecks-node-unknown-404", A)
def healthchecks_unknown(ctx: Context) -> None:
    r = _request(ctx, "GET", "/api/healthchecks/node/nosuch@nowhere")
    eq((r.status, r.json()), (404, {"error": "Object Not Found", "reason": "Not Found"}),
       "answer")


# -- users ---------------------------------------------------------------------------------

def _user(ctx: Context) -> str:
    name = ctx.name("user")
    r = _request(ctx, "PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})
    eq(r.status, 201, "user created")
    ctx.on_cleanup(lambda: _request(ctx, "DELETE", f"/api/users/{name}"))
    return name


@case("http-api/users-bulk-delete-204-no-body", A)
def bulk_delete(ctx: Context) -> None:
    names = [_user(ctx), _user(ctx)]
    r = _request(ctx, "POST", "/api/users/bulk-delete", {"users": names})
    eq((r.status, r.raw), (204, b""), "status and body")
    eq([_request(ctx, "GET", f"/api/users/{n}").status for n in names], [404, 404],
       "users gone")


@case("http-api/users-bulk-delete-stops-at-unknown-user-400", A)
def bulk_delete_unknown(ctx: Context) -> None:
    first, last = _user(ctx), _user(ctx)
    missing = ctx.name("nouser")
    r = _request(ctx, "POST", "/api/users/bulk-delete", {"users": [first, missing, last]})
    eq((r.status, r.json()), (400, {"error": "bad_request",
                                    "reason": ["no_such_user", missing]}), "answer")
    eq([_request(ctx, "GET", f"/api/users/{n}").status for n in (first, last)], [404, 200],
       "deleted up to the unknown user")


@case("http-api/users-bulk-delete-malformed-400", A)
def bulk_delete_malformed(ctx: Context) -> None:
    r = _request(ctx, "POST", "/api/users/bulk-delete", {"names": []})
    eq((r.status, r.json()), (400, {"error": "bad_request",
                                    "reason": "[{key_missing,users}]"}), "no users key")
    r = _request(ctx, "POST", "/api/users/bulk-delete", raw=b"{not json")
    eq((r.status, r.json()), (400, {"error": "bad_request", "reason": "not_json"}),
       "not JSON")


# -- bindings --------------------------------------------------------------------------------

@case("http-api/post-binding-201-empty-body-relative-location", A)
def post_binding(ctx: Context) -> None:
    ch = ctx.channel()
    x, q = ctx.exchange(ch, "direct"), ctx.queue(ch)
    base = f"/api/bindings/{_vh(ctx)}/e/{quote(x, safe='')}/q/{quote(q, safe='')}"
    r = _request(ctx, "POST", base, {"routing_key": "rk", "arguments": {}})
    eq((r.status, r.raw, r.headers.get("location")), (201, b"", f"{q}/rk"),
       "status, body, Location")
    got = _request(ctx, "GET", urllib.parse.urljoin(base, r.headers["location"]))
    eq((got.status, got.json().get("routing_key"), got.json().get("destination")),
       (200, "rk", q), "the binding at that Location")
    ctx.publish(ch, x, "rk", b"routed")
    eq(ctx.must_get(ch, q).body, b"routed", "the binding routes")


@case("http-api/post-exchange-binding-with-arguments-location", A)
def post_binding_args(ctx: Context) -> None:
    ch = ctx.channel()
    src, dest = ctx.exchange(ch, "headers"), ctx.exchange(ch, "fanout")
    base = f"/api/bindings/{_vh(ctx)}/e/{quote(src, safe='')}/e/{quote(dest, safe='')}"
    r = _request(ctx, "POST", base, {"routing_key": "", "arguments": {"x-match": "any"}})
    loc = r.headers.get("location", "")
    check(r.status == 201 and r.raw == b"" and loc.startswith(f"{dest}/~"),
          f"201, no body, Location {dest}/~<hash>", f"{r.status} {r.raw!r} {loc!r}")
    got = _request(ctx, "GET", urllib.parse.urljoin(base, loc))
    eq((got.status, got.json().get("arguments")), (200, {"x-match": "any"}), "binding")
    eq(_request(ctx, "DELETE", urllib.parse.urljoin(base, loc)).status, 204, "delete")


@case("http-api/binding-properties-key-percent-encodes-the-routing-key", A)
def binding_properties_key_encoded(ctx: Context) -> None:
    """RabbitMQ 3.10.8 names a binding by its routing key form-encoded (``a.#`` is
    ``a.%23``, a space ``+``, ``~`` ``%7E``), and deletes it by that name
    (``rabbitmqadmin delete binding ... properties_key=a.%23``)."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    base = f"/api/bindings/{_vh(ctx)}/e/amq.topic/q/{quote(q, safe='')}"
    keys = {"a.#": "a.%23", "b c/*~": "b+c%2F%2A%7E"}
    for key, expected in keys.items():
        r = _request(ctx, "POST", base, {"routing_key": key})
        eq((r.status, r.headers.get("location")), (201, f"{q}/{quote(expected, safe='')}"),
           f"status, Location for {key!r}")
    listed = {b["routing_key"]: b["properties_key"] for b in _request(ctx, "GET", base).json()}
    eq(listed, keys, "properties_key by routing key")
    eq(_request(ctx, "DELETE", f"{base}/{quote('a.%23', safe='')}").status, 204, "delete")
    left = [b["routing_key"] for b in _request(ctx, "GET", base).json()]
    eq(left, ["b c/*~"], "bindings left")


@case("http-api/post-binding-missing-exchange-404-not_found", A)
def post_binding_missing(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    x = ctx.name("x")
    r = _request(ctx, "POST", f"/api/bindings/{_vh(ctx)}/e/{x}/q/{q}", {"routing_key": "k"})
    eq((r.status, r.json()), (404, {"error": "not_found", "reason":
                                    f"no exchange '{x}' in vhost '{ctx.vhost}'"}), "answer")


# -- vhosts ---------------------------------------------------------------------------------

@case("http-api/put-vhost-grants-creator-and-connect-at-once", A)
def put_vhost(ctx: Context) -> None:
    name = ctx.name("vh")
    r = _request(ctx, "PUT", f"/api/vhosts/{name}")
    ctx.on_cleanup(lambda: _request(ctx, "DELETE", f"/api/vhosts/{name}"))
    eq((r.status, r.raw), (201, b""), "created, no body")
    perm = _request(ctx, "GET", f"/api/permissions/{name}/{quote(ctx.user, safe='')}")
    eq((perm.status, {k: perm.json().get(k) for k in ("configure", "write", "read")}),
       (200, {"configure": ".*", "write": ".*", "read": ".*"}), "creator's permissions")
    params = pika.URLParameters(ctx.settings.url)
    params.virtual_host = name
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare("", exclusive=True)
    finally:
        conn.close()
    eq(_request(ctx, "PUT", f"/api/vhosts/{name}").status, 204, "a second PUT")


# -- pagination -------------------------------------------------------------------------------

@case("http-api/pagination-empty-result-has-page-count-0", A)
def pagination_empty(ctx: Context) -> None:
    ctx.queue(ctx.channel())
    nothing = ctx.name("none")
    r = _request(ctx, "GET", f"/api/queues/{_vh(ctx)}?page=1&page_size=100&name={nothing}"
                 "&pagination=true")
    eq(r.status, 200, "HTTP status")
    body = r.json()
    eq({k: body.get(k) for k in ("filtered_count", "item_count", "items", "page",
                                 "page_count", "page_size")},
       {"filtered_count": 0, "item_count": 0, "items": [], "page": 1, "page_count": 0,
        "page_size": 100}, "envelope")
    check(isinstance(body.get("total_count"), int) and body["total_count"] >= 1,
          "total_count counting queues before the name filter", body.get("total_count"))


@case("http-api/pagination-name-filter-and-pages", A)
def pagination_pages(ctx: Context) -> None:
    ch = ctx.channel()
    stem = ctx.name("pg")
    for i in range(3):
        ctx.queue(ch, name=f"{stem}-{i}")
    path = f"/api/queues/{_vh(ctx)}?page=2&page_size=2&name={stem.upper()}&sort=name"
    r = _request(ctx, "GET", path)
    eq(r.status, 200, "HTTP status")
    body = r.json()
    eq((body["filtered_count"], body["item_count"], body["page_count"],
        [i["name"] for i in body["items"]]), (3, 1, 2, [f"{stem}-2"]),
       "second page of the name filter (matched without regard to case)")
    r = _request(ctx, "GET", path.replace("page=2", "page=3"))
    eq((r.status, r.json()), (400, {"error": "page_out_of_range", "reason":
                                    "Page out of range, page: 3 page size: 2, len: 3"}),
       "page past the end")


@case("http-api/pagination-invalid-parameters-400", A)
def pagination_invalid(ctx: Context) -> None:
    for query, size in (("page=0&page_size=100", 100), ("page=1&page_size=501", 501)):
        page = 0 if query.startswith("page=0") else 1
        r = _request(ctx, "GET", f"/api/queues?{query}")
        eq((r.status, r.json()), (400, {"error": "invalid_pagination_parameters", "reason":
            f"Invalid pagination parameters: page number {page}, page size {size}"}), query)
    r = _request(ctx, "GET", "/api/queues?page=one")
    eq((r.status, r.json()), (400, {"error": "bad_request",
                                    "reason": "Pagination parameters are invalid"}), "page=one")


# -- connections and channels -------------------------------------------------------------------

def _open(ctx: Context) -> tuple[pika.BlockingConnection, str]:
    tag = ctx.name("client")
    params = pika.URLParameters(ctx.settings.url)
    params.client_properties = {"connection_name": tag, "app-id": tag}
    conn = pika.BlockingConnection(params)
    ctx.on_cleanup(lambda: conn.close() if conn.is_open else None)
    return conn, tag


def _find_connection(ctx: Context, tag: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        r = _request(ctx, "GET", "/api/connections?page=1&page_size=100&pagination=true")
        if r.status != 200:
            raise CaseFailure("200", r.status, "GET /api/connections")
        for item in r.json()["items"]:
            if (item.get("client_properties") or {}).get("app-id") == tag:
                return dict(item)
        return None

    return dict(_poll("the connection listed with its client properties", find))


@case("http-api/connection-found-by-client-properties-and-closed-with-x-reason", A, slow=True)
def close_connection(ctx: Context) -> None:
    conn, tag = _open(ctx)
    item = _find_connection(ctx, tag)
    eq((item.get("user_provided_name"), item.get("user"), item.get("vhost")),
       (tag, ctx.user, ctx.vhost), "user_provided_name, user, vhost")
    path = f"/api/connections/{quote(item['name'], safe='')}"
    got = _request(ctx, "GET", path)
    eq((got.status, got.json()["client_properties"].get("connection_name")), (200, tag),
       "GET the connection")
    r = _request(ctx, "DELETE", path, raw=json.dumps({"name": item["name"]}).encode(),
                 headers={"X-Reason": "closed by the case"})
    eq((r.status, r.raw), (204, b""), "DELETE status and body")
    try:
        ctx.pump(conn, lambda: not conn.is_open, 5)
        conn.channel()
    except pex.ConnectionClosedByBroker as exc:
        eq((exc.reply_code, exc.reply_text), (320, "CONNECTION_FORCED - closed by the case"),
           "what the client was told")
    else:
        raise CaseFailure("connection.close 320", "the connection still open")
    # RabbitMQ's connection tracking forgets a closed connection a moment later (seen:
    # a DELETE right after the close still answered 204), so poll for the 404
    _poll("closing it again: 404", lambda: True if _request(ctx, "DELETE", path).status == 404
          else None)


@case("http-api/channels-listed-and-found-by-name", A, slow=True)
def channels(ctx: Context) -> None:
    conn, tag = _open(ctx)
    conn.channel()
    item = _find_connection(ctx, tag)

    def find() -> dict[str, Any] | None:
        r = _request(ctx, "GET", "/api/channels?page=1&page_size=100&pagination=true")
        for ch in r.json()["items"]:
            if ch.get("connection_details", {}).get("name") == item["name"]:
                return dict(ch)
        return None

    ch = _poll("the channel listed", find)
    eq((ch.get("number"), ch.get("name"), ch.get("user")),
       (1, f"{item['name']} (1)", ctx.user), "number, name, user")
    r = _request(ctx, "GET", f"/api/channels/{quote(ch['name'], safe='')}")
    eq((r.status, r.json().get("number")), (200, 1), "GET the channel")
    r = _request(ctx, "GET", f"/api/connections/{quote(item['name'], safe='')}/channels")
    eq((r.status, [c.get("number") for c in r.json()]), (200, [1]), "the connection's channels")
