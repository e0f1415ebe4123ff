"""The web UI's server side without a browser: static files, login sessions, paging,
rate samples and topic permissions, against a real amqpd over HTTP."""

from __future__ import annotations

import http.cookiejar
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration._http import Api, q
from tests.integration.webui_support import module_broker, uid
from tests.support.brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    yield from module_broker(tmp_path_factory, {"AMQPD_STATS_INTERVAL": "0.5"})


class Browser:
    """A cookie-keeping HTTP client, like the page's fetch() (no Authorization header)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def call(self, method: str, path: str, body: Any = None, ui: bool = True,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if ui:
            req.add_header("X-Requested-With", "amqpd-ui")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with self.opener.open(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()


# ---------------------------------------------------------------------------- static files
def test_the_ui_is_served_at_the_root_with_its_assets(broker: BrokerProcess) -> None:
    b = Browser(broker.http_url)
    status, headers, body = b.call("GET", "/", ui=False)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'src="static/app.js"' in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    for path, kind in (("/static/app.js", "text/javascript"), ("/static/style.css", "text/css"),
                       ("/static/pages/queues.js", "text/javascript"),
                       ("/static/vendor/uplot/uPlot.iife.min.js", "text/javascript")):
        status, headers, body = b.call("GET", path, ui=False)
        assert status == 200, path
        assert headers["Content-Type"].startswith(kind), path
        assert body, path
    etag = b.call("GET", "/static/app.js", ui=False)[1]["ETag"]
    assert b.call("GET", "/static/app.js", ui=False, headers={"If-None-Match": etag})[0] == 304


def test_static_paths_cannot_leave_the_static_directory(broker: BrokerProcess) -> None:
    b = Browser(broker.http_url)
    for path in ("/static/..%2F..%2Fwebui.py", "/static/%2E%2E/webui.py", "/static/.hidden",
                 "/static/nope.js", "/static/vendor/uplot/..%2F..%2Findex.html"):
        status, _, body = b.call("GET", path, ui=False)
        assert status == 404, path
        assert json.loads(body)["error"] == "Object Not Found"


# ---------------------------------------------------------------------------- sessions
def test_login_sets_an_httponly_cookie_that_authenticates(broker: BrokerProcess) -> None:
    b = Browser(broker.http_url)
    assert b.call("GET", "/api/whoami")[0] == 401
    status, headers, body = b.call("POST", "/api/login", {"username": "guest", "password": "guest"})
    assert status == 200
    assert json.loads(body) == {"name": "guest", "tags": ["administrator"]}
    cookie = headers["Set-Cookie"]
    assert "amqpd_session=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "guest" not in cookie.split(";")[0]  # a random token, not the credentials
    status, _, body = b.call("GET", "/api/whoami")
    assert status == 200 and json.loads(body)["name"] == "guest"
    assert b.call("PUT", f"/api/queues/%2F/{uid('cookie-q')}", {})[0] == 201


def test_the_definitions_download_link_works_with_the_cookie(broker: BrokerProcess) -> None:
    b = Browser(broker.http_url)
    assert b.call("POST", "/api/login", {"username": "guest", "password": "guest"})[0] == 200
    status, headers, body = b.call("GET", "/api/definitions?download=defs.json", ui=False)
    assert status == 200
    assert headers["Content-Disposition"] == 'attachment; filename="defs.json"'
    assert "queues" in json.loads(body)


def test_cookie_writes_need_the_ui_header(broker: BrokerProcess) -> None:
    b = Browser(broker.http_url)
    assert b.call("POST", "/api/login", {"username": "guest", "password": "guest"})[0] == 200
    assert b.call("GET", "/api/overview", ui=False)[0] == 200
    status, _, body = b.call("PUT", f"/api/queues/%2F/{uid('csrf')}", {}, ui=False)
    assert status == 403
    assert "X-Requested-With" in json.loads(body)["reason"]


def test_failed_login_says_why_without_a_basic_challenge(api: Api, broker: BrokerProcess) -> None:
    b = Browser(broker.http_url)
    status, headers, body = b.call("POST", "/api/login", {"username": "guest", "password": "no"})
    assert status == 401 and "WWW-Authenticate" not in headers
    assert "Login failed" in json.loads(body)["reason"]
    name = uid("plain")
    api.put(f"/api/users/{name}", {"password": "pw", "tags": ""})
    status, _, body = b.call("POST", "/api/login", {"username": name, "password": "pw"})
    assert status == 401 and json.loads(body)["error"] == "not_authorised"
    status, _, _ = b.call("POST", "/api/login", {"username": 5})
    assert status == 400
    # the ordinary API still challenges clients that are not the UI
    assert api.as_user(None).get("/api/overview").headers["WWW-Authenticate"]


def test_logout_and_password_change_end_sessions(api: Api, broker: BrokerProcess) -> None:
    name = uid("admin")
    assert api.put(f"/api/users/{name}", {"password": "pw1", "tags": "administrator"}).status == 201
    first, second = Browser(broker.http_url), Browser(broker.http_url)
    for b in (first, second):
        assert b.call("POST", "/api/login", {"username": name, "password": "pw1"})[0] == 200
    assert first.call("POST", "/api/logout")[0] == 204
    assert first.call("GET", "/api/whoami")[0] == 401
    assert second.call("GET", "/api/whoami")[0] == 200
    assert api.put(f"/api/users/{name}", {"password": "pw2", "tags": "administrator"}).status == 204
    assert second.call("GET", "/api/whoami")[0] == 401


def test_tags_are_read_afresh_for_each_request(api: Api, broker: BrokerProcess) -> None:
    name = uid("mgr")
    api.put(f"/api/users/{name}", {"password": "pw", "tags": "administrator"})
    b = Browser(broker.http_url)
    assert b.call("POST", "/api/login", {"username": name, "password": "pw"})[0] == 200
    assert b.call("GET", "/api/users")[0] == 200
    user = api.get(f"/api/users/{name}").json()
    api.put(f"/api/users/{name}", {"password_hash": user["password_hash"], "tags": "management"})
    assert b.call("GET", "/api/users")[0] == 401
    assert b.call("GET", "/api/overview")[0] == 200


# ---------------------------------------------------------------------------- paging
@pytest.fixture(scope="module")
def paged_vhost(api: Api) -> str:
    vhost = uid("pg")
    assert api.put(f"/api/vhosts/{vhost}").status == 201
    api.put(f"/api/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    for i in range(25):
        assert api.put(f"/api/queues/{vhost}/q{i:03d}", {"durable": False}).status == 201
    api.put(f"/api/queues/{vhost}/Other", {"durable": False})
    for n in range(3):
        api.post(f"/api/exchanges/{vhost}/amq.default/publish",
                 {"routing_key": "q007", "payload": f"m{n}", "properties": {}})
    return vhost


def test_queue_pages_count_filter_and_sort_as_rabbitmq(api: Api, paged_vhost: str) -> None:
    r = api.get(f"/api/queues/{paged_vhost}?page=2&page_size=10&name=Q0&sort=name").json()
    assert {k: r[k] for k in ("page", "page_size", "page_count", "item_count",
                              "filtered_count", "total_count")} == {
        "page": 2, "page_size": 10, "page_count": 3, "item_count": 10,
        "filtered_count": 25, "total_count": 26}
    assert [i["name"] for i in r["items"]] == [f"q{i:03d}" for i in range(10, 20)]
    r = api.get(f"/api/queues/{paged_vhost}?page=1&page_size=3&sort=messages"
                "&sort_reverse=true&columns=name,messages").json()
    assert r["items"][0] == {"name": "q007", "messages": 3}
    r = api.get(f"/api/queues/{paged_vhost}?page=1&page_size=5&name=^q00[12]$"
                "&use_regex=true").json()
    assert [i["name"] for i in r["items"]] == ["q001", "q002"]
    empty = api.get(f"/api/queues/{paged_vhost}?page=1&name=nothing-like-this").json()
    assert empty["page_count"] == 0 and empty["items"] == [] and empty["total_count"] == 26


def test_a_slow_sort_key_gives_the_same_answer(api: Api, paged_vhost: str) -> None:
    """Sorting on a key the fast path does not know builds every view, same shape."""
    r = api.get(f"/api/queues/{paged_vhost}?page=1&page_size=4&sort=message_bytes"
                "&sort_reverse=true").json()
    assert r["items"][0]["name"] == "q007" and r["filtered_count"] == 26


def test_bad_pages_get_rabbitmqs_errors(api: Api, paged_vhost: str) -> None:
    r = api.get(f"/api/queues/{paged_vhost}?page=9&page_size=10")
    assert r.status == 400 and r.json()["error"] == "page_out_of_range"
    for query in ("page=0", "page=1&page_size=501", "page=1&page_size=0"):
        r = api.get(f"/api/queues/{paged_vhost}?{query}")
        assert r.status == 400 and r.json()["error"] == "invalid_pagination_parameters", query
    r = api.get(f"/api/queues/{paged_vhost}?page=x")
    assert r.status == 400 and r.json()["error"] == "bad_request"
    r = api.get(f"/api/queues/{paged_vhost}?page=1&name=(&use_regex=true")
    assert r.status == 400


def test_unpaged_lists_keep_their_plain_shape(api: Api, paged_vhost: str) -> None:
    items = api.get(f"/api/queues/{paged_vhost}?columns=name&name=other").json()
    assert items == [{"name": "Other"}]


# ---------------------------------------------------------------------------- rates
def test_overview_returns_rate_and_length_samples(api: Api, broker: BrokerProcess) -> None:
    queue = uid("rates")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.confirm_delivery()
        deadline = time.monotonic() + 20
        stats: dict[str, Any] = {}
        while time.monotonic() < deadline:
            for _ in range(20):
                ch.basic_publish("", queue, b"x")
            stats = api.get("/api/overview?msg_rates_age=60&msg_rates_incr=0.5"
                            "&lengths_age=60&lengths_incr=0.5").json()
            details = stats["message_stats"]["confirm_details"]
            if details["rate"] > 0 and len(details["samples"]) >= 3:
                break
        ms = stats["message_stats"]
        assert ms["confirm"] >= 20 and ms["confirm_details"]["rate"] > 0
        samples = ms["publish_details"]["samples"]
        assert len(samples) >= 3 and set(samples[0]) == {"sample", "timestamp"}
        stamps = [s["timestamp"] for s in samples]
        assert stamps == sorted(stamps, reverse=True)  # newest first, as RabbitMQ
        assert samples[0]["sample"] >= samples[-1]["sample"]
        assert {"avg", "avg_rate"} <= set(ms["publish_details"])
        lengths = stats["queue_totals"]["messages_ready_details"]
        assert lengths["samples"] and lengths["samples"][0]["sample"] >= 0
        plain = api.get("/api/overview").json()["message_stats"]["publish_details"]
        assert "samples" not in plain
        assert api.get("/api/overview?msg_rates_age=x").status == 400
    finally:
        conn.close()


def test_channels_report_their_confirm_rate(api: Api, broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for _ in range(5):
            ch.basic_publish("", "", b"x")  # unroutable to no queue: still confirmed
        chans = [c for c in api.get("/api/channels").json() if c["confirm"]]
        assert any(c["message_stats"].get("confirm", 0) >= 5 for c in chans)
    finally:
        conn.close()


def test_overview_names_the_plugins(api: Api) -> None:
    assert api.get("/api/overview").json()["amqpd_plugins"] == []


# ---------------------------------------------------------------------------- topic permissions
def test_topic_permissions_are_set_read_and_cleared(api: Api) -> None:
    name = uid("tp")
    api.put(f"/api/users/{name}", {"password": "pw", "tags": ""})
    body = {"exchange": "amq.topic", "write": "^a", "read": ".*"}
    assert api.put(f"/api/topic-permissions/%2F/{name}", body).status == 201
    assert api.put(f"/api/topic-permissions/%2F/{name}", {**body, "read": "^b"}).status == 204
    assert api.put(f"/api/topic-permissions/%2F/{name}",
                   {"exchange": "other", "write": ".*", "read": ".*"}).status == 201
    got = api.get(f"/api/topic-permissions/%2F/{name}").json()
    assert {"user": name, "vhost": "/", "exchange": "amq.topic", "write": "^a",
            "read": "^b"} in got and len(got) == 2
    assert len(api.get(f"/api/users/{name}/topic-permissions").json()) == 2
    exported = api.get("/api/definitions").json()["topic_permissions"]
    assert sum(1 for t in exported if t["user"] == name) == 2
    assert api.put(f"/api/topic-permissions/%2F/{name}",
                   {"exchange": "x", "write": "(", "read": ""}).status == 400
    assert api.delete(f"/api/topic-permissions/%2F/{name}/other").status == 204
    assert api.delete(f"/api/topic-permissions/%2F/{name}").status == 204
    assert api.get(f"/api/topic-permissions/%2F/{name}").status == 404
    assert api.delete(f"/api/topic-permissions/%2F/{name}").status == 404
    # RabbitMQ 3.10.8: 400 vhost_or_user_not_found to set for an unknown vhost
    assert api.put(f"/api/topic-permissions/{q('no-such-vhost')}/{name}", body).status == 400


def test_sessions_survive_a_broker_restart(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "amqpd")
    proc.start()
    try:
        b = Browser(proc.http_url)
        assert b.call("POST", "/api/login", {"username": "guest", "password": "guest"})[0] == 200
        port = proc.http_port
        proc.stop()
        proc.env["AMQPD_HTTP_PORT"] = str(port)
        proc.start()
        assert b.call("GET", "/api/whoami")[0] == 200
    finally:
        proc.stop()


def test_queue_connection_and_channel_samples_are_there_at_the_first_request(
        api: Api, broker: BrokerProcess) -> None:
    """RabbitMQ's object charts open with the last minute drawn: the samples are kept on
    the server per object (every stats tick, 0.5 s here) and come back as *_details."""
    queue, label = uid("history"), uid("history-conn")
    params = pika.URLParameters(broker.url)
    params.client_properties = {"connection_name": label}
    conn = pika.BlockingConnection(params)
    window = "?msg_rates_age=60&msg_rates_incr=0.5&lengths_age=60&lengths_incr=0.5" \
        "&data_rates_age=60&data_rates_incr=0.5"
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        deadline = time.monotonic() + 20
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            for _ in range(10):
                ch.basic_publish("", queue, b"x" * 100)
            ch.basic_get(queue, auto_ack=False)  # one unacked more each round
            conn.sleep(0.3)
            body = api.get(f"/api/queues/%2F/{queue}{window}").json()
            if len(body["messages_ready_details"]["samples"]) >= 4:
                break
        ready = body["messages_ready_details"]["samples"]
        assert len(ready) >= 4, body["messages_ready_details"]
        stamps = [s["timestamp"] for s in ready]
        assert stamps == sorted(stamps, reverse=True)  # newest first, as RabbitMQ
        assert ready[0]["sample"] > ready[-1]["sample"]  # the queue grew
        unacked = body["messages_unacknowledged_details"]["samples"]
        total = body["messages_details"]["samples"]
        assert [t["sample"] for t in total] == [r["sample"] + u["sample"]
                                               for r, u in zip(ready, unacked, strict=True)]
        publish = body["message_stats"]["publish_details"]
        assert len(publish["samples"]) >= 4 and publish["samples"][0]["sample"] >= 10
        assert {"avg", "avg_rate", "rate"} <= set(publish)
        # the connection: bytes sent (the basic.get replies) and its channel's publishes
        name = next(c["name"] for c in api.get("/api/connections").json()
                    if c["client_properties"].get("connection_name") == label)
        c = api.get(f"/api/connections/{q(name)}{window}").json()
        assert c["send_oct"] > 0 and len(c["send_oct_details"]["samples"]) >= 4
        assert 0 < c["send_oct_details"]["samples"][0]["sample"] <= c["send_oct"]
        # bytes received: at least the bodies published (10 x 100 bytes a round), and
        # growing from one sample to the next, newest first
        received = c["recv_oct_details"]["samples"]
        assert c["recv_oct"] >= 1000 and len(received) >= 4
        assert received[0]["sample"] <= c["recv_oct"]
        assert received[0]["sample"] > received[-1]["sample"]
        assert {"rate", "avg", "avg_rate"} <= set(c["recv_oct_details"])
        # bytes come with data_rates_age only, as on RabbitMQ 3.10.8
        lengths_only = api.get(f"/api/connections/{q(name)}?lengths_age=60").json()
        assert "samples" not in lengths_only["send_oct_details"]
        assert "samples" not in lengths_only["recv_oct_details"]
        listed = next(x for x in api.get("/api/connections").json() if x["name"] == name)
        assert listed["recv_oct"] >= 1000 and "rate" in listed["recv_oct_details"]
        assert c["message_stats"]["publish"] >= 10
        assert len(c["message_stats"]["publish_details"]["samples"]) >= 4
        chan = api.get(f"/api/channels/{q(name + ' (1)')}{window}").json()
        assert len(chan["message_stats"]["publish_details"]["samples"]) >= 4
        # without the parameters, RabbitMQ's plain shape; a bad window is refused
        plain = api.get(f"/api/queues/%2F/{queue}").json()
        assert "samples" not in plain["messages_ready_details"]
        assert "samples" not in plain["message_stats"]["publish_details"]
        assert api.get(f"/api/queues/%2F/{queue}?lengths_age=soon").status == 400
    finally:
        conn.close()



def test_exchange_message_stats_as_rabbitmq_with_samples(api: Api, broker: BrokerProcess) -> None:
    """publish_in / publish_out per exchange, as RabbitMQ 3.10.8 shapes them (checked there:
    see the conformance case http-api/exchange-message-stats-publish-in-and-out), and the
    last minute's samples with msg_rates_age. A vhost of its own, so the default exchange's
    counts are this test's alone."""
    vhost = uid("xstats")
    assert api.put(f"/api/vhosts/{vhost}", {}).status in (201, 204)
    assert api.put(f"/api/permissions/{vhost}/guest",
                   {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    params = pika.URLParameters(broker.url)
    params.virtual_host = vhost
    conn = pika.BlockingConnection(params)
    window = "msg_rates_age=60&msg_rates_incr=0.5"

    def stats(x: str, query: str = "") -> Any:
        return api.get(f"/api/exchanges/{q(vhost)}/{x}{query}").json().get("message_stats")

    def poll(check: Any, what: str) -> Any:
        deadline = time.monotonic() + 15
        got = None
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            conn.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    try:
        ch = conn.channel()
        for x, kind in (("fan", "fanout"), ("inner", "fanout"), ("idle", "direct"),
                        ("unrouted", "direct")):
            ch.exchange_declare(x, kind)
        for name in ("a", "b", "c"):
            ch.queue_declare(name)
        ch.queue_bind("a", "fan")
        ch.queue_bind("b", "fan")
        ch.exchange_bind("inner", "fan")
        ch.queue_bind("c", "inner")
        for _ in range(3):
            ch.basic_publish("fan", "", b"m")
            ch.basic_publish("unrouted", "nowhere", b"m")
            ch.basic_publish("", "a", b"m")
        # the first round is sampled (one point at least) before the second
        poll(lambda: (s := stats("fan", f"?{window}")) and
             (s["publish_in_details"]["samples"] or [{}])[0].get("sample") == 3,
             "the first round of fan sampled")
        for _ in range(2):
            ch.basic_publish("fan", "", b"m")
        fan = poll(lambda: (s := stats("fan", f"?{window}")) and
                   s["publish_in_details"]["samples"][0]["sample"] == 5 and s,
                   "fan's second round sampled")
        assert (fan["publish_in"], fan["publish_out"]) == (5, 15)  # three queues a message
        ins, outs = (fan[f"{k}_details"]["samples"] for k in ("publish_in", "publish_out"))
        stamps = [p["timestamp"] for p in ins]
        assert stamps == sorted(stamps, reverse=True)  # newest first, as RabbitMQ
        assert stamps == [p["timestamp"] for p in outs]
        pairs = [(i["sample"], o["sample"]) for i, o in zip(ins, outs, strict=True)]
        assert pairs[0] == (5, 15) and (3, 9) in pairs  # both rounds in the last minute
        assert all(o == 3 * i for i, o in pairs)
        for key in ("publish_in", "publish_out"):
            assert {"rate", "avg", "avg_rate"} <= set(fan[f"{key}_details"])
        unrouted = stats("unrouted")
        assert unrouted["publish_in"] == 3 and "publish_out" not in unrouted
        assert "samples" not in unrouted["publish_in_details"]  # only when asked
        default = stats("amq.default")
        assert (default["publish_in"], default["publish_out"]) == (3, 3)
        assert stats("inner") is None and stats("idle") is None  # key left out
        # the list: the same fields, samples too when asked
        listed = {x["name"]: x for x in
                  api.get(f"/api/exchanges/{q(vhost)}?{window}").json()}
        assert "message_stats" not in listed["idle"]
        assert listed["fan"]["message_stats"]["publish_out"] == 15
        assert listed["fan"]["message_stats"]["publish_in_details"]["samples"]
        # a rate while messages flow
        def flowing() -> Any:
            for _ in range(20):
                ch.basic_publish("fan", "", b"m")
            got = stats("fan")
            return got["publish_in_details"]["rate"] > 0 and got
        flowing_stats = poll(flowing, "a publish_in rate above 0")
        assert flowing_stats["publish_out_details"]["rate"] > 0
    finally:
        conn.close()
        api.delete(f"/api/vhosts/{vhost}")
