"""The web UI's pages that RabbitMQ has and amqpd lacked (issue 33), in headless Chromium.

A channel's page, a user's and a vhost's page, federation upstreams added and deleted,
the nodes page, operator policies, the exchanges list's filter and pager, the queue
list's type and state columns and column chooser, and the refresh interval. One broker
for the module (the federation plugin on); skips where Chromium or its driver is missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.integration._http import Api, q
from tests.integration.webui_support import (
    fill,
    go,
    module_broker,
    open_link,
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
                             {"AMQPD_STATS_INTERVAL": "1", "AMQPD_PLUGINS": "federation"})


def click_danger(driver: Any, row_css: str, needle: str) -> None:
    """Press the danger button in the row of ``row_css`` that shows ``needle``, and agree."""
    row = next(r for r in driver.find_elements("css selector", row_css) if needle in r.text)
    row.find_element("css selector", "button.danger").click()
    driver.switch_to.alert.accept()


def test_a_channel_page_with_its_rates_and_consumers(ui: Any, broker: BrokerProcess,
                                                     api: Api) -> None:
    label, queue = uid("chan-conn"), uid("chan-q")
    params = pika.URLParameters(broker.url)
    params.client_properties = {"connection_name": label}
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue)
        ch.basic_consume(queue, lambda *a: None, consumer_tag="watched-consumer")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # publishes over 10 s of stats ticks
            for _ in range(10):
                ch.basic_publish("", uid("nowhere"), b"x")
            conn.process_data_events(0.3)
            owner = next(c["name"] for c in api.get("/api/connections").json()
                         if c["client_properties"].get("connection_name") == label)
            name = f"{owner} (1)"  # the connection's first channel, as RabbitMQ names it
            samples = api.get(f"/api/channels/{q(name)}?msg_rates_age=60&msg_rates_incr=5") \
                .json()["message_stats"]["publish_details"]["samples"]
            if len(samples) >= 3:
                break
        go(ui, broker.http_url, "channels", "#channels-table")
        wait_text(ui, "#channels-table", name)
        link = next(a for a in ui.find_elements("css selector", "#channels-table td.name a")
                    if a.text == name)
        link.click()
        wait_text(ui, "#channel-details", "confirm")
        chart = ui.find_element("css selector", "#channel-rate-chart")
        wait(ui, lambda d: int(chart.get_attribute("data-points")) >= 2, timeout=4,
             what="the channel's rate history on the first draw")
        assert float(chart.get_attribute("data-max")) > 0
        wait_text(ui, "#channel-consumers-table", "watched-consumer")
        assert queue in text_of(ui, "#channel-consumers-table")
        assert not page_errors(ui)
        shot(ui, "channel")
    finally:
        conn.close()
    go(ui, broker.http_url, f"channels/{q(name)}", "#not-found")  # closed: not found
    wait_text(ui, "#not-found", "does not exist")


def test_a_users_page_sets_permissions_and_deletes_it(ui: Any, broker: BrokerProcess,
                                                      api: Api) -> None:
    user, vhost = uid("person"), uid("vh")
    api.put(f"/api/users/{user}", {"password": "pw", "tags": "management"})
    api.put(f"/api/vhosts/{vhost}", {})
    go(ui, broker.http_url, "admin/users", "#users-table")
    wait_text(ui, "#users-table", user)
    open_link(ui, "#users-table td.name a", user)
    wait_text(ui, "#user-details", "management")
    assert "can use no virtual host" in text_of(ui, "#user-permissions")
    fill(ui, "#set-user-permission", {"vhost": vhost, "configure": "^mine-.*"})
    submit(ui, "#set-user-permission", f"Permissions in {vhost} set.")
    perm = api.get(f"/api/permissions/{q(vhost)}/{user}").json()
    assert perm["configure"] == "^mine-.*" and perm["read"] == ".*"
    wait_text(ui, "#user-permissions-table", "^mine-.*")
    fill(ui, "#update-user", {"tags": "monitoring"})
    submit(ui, "#update-user", f"User {user} updated.")
    assert api.get(f"/api/users/{user}").json()["tags"] == ["monitoring"]
    shot(ui, "user")
    next(b for b in ui.find_elements("css selector", "main button.danger")
         if b.text == "Delete user").click()
    ui.switch_to.alert.accept()
    wait(ui, lambda d: d.current_url.endswith("#/admin/users"), what="back to the users")
    wait_text(ui, "#flash", f"User {user} deleted.")
    assert api.get(f"/api/users/{user}").status == 404


def test_a_vhosts_page_shows_messages_and_who_may_use_it(ui: Any, broker: BrokerProcess,
                                                         api: Api) -> None:
    vhost, user = uid("place"), uid("visitor")
    api.put(f"/api/vhosts/{vhost}", {"description": "for the test"})
    api.put(f"/api/users/{user}", {"password": "pw", "tags": ""})
    api.put(f"/api/queues/{q(vhost)}/held", {"durable": True})
    for _ in range(2):
        api.post(f"/api/exchanges/{q(vhost)}/amq.default/publish",
                 {"routing_key": "held", "payload": "x", "properties": {}})
    go(ui, broker.http_url, "admin/vhosts", "#vhosts-table")
    wait_text(ui, "#vhosts-table", vhost)
    open_link(ui, "#vhosts-table td.name a", vhost)
    wait_text(ui, "#vhost-ready", "2")
    assert "for the test" in text_of(ui, "#vhost-details")
    fill(ui, "#set-vhost-permission", {"user": user})
    submit(ui, "#set-vhost-permission", f"Permissions of {user} set.")
    wait_text(ui, "#vhost-permissions-table", user)
    assert api.get(f"/api/permissions/{q(vhost)}/{user}").status == 200
    shot(ui, "vhost")
    next(b for b in ui.find_elements("css selector", "main button.danger")
         if b.text == "Delete virtual host").click()
    ui.switch_to.alert.accept()
    wait_text(ui, "#flash", f"Virtual host {vhost} deleted.")
    assert api.get(f"/api/vhosts/{q(vhost)}").status == 404


def test_federation_upstreams_are_added_and_deleted(ui: Any, broker: BrokerProcess,
                                                    api: Api) -> None:
    name = uid("upstream")
    go(ui, broker.http_url, "federation", "#add-upstream")
    fill(ui, "#add-upstream", {"name": name, "uri": "amqp://fed:secret@127.0.0.1:1/%2F",
                               "exchange": "up-x", "max-hops": "2", "expires": "60000"})
    submit(ui, "#add-upstream", f"Upstream {name} added.")
    value = api.get(f"/api/parameters/federation-upstream/%2F/{name}").json()["value"]
    assert value["uri"] == "amqp://fed:secret@127.0.0.1:1/%2F"
    assert value["exchange"] == "up-x" and value["max-hops"] == 2
    assert value["expires"] == 60000 and value["ack-mode"] == "on-confirm"
    assert "queue" not in value and "message-ttl" not in value  # left empty: not sent
    wait_text(ui, "#upstreams-table", name)
    table = text_of(ui, "#upstreams-table")
    assert "fed:***@" in table and "secret" not in table  # the password stays off screen
    fill(ui, "#add-upstream", {"name": uid("bad"), "uri": "http://nope"})
    error = submit(ui, "#add-upstream", "HTTP 400")
    assert "uri" in error.lower()
    click_danger(ui, "#upstreams-table tbody tr", name)
    wait_text(ui, "#flash", f"Upstream {name} deleted.")
    assert api.get(f"/api/parameters/federation-upstream/%2F/{name}").status == 404
    wait(ui, lambda d: name not in text_of(d, "#upstreams-table"), what="the row gone")


def test_the_nodes_page_of_a_single_node(ui: Any, broker: BrokerProcess, api: Api) -> None:
    node = api.get("/api/overview").json()["node"]
    go(ui, broker.http_url, "nodes", "#nodes-table")
    wait_text(ui, "#nodes-table", node)
    row = text_of(ui, "#nodes-table tbody")
    assert "(this node)" in row and "running" in row and "single node" in row
    assert "A single node" in text_of(ui, "#cluster-status")
    assert "not configured" in text_of(ui, "#replication")
    assert not page_errors(ui)


def test_operator_policies_are_added_and_deleted(ui: Any, broker: BrokerProcess,
                                                 api: Api) -> None:
    name = uid("op")
    go(ui, broker.http_url, "admin/operator-policies", "#add-operator-policy")
    fill(ui, "#add-operator-policy", {"name": name, "pattern": "^capped\\.",
                                      "definition": "max-length=100"})
    submit(ui, "#add-operator-policy", f"Operator policy {name} saved.")
    got = api.get(f"/api/operator-policies/%2F/{name}").json()
    assert got["definition"] == {"max-length": 100} and got["apply-to"] == "queues"
    wait_text(ui, "#operator-policies-table", name)
    fill(ui, "#add-operator-policy", {"name": uid("op-bad"), "pattern": "x",
                                      "definition": "alternate-exchange=ae"})
    submit(ui, "#add-operator-policy", "HTTP 400")
    click_danger(ui, "#operator-policies-table tbody tr", name)
    wait_text(ui, "#flash", f"Operator policy {name} deleted.")
    assert api.get(f"/api/operator-policies/%2F/{name}").status == 404


def test_the_exchanges_list_filters_and_pages(ui: Any, broker: BrokerProcess,
                                              api: Api) -> None:
    prefix = uid("flt")
    for n in range(3):
        api.put(f"/api/exchanges/%2F/{prefix}-{n}", {"type": "fanout"})
    go(ui, broker.http_url, "exchanges", "#exchanges-table")
    ui.find_element("css selector", "#filter").send_keys(prefix)
    wait_text(ui, "#pager .filtered-count", "3")
    rows = ui.find_elements("css selector", "#exchanges-table td.name")
    assert sorted(r.text for r in rows) == [f"{prefix}-{n}" for n in range(3)]
    ui.find_element("css selector", "#filter-regex").click()
    ui.find_element("css selector", "#filter").send_keys("-[02]$")
    wait(ui, lambda d: sorted(r.text for r in d.find_elements(
        "css selector", "#exchanges-table td.name")) == [f"{prefix}-0", f"{prefix}-2"],
        what="the two regex matches")
    assert "Page 1 of 1" in text_of(ui, "#pager")


def test_queue_type_and_state_columns_and_the_column_chooser(
        ui: Any, broker: BrokerProcess, api: Api) -> None:
    queue = uid("cols")
    api.put(f"/api/queues/%2F/{queue}", {"durable": True})
    go(ui, broker.http_url, "queues", "#queues-table")
    ui.find_element("css selector", "#filter").send_keys(queue)
    wait(ui, lambda d: len(d.find_elements("css selector", "#queues-table tbody tr")) == 1
         and queue in text_of(d, "#queues-table tbody"), what="the one queue")

    def headers(d: Any) -> list[str]:
        return [th.text for th in d.find_elements("css selector", "#queues-table th")]

    def cell(d: Any, title: str) -> str:
        i = headers(d).index(title)
        return str(d.find_elements("css selector", "#queues-table tbody td")[i].text)
    # (each look inside wait: the list redraws every few seconds under the test)
    wait(ui, lambda d: cell(d, "Type") == "classic" and cell(d, "State") == "running"
         and "Consumers" not in headers(d), what="type and state, RabbitMQ's default columns")
    ui.find_element("css selector", "#column-chooser summary").click()
    ui.find_element("css selector", "#column-chooser [data-column='Type']").click()
    ui.find_element("css selector", "#column-chooser [data-column='Consumers']").click()
    wait(ui, lambda d: "Type" not in headers(d) and "Consumers" in headers(d),
         what="Type hidden and Consumers shown")
    ui.refresh()  # the choice is remembered
    wait(ui, lambda d: d.find_elements("css selector", "#queues-table"), what="the list")
    wait(ui, lambda d: "Type" not in headers(d) and "Consumers" in headers(d),
         what="the same columns after a reload")
    ui.execute_script("localStorage.removeItem('amqpd-queue-columns')")


def test_the_refresh_interval_and_admin_tabs_that_refresh(ui: Any, broker: BrokerProcess,
                                                          api: Api) -> None:
    go(ui, broker.http_url, "admin/users", "#users-table")
    wait_text(ui, "#last-refreshed", "Last refreshed")
    from selenium.webdriver.support.ui import Select

    Select(ui.find_element("css selector", "#refresh-interval")).select_by_value("2000")
    user = uid("newcomer")
    api.put(f"/api/users/{user}", {"password": "pw", "tags": ""})
    wait_text(ui, "#users-table", user, timeout=8)  # no reload: the tab refreshed itself
    ui.refresh()
    wait(ui, lambda d: d.find_elements("css selector", "#refresh-interval"), what="picker")
    assert ui.find_element("css selector", "#refresh-interval").get_attribute("value") \
        == "2000"  # remembered
    Select(ui.find_element("css selector", "#refresh-interval")).select_by_value("0")
    assert ui.execute_script("return localStorage.getItem('amqpd-refresh-ms')") == "0"
    Select(ui.find_element("css selector", "#refresh-interval")).select_by_value("5000")
