"""The web UI in headless Chromium against a real amqpd: log in, see and change things.

One broker for the module (rates sampled every second, the shovel and federation plugins
on so their pages exist). Each page visited leaves a screenshot under
build/ui-screenshots/. Skips with a clear message where Chromium or its driver is missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration._http import Api, q
from tests.integration.webui_support import (
    Publisher,
    fill,
    go,
    login,
    module_broker,
    page_errors,
    shot,
    submit,
    text_of,
    uid,
    wait,
    wait_text,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    yield from module_broker(tmp_path_factory,
                             {"AMQPD_STATS_INTERVAL": "1", "AMQPD_PLUGINS": "shovel,federation"})


def amqp(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


# ---------------------------------------------------------------------------- login
def test_login_keeps_no_password_in_the_page_and_logout_ends_it(
        browser: Any, broker: BrokerProcess) -> None:
    browser.get(broker.http_url + "/")
    wait(browser, lambda d: d.find_elements("css selector", "#login-form"), what="login form")
    shot(browser, "login")
    fill(browser, "#login-form", {"username": "guest", "password": "wrong"})
    submit(browser, "#login-form", "Login failed")
    fill(browser, "#login-form", {"username": "guest", "password": "guest"})
    browser.find_element("css selector", "#login-form button[type=submit]").click()
    wait_text(browser, "#whoami", "guest (administrator)")
    stored = browser.execute_script(
        "return [document.cookie, JSON.stringify(sessionStorage), JSON.stringify(localStorage)]")
    assert all("guest" not in s and "amqpd_session" not in s for s in stored), stored
    cookie = browser.get_cookie("amqpd_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    browser.find_element("css selector", "#whoami button").click()
    wait(browser, lambda d: d.find_elements("css selector", "#login-form"), what="login form")
    browser.get(broker.http_url + "/#/queues")  # the old session no longer opens pages
    wait(browser, lambda d: d.find_elements("css selector", "#login-form"), what="login form")


def test_a_management_user_sees_no_admin_pages(
        browser: Any, broker: BrokerProcess, api: Api) -> None:
    name = uid("viewer")
    api.put(f"/api/users/{name}", {"password": "pw", "tags": "management"})
    api.put(f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})
    login(browser, broker.http_url, name, "pw")
    nav = text_of(browser, "#nav")
    assert "Queues" in nav and "Admin" not in nav and "Definitions" not in nav
    wait_text(browser, "#totals", "Queues")
    assert not browser.find_elements("css selector", "#node")  # for monitoring users
    assert "File descriptors" not in text_of(browser, "main")
    browser.get(broker.http_url + "/#/admin")
    wait_text(browser, "main", "No such page")


def test_a_refused_action_is_reported_and_the_user_stays_logged_in(
        browser: Any, broker: BrokerProcess, api: Api) -> None:
    """A monitoring user reads every vhost but may change none: the API's 401
    not_authorised is shown on the page, not taken for an ended session."""
    name, queue = uid("watcher"), uid("watched")
    api.put(f"/api/users/{name}", {"password": "pw", "tags": "monitoring"})
    api.put(f"/api/queues/%2F/{queue}", {"durable": False})
    api.post("/api/exchanges/%2F/amq.default/publish",
             {"routing_key": queue, "payload": "keep me", "properties": {}})
    login(browser, broker.http_url, name, "pw")
    go(browser, broker.http_url, f"queues/%2F/{q(queue)}", "#queue-details table")
    assert not browser.find_elements("css selector", "#move-messages")  # policymakers only
    purge = next(b for b in browser.find_elements("css selector", "main button.danger")
                 if b.text == "Purge messages")
    purge.click()
    browser.switch_to.alert.accept()
    wait_text(browser, "main .form-status.error", "Access refused")
    assert name in text_of(browser, "#whoami")
    assert not browser.find_elements("css selector", "#login-form")
    assert api.get(f"/api/queues/%2F/{queue}").json()["messages"] == 1


# ---------------------------------------------------------------------------- queues
def test_a_queue_declared_over_amqp_appears_with_its_message_count(
        ui: Any, broker: BrokerProcess) -> None:
    queue = uid("amqp-declared")
    conn = amqp(broker)
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        for n in range(3):
            ch.basic_publish("", queue, f"m{n}".encode())
        go(ui, broker.http_url, "queues", "#queues-table")
        ui.find_element("css selector", "#filter").send_keys(queue)
        wait(ui, lambda d: text_of(d, "#queues-table tbody").startswith("/ " + queue),
             what="the filtered queue row")
        row = ui.find_element("css selector", "#queues-table tbody tr")
        assert row.find_element("css selector", "td.messages").text == "3"
        shot(ui, "queues")
    finally:
        conn.close()


def test_publish_from_the_page_and_get_it_back(ui: Any, broker: BrokerProcess) -> None:
    queue = uid("page-pub")
    conn = amqp(broker)
    conn.channel().queue_declare(queue)
    conn.close()
    go(ui, broker.http_url, f"queues/%2F/{q(queue)}", "#publish-message")
    fill(ui, "#publish-message", {"payload": "hello from the page", "headers": "origin=ui",
                                  "delivery_mode": "2"})
    submit(ui, "#publish-message", "Message published.")
    wait_text(ui, "#messages-total", "1", timeout=15)
    fill(ui, "#get-messages", {"ackmode": "ack_requeue_false", "count": "5"})
    submit(ui, "#get-messages", "1 message(s).")
    got = text_of(ui, "#got-messages")
    assert "hello from the page" in got and '"origin":"ui"' in got and '"delivery_mode":2' in got
    shot(ui, "queue")
    conn = amqp(broker)
    try:  # acked away by the page: the queue is empty now
        assert conn.channel().queue_declare(queue, passive=True).method.message_count == 0
    finally:
        conn.close()


def test_bindings_added_and_removed_on_the_queue_page(ui: Any, broker: BrokerProcess,
                                                      api: Api) -> None:
    queue = uid("bound")
    api.put(f"/api/queues/%2F/{queue}", {"durable": False})
    go(ui, broker.http_url, f"queues/%2F/{q(queue)}", "#add-binding")
    fill(ui, "#add-binding", {"source": "amq.topic", "routing_key": "a.*.c"})
    submit(ui, "#add-binding", "Bound.")
    wait_text(ui, "#bindings-table", "a.*.c")
    assert any(b["source"] == "amq.topic" and b["routing_key"] == "a.*.c"
               for b in api.get(f"/api/queues/%2F/{queue}/bindings").json())
    fill(ui, "#add-binding", {"source": "no-such-exchange"})
    submit(ui, "#add-binding", "HTTP 404")  # the API's error, shown where it happened
    row = next(r for r in ui.find_elements("css selector", "#bindings-table tbody tr")
               if "a.*.c" in r.text)
    row.find_element("css selector", "button.danger").click()
    wait(ui, lambda d: "a.*.c" not in text_of(d, "#bindings-table"), what="the unbind")
    assert all(b["source"] != "amq.topic"
               for b in api.get(f"/api/queues/%2F/{queue}/bindings").json())


def test_move_messages_with_a_shovel(ui: Any, broker: BrokerProcess, api: Api) -> None:
    src, dest = uid("move-src"), uid("move-dest")
    for name in (src, dest):
        api.put(f"/api/queues/%2F/{name}", {"durable": True})
    for n in range(4):
        api.post("/api/exchanges/%2F/amq.default/publish",
                 {"routing_key": src, "payload": f"m{n}", "properties": {}})
    go(ui, broker.http_url, f"queues/%2F/{q(src)}", "#move-messages")
    fill(ui, "#move-messages", {"dest": dest})
    submit(ui, "#move-messages", "started")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if api.get(f"/api/queues/%2F/{dest}").json()["messages"] == 4:
            break
        time.sleep(0.1)
    assert api.get(f"/api/queues/%2F/{dest}").json()["messages"] == 4
    assert api.get(f"/api/queues/%2F/{src}").json()["messages"] == 0


# ---------------------------------------------------------------------------- admin
def test_create_a_user_and_a_policy(ui: Any, broker: BrokerProcess, api: Api) -> None:
    user, policy = uid("made-in-ui"), uid("pol")
    go(ui, broker.http_url, "admin/users", "#add-user")
    fill(ui, "#add-user", {"name": user, "password": "pw-ui", "tags": "monitoring, policymaker"})
    submit(ui, "#add-user", f"User {user} saved.")
    password = ui.find_element("css selector", "#add-user [name=password]")
    assert password.get_attribute("value") == ""  # not left in the page
    wait_text(ui, "#users-table", user)
    shot(ui, "admin-users")
    made = api.get(f"/api/users/{user}").json()
    assert sorted(made["tags"]) == ["monitoring", "policymaker"]
    assert api.as_user(user, "pw-ui").get("/api/overview").status == 200
    go(ui, broker.http_url, "admin/policies", "#add-policy")
    fill(ui, "#add-policy", {"name": policy, "pattern": "(", "definition": "max-length=5"})
    submit(ui, "#add-policy", "invalid regular expression")  # the API's reason, readable
    fill(ui, "#add-policy", {"pattern": "^ui-", "apply-to": "queues", "priority": "3",
                             "definition": "max-length=5\nmessage-ttl=60000"})
    submit(ui, "#add-policy", f"Policy {policy} saved.")
    wait_text(ui, "#policies-table", policy)
    shot(ui, "admin-policies")
    got = api.get(f"/api/policies/%2F/{policy}").json()
    assert got["definition"] == {"max-length": 5, "message-ttl": 60000}
    assert got["pattern"] == "^ui-" and got["apply-to"] == "queues" and got["priority"] == 3


def test_admin_tabs_render(ui: Any, broker: BrokerProcess, api: Api) -> None:
    vhost = uid("vh")
    go(ui, broker.http_url, "admin/vhosts", "#add-vhost")
    fill(ui, "#add-vhost", {"name": vhost, "description": "made by a test"})
    submit(ui, "#add-vhost", "added")
    shot(ui, "admin-vhosts")
    go(ui, broker.http_url, "admin/permissions", "#set-permission")
    fill(ui, "#set-permission", {"user": "guest", "vhost": vhost, "write": "^w"})
    submit(ui, "#set-permission", "set")
    assert api.get(f"/api/permissions/{vhost}/guest").json()["write"] == "^w"
    shot(ui, "admin-permissions")
    go(ui, broker.http_url, "admin/topic-permissions", "#set-topic-permission")
    fill(ui, "#set-topic-permission", {"user": "guest", "vhost": vhost, "write": "^t"})
    submit(ui, "#set-topic-permission", "Topic permission set.")
    wait_text(ui, "#topic-permissions-table", "^t")
    shot(ui, "admin-topic-permissions")
    go(ui, broker.http_url, "admin/limits", "#set-vhost-limit")
    wait(ui, lambda d: d.find_elements("css selector", "#admin-limits table, "
                                                       "#admin-limits .form-status.error"),
         what="the limits lists (or the API's answer about them)")
    shot(ui, "admin-limits")
    assert not page_errors(ui)


def test_import_a_definitions_file(ui: Any, broker: BrokerProcess, api: Api,
                                   tmp_path: Path) -> None:
    queue, exchange = uid("imported-q"), uid("imported-x")
    defs = {"queues": [{"name": queue, "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {"x-max-length": 9}}],
            "exchanges": [{"name": exchange, "vhost": "/", "type": "fanout", "durable": True,
                           "auto_delete": False, "internal": False, "arguments": {}}],
            "bindings": [{"source": exchange, "vhost": "/", "destination": queue,
                          "destination_type": "queue", "routing_key": "", "arguments": {}}]}
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(defs))
    go(ui, broker.http_url, "definitions", "#import-definitions")
    ui.find_element("css selector", "#import-definitions input[type=file]").send_keys(str(path))
    submit(ui, "#import-definitions", "Definitions imported (1 queues, 1 exchanges, 1 bindings)")
    shot(ui, "definitions")
    assert api.get(f"/api/queues/%2F/{queue}").json()["arguments"] == {"x-max-length": 9}
    assert api.get(f"/api/exchanges/%2F/{exchange}").json()["type"] == "fanout"
    bad = tmp_path / "bad.json"
    bad.write_text('{"queues": [{"name": 5}]}')
    ui.find_element("css selector", "#import-definitions input[type=file]").send_keys(str(bad))
    submit(ui, "#import-definitions", "HTTP 400")


# ---------------------------------------------------------------------------- rates
def test_the_rate_chart_moves_while_a_publisher_runs(ui: Any, broker: BrokerProcess) -> None:
    go(ui, broker.http_url, "", "#rate-chart")
    publisher = Publisher(broker.url, uid("ticker"))
    publisher.start()
    try:
        def chart(d: Any) -> Any:
            return d.find_element("css selector", "#rate-chart")

        def publishing(d: Any) -> str:
            latest = json.loads(chart(d).get_attribute("data-latest") or "[]")
            # publish and confirm above zero in the newest point drawn
            return chart(d).get_attribute("data-newest") if latest and latest[0] > 0 \
                and latest[3] > 0 else ""
        newest = wait(ui, publishing, timeout=30, what="publish and confirm rates above zero")
        assert "publish 0.0/s" not in text_of(ui, "#rates-now")
        # the chart keeps moving: a newer point is drawn, still showing the publisher
        wait(ui, lambda d: publishing(d) not in ("", newest), timeout=15, what="a newer point")
        shot(ui, "overview")
        shot(ui, "overview-viewport", full=False)  # docs/ui-overview.png is one of these
    finally:
        publisher.halt.set()
        publisher.join(10)
    assert publisher.sent > 0


def test_alarms_are_shown_plainly(ui: Any, broker: BrokerProcess, api: Api) -> None:
    node = api.get("/api/nodes").json()[0]["name"]
    watermark = f"/api/nodes/{q(node)}/memory-high-watermark"
    assert api.put(watermark, {"absolute": 1}).status == 200  # memory alarm at once
    try:
        go(ui, broker.http_url, "", "#alarm-list")
        wait_text(ui, "#alarm-list", "Memory alarm")
        assert "Publishers are blocked" in text_of(ui, "#alarm-list")
        assert "ALARM" in text_of(ui, "#node")
        shot(ui, "overview-memory-alarm", full=False)
    finally:
        assert api.put(watermark, {"fraction": 0.4}).status == 200
    go(ui, broker.http_url, "", "#alarm-list")
    wait_text(ui, "#alarm-list", "No resource alarms.")


# ---------------------------------------------------------------------------- other pages
def test_every_page_renders(ui: Any, broker: BrokerProcess, api: Api) -> None:
    label = uid("ui-test-client")
    params = pika.URLParameters(broker.url)
    params.client_properties = {"connection_name": label}
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = uid("consumed")
        ch.queue_declare(queue)
        ch.basic_consume(queue, lambda *a: None)
        # a shovel and a federation link, so their status pages show one each
        shovel, upstream, policy = uid("keep-shovel"), uid("up"), uid("fed")
        api.put(f"/api/queues/%2F/{shovel}-src", {"durable": False})
        api.put(f"/api/queues/%2F/{shovel}-dest", {"durable": False})
        assert api.put(f"/api/parameters/shovel/%2F/{shovel}", {"value": {
            "src-uri": "amqp://", "src-queue": f"{shovel}-src", "dest-uri": "amqp://",
            "dest-queue": f"{shovel}-dest"}}).status == 201
        api.put(f"/api/exchanges/%2F/{upstream}-x", {"type": "topic"})
        api.put(f"/api/exchanges/%2F/fedlocal-{upstream}", {"type": "topic"})
        assert api.put(f"/api/parameters/federation-upstream/%2F/{upstream}", {"value": {
            "uri": broker.url, "exchange": f"{upstream}-x"}}).status == 201
        assert api.put(f"/api/policies/%2F/{policy}", {
            "pattern": f"^fedlocal-{upstream}$", "apply-to": "exchanges",
            "definition": {"federation-upstream": upstream}}).status == 201
        node = api.get("/api/overview").json()["node"]
        go(ui, broker.http_url, "shovels", "#shovels-table")
        wait_text(ui, "#shovels-table", "running", timeout=20)
        assert node in text_of(ui, "#shovels-table")  # the Node column (issue 29)
        shot(ui, "shovels")
        go(ui, broker.http_url, "federation", "#federation-table")
        wait_text(ui, "#federation-table", "running", timeout=20)
        assert node in text_of(ui, "#federation-table")
        assert upstream in text_of(ui, "#federation-upstreams")
        shot(ui, "federation")
        api.delete(f"/api/policies/%2F/{policy}")
        api.delete(f"/api/parameters/federation-upstream/%2F/{upstream}")
        api.delete(f"/api/parameters/shovel/%2F/{shovel}")
        pages = [("", "#rate-chart", "overview-top"),
                 ("connections", "#connections-table", "connections"),
                 ("channels", "#channels-table", "channels"),
                 ("exchanges", "#exchanges-table", "exchanges"),
                 ("exchanges/%2F/amq.topic", "#bindings-out table", "exchange"),
                 (f"queues/%2F/{q(queue)}", "#queue-details table", "queue-with-consumer")]
        for path, ready, name in pages:
            go(ui, broker.http_url, path, ready)
            assert not page_errors(ui), path
            shot(ui, name)
        wait_text(ui, "#queue-consumers", "yes")  # the consumer, ack required
        go(ui, broker.http_url, "connections", "#connections-table")
        wait_text(ui, "#connections-table", label)
        name = next(c["name"] for c in api.get("/api/connections").json()
                    if c["client_properties"].get("connection_name") == label)
        go(ui, broker.http_url, f"connections/{q(name)}", "#connection-channels table")
        shot(ui, "connection")
        ui.find_element("css selector", "main button.danger").click()
        ui.switch_to.alert.accept()
        wait(ui, lambda d: d.current_url.endswith("#/connections"), what="back to the list")
        deadline = time.monotonic() + 10
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            while time.monotonic() < deadline:
                conn.process_data_events(0.1)
        assert closed.value.reply_code == 320  # closed by the page
    finally:
        if conn.is_open:
            conn.close()


def test_the_page_reconnects_after_a_broker_restart(browser: Any,
                                                    tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "amqpd")
    proc.start()
    try:
        login(browser, proc.http_url)
        go(browser, proc.http_url, "queues", "#queues-table")
        port = proc.http_port
        proc.stop()
        wait_text(browser, "#status", "Lost contact with the broker", timeout=20)
        shot(browser, "broker-away")
        proc.env["AMQPD_HTTP_PORT"] = str(port)
        proc.start()
        wait_text(browser, "#status", "Reconnected to the broker", timeout=20)
        wait(browser, lambda d: d.find_elements("css selector", "#queues-table"),
             what="the queue list again")
        assert "guest" in text_of(browser, "#whoami")  # still logged in
        assert not browser.find_elements("css selector", "#login-form")
    finally:
        proc.stop()
