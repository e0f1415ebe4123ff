"""The web UI's details that trip RabbitMQ users (issue 33), each seen in headless Chromium.

Importing pasted definitions after a file import, pages of missing objects, delete
confirmations, the login error, the publish form's default delivery mode, readable time
labels under the charts, the exchanges' features column, object charts that open
with the last minute drawn, exchange message rates (list and chart) and connection data
rates from and to the client. One broker for the module;
skips with a clear message where Chromium or its driver is missing.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration._http import Api, q
from tests.integration.webui_support import (
    Publisher,
    fill,
    go,
    module_broker,
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
    yield from module_broker(tmp_path_factory, {"AMQPD_STATS_INTERVAL": "1"})


def queue_defs(name: str) -> dict[str, Any]:
    return {"queues": [{"name": name, "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {}}]}


def test_pasted_definitions_after_a_file_import_are_what_is_imported(
        ui: Any, broker: BrokerProcess, api: Api, tmp_path: Path) -> None:
    from_file, pasted = uid("from-file"), uid("pasted")
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(queue_defs(from_file)))
    go(ui, broker.http_url, "definitions", "#import-definitions")
    ui.find_element("css selector", "#import-definitions input[type=file]").send_keys(str(path))
    submit(ui, "#import-definitions", "Definitions imported (1 queues)")
    assert api.get(f"/api/queues/%2F/{from_file}").status == 200
    api.delete(f"/api/queues/%2F/{from_file}")
    fill(ui, "#import-definitions", {"text": json.dumps(queue_defs(pasted))})
    submit(ui, "#import-definitions", "Definitions imported (1 queues)")
    assert api.get(f"/api/queues/%2F/{pasted}").status == 200
    assert api.get(f"/api/queues/%2F/{from_file}").status == 404  # the file was not re-read


@pytest.mark.parametrize(("path", "needle"), [
    ("exchanges/%2F/nope", 'Exchange "nope" does not exist in virtual host "/"'),
    ("connections/127.0.0.1%3A1%20-%3E%20127.0.0.1%3A2", "does not exist"),
    ("queues/%2F/nope", 'Queue "nope" does not exist in virtual host "/"'),
])
def test_a_missing_object_shows_not_found_and_no_forms(
        ui: Any, broker: BrokerProcess, path: str, needle: str) -> None:
    go(ui, broker.http_url, path, "#not-found")
    wait_text(ui, "#not-found", needle)
    assert "404" in text_of(ui, "#not-found")
    assert not ui.find_elements("css selector", "main form, main button.danger")


def test_an_object_deleted_under_its_open_page_turns_into_not_found(
        ui: Any, broker: BrokerProcess, api: Api) -> None:
    exchange = uid("doomed-x")
    api.put(f"/api/exchanges/%2F/{exchange}", {"type": "direct"})
    go(ui, broker.http_url, f"exchanges/%2F/{exchange}", "#bindings-out table")
    api.delete(f"/api/exchanges/%2F/{exchange}")
    wait_text(ui, "#not-found", "It was deleted", timeout=20)  # the next refresh, 10 s


def test_deleting_says_deleted(ui: Any, broker: BrokerProcess, api: Api) -> None:
    queue, user = uid("bye-q"), uid("bye-user")
    api.put(f"/api/queues/%2F/{queue}", {"durable": False})
    go(ui, broker.http_url, f"queues/%2F/{q(queue)}", "#queue-details table")
    button = next(b for b in ui.find_elements("css selector", "main button.danger")
                  if b.text == "Delete queue")
    button.click()
    ui.switch_to.alert.accept()
    wait(ui, lambda d: d.current_url.endswith("#/queues"), what="back to the queue list")
    wait_text(ui, "#flash", f"Queue {queue} deleted.")
    assert api.get(f"/api/queues/%2F/{queue}").status == 404
    api.put(f"/api/users/{user}", {"password": "pw", "tags": ""})
    go(ui, broker.http_url, "admin/users", "#users-table")
    wait_text(ui, "#users-table", user)
    row = next(r for r in ui.find_elements("css selector", "#users-table tbody tr")
               if r.text.startswith(user))
    row.find_element("css selector", "button.danger").click()
    ui.switch_to.alert.accept()
    wait_text(ui, "#flash", f"User {user} deleted.")
    assert api.get(f"/api/users/{user}").status == 404


def test_a_wrong_password_shows_only_the_real_reason(
        browser: Any, broker: BrokerProcess, api: Api) -> None:
    user = uid("typo")
    api.put(f"/api/users/{user}", {"password": "right", "tags": "management"})
    browser.get(broker.http_url + "/#/")
    wait(browser, lambda d: d.find_elements("css selector", "#login-form, #nav a"),
         what="the login form or the navigation")
    if browser.find_elements("css selector", "#nav a"):
        browser.find_element("css selector", "#whoami button").click()
        wait(browser, lambda d: d.find_elements("css selector", "#login-form"), what="login")
    fill(browser, "#login-form", {"username": user, "password": "wrong"})
    said = submit(browser, "#login-form", "Login failed")
    assert said == "Login failed: wrong user name or password (HTTP 401)"


def test_the_publish_form_defaults_to_persistent(ui: Any, broker: BrokerProcess,
                                                 api: Api) -> None:
    queue = uid("persist-q")
    api.put(f"/api/queues/%2F/{queue}", {"durable": True})
    go(ui, broker.http_url, f"queues/%2F/{q(queue)}", "#publish-message")
    mode = ui.find_element("css selector", "#publish-message [name=delivery_mode]")
    assert mode.get_attribute("value") == "2"
    fill(ui, "#publish-message", {"payload": "kept"})
    submit(ui, "#publish-message", "Message published.")
    got = api.post(f"/api/queues/%2F/{queue}/get",
                   {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}).json()
    assert got[0]["payload"] == "kept"
    assert got[0]["properties"]["delivery_mode"] == 2


# what the x axis draws: each label's left and right edge in pixels, from uPlot's own
# splits and the width of the text in the axis font
AXIS_LABELS = """
const u = document.querySelector(arguments[0]).uplot;
const axis = u.axes[0];
const ctx = document.createElement("canvas").getContext("2d");
ctx.font = axis.font[0];
return (axis._values || []).map((text, i) => {
  const x = u.valToPos(axis._splits[i], "x");
  const w = ctx.measureText(String(text)).width;
  return [String(text), x - w / 2, x + w / 2];
});
"""


def test_the_overview_time_labels_do_not_overlap(ui: Any, broker: BrokerProcess) -> None:
    go(ui, broker.http_url, "", "#rate-chart")
    for css in ("#rate-chart", "#length-chart"):
        def drawn(d: Any, css: str = css) -> bool:
            return int(d.find_element("css selector", css).get_attribute("data-points")) >= 2
        wait(ui, drawn, what=f"samples drawn in {css}")
        labels = ui.execute_script(AXIS_LABELS, css)
        assert len(labels) >= 2, labels
        for (_, _, right), (text, left, _) in itertools.pairwise(labels):
            assert left - right >= 8, f"{text!r} runs into the label before it: {labels}"
        assert all(":" in text and "m" not in text for text, _, _ in labels), labels


def test_the_exchanges_features_column_shows_flags(ui: Any, broker: BrokerProcess,
                                                   api: Api) -> None:
    name = uid("flags-x")
    api.put(f"/api/exchanges/%2F/{name}", {
        "type": "topic", "durable": True, "auto_delete": True, "internal": True,
        "arguments": {"alternate-exchange": "amq.fanout", "x-custom": 1}})
    go(ui, broker.http_url, "exchanges", "#exchanges-table")
    wait_text(ui, "#exchanges-table", name)
    row = next(r for r in ui.find_elements("css selector", "#exchanges-table tbody tr")
               if name in r.text)
    flags = {f.text: f.get_attribute("title")
             for f in row.find_elements("css selector", "abbr.feature")}
    assert flags == {"D": "durable", "AD": "auto-delete", "I": "internal",
                     "AE": 'alternate-exchange: "amq.fanout"', "custom": "x-custom: 1"}
    assert "{" not in row.text


# ---------------------------------------------------------------------------- history
def test_object_charts_open_with_the_last_minute_drawn(ui: Any, broker: BrokerProcess,
                                                       api: Api) -> None:
    """Messages move while no page is open; the queue's and the connection's pages then
    draw several points at once, from the samples the server kept (one a second here)."""
    queue, label = uid("charted"), uid("charted-conn")
    params = pika.URLParameters(broker.url)
    params.client_properties = {"connection_name": label}
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for _ in range(20):
                ch.basic_publish("", queue, b"x" * 200)
            ch.basic_get(queue, auto_ack=True)
            conn.sleep(0.5)
            got = api.get(f"/api/queues/%2F/{queue}?lengths_age=60&lengths_incr=5").json()
            if len(got["messages_ready_details"]["samples"]) >= 3:
                break
        go(ui, broker.http_url, f"queues/%2F/{q(queue)}", "#queue-details table")

        def points(css: str) -> int:
            return int(ui.find_element("css selector", css).get_attribute("data-points"))
        # the first draw, not one polled later: the page redraws every 5 s, we look now
        wait(ui, lambda d: points("#queue-length-chart") >= 3, timeout=4,
             what="three queued-message points on the first draw")
        assert float(ui.find_element("css selector", "#queue-length-chart")
                     .get_attribute("data-max")) >= 20
        assert points("#queue-rate-chart") >= 2
        shot(ui, "queue-history")
        assert float(ui.find_element("css selector", "#queue-rate-chart")
                     .get_attribute("data-max")) > 0
        name = next(c["name"] for c in api.get("/api/connections").json()
                    if c["client_properties"].get("connection_name") == label)
        go(ui, broker.http_url, f"connections/{q(name)}", "#connection-channels table")
        wait(ui, lambda d: points("#connection-data-chart") >= 2
             and points("#connection-rate-chart") >= 2, timeout=4,
             what="connection rate points on the first draw")
        assert float(ui.find_element("css selector", "#connection-data-chart")
                     .get_attribute("data-max")) > 0  # the basic.get replies
        assert float(ui.find_element("css selector", "#connection-rate-chart")
                     .get_attribute("data-max")) > 0  # the publishes
        now = text_of(ui, "#connection-rates-now")
        assert "from client" in now and "to client" in now
        shot(ui, "connection-history")
    finally:
        conn.close()


# ---------------------------------------------------------------------------- rates
CHART_SERIES = "return document.querySelector(arguments[0]).uplot.data.slice(1);"


def wait_samples(api: Api, path: str, details: Any, count: int = 3) -> None:
    """Poll the API (30 s) until ``details(body)`` holds ``count`` samples: ``path`` asks
    in the UI's own window (a point per 5 s), so three points are a chart of two rates."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len((details(api.get(path).json()) or {}).get("samples", [])) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"{count} samples in {path} not there in 30 s")


def row_cells(driver: Any, table_css: str, needle: str) -> list[str] | None:
    """The cell texts of the first row of ``table_css`` that shows ``needle``."""
    for row in driver.find_elements("css selector", f"{table_css} tbody tr"):
        if needle in row.text:
            return [td.text for td in row.find_elements("css selector", "td")]
    return None


def first_draw(driver: Any, css: str) -> list[list[float]]:
    """The series of the chart ``css`` once it shows two points, on the page's first draw
    (the page redraws every 5 s: 4 s is the first draw, not a later one)."""
    def points(d: Any) -> int:
        return int(d.find_element("css selector", css).get_attribute("data-points"))
    wait(driver, lambda d: points(d) >= 2, timeout=4, what=f"two points in {css} at once")
    series: list[list[float]] = driver.execute_script(CHART_SERIES, css)
    return series


def test_exchange_rates_in_the_list_and_a_chart_with_history_on_first_open(
        ui: Any, broker: BrokerProcess, api: Api) -> None:
    """An exchange that routes every message to two queues: the list shows its rates in
    and out (RabbitMQ's "Message rate in/out"), and its page's chart opens with the
    last minute drawn from the server's samples (publishes made while no page was open)."""
    x = uid("rated-x")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.exchange_declare(x, "fanout")
        for name in (f"{x}-a", f"{x}-b"):
            ch.queue_declare(name, arguments={"x-max-length": 100})
            ch.queue_bind(name, x)
    finally:
        conn.close()
    publisher = Publisher(broker.url, "", exchange=x)
    publisher.start()
    try:
        wait_samples(api, f"/api/exchanges/%2F/{q(x)}?msg_rates_age=60&msg_rates_incr=5",
                     lambda body: body.get("message_stats", {}).get("publish_in_details"))
        go(ui, broker.http_url, "exchanges", "#exchanges-table")
        heads = [th.text for th in ui.find_elements("css selector", "#exchanges-table th")]
        assert heads[-2:] == ["Message rate in", "Message rate out"]

        def rates(d: Any) -> tuple[float, float] | None:
            cells = row_cells(d, "#exchanges-table", x)
            if cells is None:
                return None
            r_in, r_out = (float(c.removesuffix("/s")) for c in cells[-2:])
            return (r_in, r_out) if r_in > 0 and r_out > 0 else None
        r_in, r_out = wait(ui, rates, timeout=30, what=f"rates in and out of {x} above 0")
        assert abs(r_out - 2 * r_in) <= 0.2  # two queues a message, counted at one tick
        shot(ui, "exchanges-rates")

        go(ui, broker.http_url, f"exchanges/%2F/{q(x)}", "#exchange-rate-chart")
        series_in, series_out = first_draw(ui, "#exchange-rate-chart")
        assert max(series_in) > 0 and max(series_out) > 0, (series_in, series_out)
        assert "in 0.0/s" not in text_of(ui, "#exchange-rates-now")  # still publishing
        shot(ui, "exchange-history")
    finally:
        publisher.halt.set()
        publisher.join(10)
    assert publisher.sent > 0


def test_connection_data_rates_from_and_to_the_client(ui: Any, broker: BrokerProcess,
                                                      api: Api) -> None:
    """The connections list shows bytes from and to each client per second (RabbitMQ's
    "From client" / "To client"); the connection's chart draws both from its first draw."""
    label = uid("bytes-conn")
    publisher = Publisher(broker.url, uid("bytes-q"), label=label)
    publisher.start()
    try:
        name = wait(ui, lambda d: next((c["name"] for c in api.get("/api/connections").json()
                                        if c["client_properties"].get("connection_name")
                                        == label), None), what="the publisher's connection")
        wait_samples(api, f"/api/connections/{q(name)}?data_rates_age=60&data_rates_incr=5",
                     lambda body: body.get("recv_oct_details"))
        go(ui, broker.http_url, "connections", "#connections-table")
        heads = [th.text for th in ui.find_elements("css selector", "#connections-table th")]
        col_from, col_to = heads.index("From client"), heads.index("To client")

        def both(d: Any) -> tuple[str, str] | None:
            cells = row_cells(d, "#connections-table", label)
            if cells is None:
                return None
            got = cells[col_from], cells[col_to]
            return got if all(c.endswith("/s") and c != "0 B/s" for c in got) else None
        wait(ui, both, timeout=30, what="data rates from and to the client above 0")
        shot(ui, "connections-rates")

        go(ui, broker.http_url, f"connections/{q(name)}", "#connection-data-chart")
        from_client, to_client = first_draw(ui, "#connection-data-chart")
        assert max(from_client) > 0 and max(to_client) > 0, (from_client, to_client)
        assert "from client" in text_of(ui, "#connection-rates-now")
    finally:
        publisher.halt.set()
        publisher.join(10)
    assert publisher.sent > 0


def test_the_deduplication_cache_on_the_exchange_and_queue_pages(
        ui: Any, broker: BrokerProcess, api: Api) -> None:
    """A dedup exchange's page and a deduplicating queue's page show the cache's entries,
    size and dropped duplicates (docs/dedup.md); other exchanges and queues show no such
    panel."""
    ex, queue, plain = uid("dedup-x"), uid("dedup-q"), uid("plain-q")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.exchange_declare(ex, "x-message-deduplication", arguments={
            "x-cache-size": 500, "x-cache-ttl": 60_000})
        ch.queue_declare(queue, arguments={"x-message-deduplication": True})
        ch.queue_declare(plain)
        ch.queue_bind(queue, ex)
        ch.confirm_delivery()
        for value in ["a", "b", "c", "a", "b", "a"]:  # 3 values, 3 duplicates
            ch.basic_publish(ex, "", b"m", pika.BasicProperties(
                headers={"x-deduplication-header": value}))
        for value in ["d", "d"]:  # straight to the queue: its own cache drops one
            ch.basic_publish("", queue, b"m", pika.BasicProperties(
                headers={"x-deduplication-header": value}))
    finally:
        conn.close()
    go(ui, broker.http_url, f"exchanges/{q('/')}/{q(ex)}", "#dedup-details")
    wait_text(ui, "#dedup-entries", "3")
    assert text_of(ui, "#dedup-size") == "at most 500"
    assert text_of(ui, "#dedup-duplicates") == "3"
    assert text_of(ui, "#dedup-scope") == "on this node"
    assert "60,000 ms" in text_of(ui, "#dedup-details")
    shot(ui, "dedup-exchange")
    go(ui, broker.http_url, f"queues/{q('/')}/{q(queue)}", "#queue-details")
    wait_text(ui, "#dedup-entries", "4")
    assert text_of(ui, "#dedup-duplicates") == "1"
    assert "messages in the queue" in text_of(ui, "#dedup-size")
    go(ui, broker.http_url, f"queues/{q('/')}/{q(plain)}", "#queue-details")
    wait_text(ui, "#queue-details", "classic")
    assert not ui.find_element("css selector", "#dedup-details").is_displayed()
    go(ui, broker.http_url, f"exchanges/{q('/')}/amq.direct", "#bindings-out")
    assert not ui.find_element("css selector", "#dedup-details").is_displayed()
