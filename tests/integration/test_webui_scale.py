"""The web UI's queue list with 10,000 queues: it pages, sorts and filters on the server.

Its own broker, so the other browser tests do not pay for the queues. How long one page
takes is measured by bench/ui_paging.py, never asserted here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration._http import Api
from tests.integration.webui_support import (
    go,
    login,
    shot,
    text_of,
    wait,
    wait_text,
)
from tests.support.brokerproc import BrokerProcess

N = 10_000
BUSY = "scale-04321"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("amqpd"))
    proc.start()
    api = Api(proc.http_url)
    queues = [{"name": f"scale-{i:05d}", "vhost": "/", "durable": False, "auto_delete": False,
               "arguments": {}} for i in range(N)]
    assert api.post("/api/definitions", {"queues": queues}).status == 204
    for n in range(7):
        api.post("/api/exchanges/%2F/amq.default/publish",
                 {"routing_key": BUSY, "payload": str(n), "properties": {}})
    yield proc
    proc.stop()


def sort_by(driver: Any, key: str, arrow: str) -> None:
    """Click a column header (the table redraws itself, so look it up afresh) until the
    header shows the wanted direction."""
    def clicked(d: Any) -> bool:
        th = d.find_element("css selector", f"th[data-sort='{key}']")
        if th.text.endswith(arrow):
            return True
        th.click()
        return False
    wait(driver, clicked, what=f"{key} sorted {arrow}")


def first_row(driver: Any) -> str:
    return text_of(driver, "#queues-table tbody tr td.name")


def page_info(driver: Any) -> str:
    return text_of(driver, "#pager .page-info")


def test_ten_thousand_queues_page_sort_and_filter(browser: Any,
                                                 broker: BrokerProcess) -> None:
    login(browser, broker.http_url)
    go(browser, broker.http_url, "queues", "#queues-table")
    wait_text(browser, "#pager", "10,000 matching of 10,000")
    assert "Page 1 of 100" in page_info(browser)
    assert len(browser.find_elements("css selector", "#queues-table tbody tr")) == 100
    assert first_row(browser) == "scale-00000"
    shot(browser, "queues-10k", full=False)

    browser.find_element("xpath", "//div[@id='pager']/button[contains(., 'next')]").click()
    wait(browser, lambda d: "Page 2 of 100" in page_info(d), what="page 2")
    wait(browser, lambda d: first_row(d) == "scale-00100", what="page 2's first queue")

    sort_by(browser, "name", "▼")
    wait(browser, lambda d: first_row(d) == "scale-09999", what="names, reversed")
    assert "Page 1 of 100" in page_info(browser)
    sort_by(browser, "messages", "▼")
    wait(browser, lambda d: first_row(d) == BUSY, what="the queue with messages first")
    assert text_of(browser, "#queues-table tbody tr td.messages") == "7"

    browser.find_element("css selector", "#filter").send_keys("scale-0999")
    wait_text(browser, "#pager", "10 matching of 10,000")
    browser.find_element("css selector", "#filter").clear()
    browser.find_element("css selector", "#filter").send_keys("^SCALE-0000[1-3]$")
    browser.find_element("css selector", "#filter-regex").click()
    wait_text(browser, "#pager", "3 matching of 10,000")
    # The table may redraw once more after the pager's count changes (the filter's request
    # and the periodic refresh race), so read the rows through wait(), which looks again
    # when an element goes stale.
    want = ["scale-00001", "scale-00002", "scale-00003"]
    wait(browser, lambda d: sorted(e.text for e in d.find_elements(
        "css selector", "#queues-table td.name")) == want, what="the three regex matches")
    shot(browser, "queues-10k-filtered", full=False)
