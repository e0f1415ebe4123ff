"""Stream queues in the web UI (issue 30), seen in headless Chromium.

The queues list shows a stream's type, size on disk, segment count and first and last
offset; the queue page shows the same log figures and each consumer's next offset and
lag, matched to its channel. Two pika consumers that never ack hold still at known
positions (their start plus their prefetch), so the page can be checked against exact
numbers. The Streams page lists the stream protocol's clients (rstream, port 5552 style
listener on an ephemeral port) with their publishing ids, offsets and state. One broker
for the module; skips with a clear message where Chromium or its driver is missing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.integration._http import Api, q
from tests.integration.webui_support import (
    go,
    module_broker,
    shot,
    text_of,
    uid,
    wait,
    wait_text,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(120)

N = 300          # messages published
BODY = b"x" * 100
PREFETCH = 7     # what each idle consumer holds unacked, so where its reader stops


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    yield from module_broker(tmp_path_factory, {"AMQPD_STATS_INTERVAL": "1",
                                                "AMQPD_STREAM": "1", "AMQPD_STREAM_PORT": "0"})


def _num(n: int) -> str:
    return f"{n:,}"


def _stream_of(api: Api, name: str, check: Any, what: str) -> dict[str, Any]:
    """The queue's ``stream`` section once ``check`` holds for it (poll, 15 s)."""
    deadline = time.monotonic() + 15
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = api.get(f"/api/queues/{q('/')}/{q(name)}").json().get("stream") or {}
        if last and check(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; the stream section: {last}")


def test_stream_in_the_queues_list_and_on_its_page(
        ui: Any, broker: BrokerProcess, api: Api) -> None:
    name, classic = uid("stream"), uid("classic")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare(classic, durable=True)
        ch.queue_declare(name, durable=True, arguments={
            "x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4000})
        ch.confirm_delivery()
        for _ in range(N):
            ch.basic_publish("", name, BODY)
        held: dict[str, int] = {}  # deliveries each idle consumer got (and never acks)

        def hold(_ch: Any, method: Any, *_: Any) -> None:
            held[method.consumer_tag] = held.get(method.consumer_tag, 0) + 1

        for start in ("first", 100):  # two idle consumers: at 0 + 7 and at 100 + 7
            c = conn.channel()
            c.basic_qos(prefetch_count=PREFETCH)
            c.basic_consume(name, hold, consumer_tag=f"reader-{start}",
                            arguments={"x-stream-offset": start})
        # every held delivery reaches its callback: pika rejects undispatched ones on
        # close, and a stream refuses basic.reject (540)
        deadline = time.monotonic() + 15
        while sorted(held.values()) != [PREFETCH, PREFETCH] and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert sorted(held.values()) == [PREFETCH, PREFETCH], held
        stats = _stream_of(api, name, lambda s: sorted(
            c["offset"] for c in s["consumers"]) == [PREFETCH, 100 + PREFETCH],
            "both consumers to hold their prefetch")
        assert stats["first_offset"] == 0 and stats["last_offset"] == N - 1
        assert stats["segments"] > 1, stats  # 300 records of 100 bytes in 4000-byte files

        # the list: type, size on disk, segments, offsets; a classic queue leaves them blank
        go(ui, broker.http_url, "queues", "#queues-table")
        row = f"#queues-table tr:has(a[href$='/{name}'])"
        wait_text(ui, f"{row} td.stream-last", _num(N - 1))
        cells = [td.text for td in ui.find_elements("css selector", f"{row} td")]
        assert "stream" in cells, cells
        assert text_of(ui, f"{row} td.stream-first") == "0"
        assert text_of(ui, f"{row} td.stream-segments") == _num(stats["segments"])
        size = text_of(ui, f"{row} td.stream-size")
        assert size.endswith("KiB") and float(size.split()[0]) > 0, size
        other = f"#queues-table tr:has(a[href$='/{classic}'])"
        assert text_of(ui, f"{other} td.stream-last") == ""

        # the queue page: the log, and each consumer's next offset and lag
        go(ui, broker.http_url, f"queues/{q('/')}/{q(name)}", "#stream-details")
        wait_text(ui, "#stream-last", _num(N - 1))
        assert text_of(ui, "#stream-first") == "0"
        assert text_of(ui, "#stream-segments") == _num(stats["segments"])
        table = "#queue-consumers-table"
        wait(ui, lambda d: len(d.find_elements("css selector", f"{table} td.stream-offset")) == 2,
             what="two stream consumers")
        shown = {}
        for tr in ui.find_elements("css selector", f"{table} tbody tr"):
            tag = tr.find_element("css selector", "td").text
            shown[tag] = (tr.find_element("css selector", "td.stream-offset").text,
                          tr.find_element("css selector", "td.stream-lag").text)
        assert shown == {
            "reader-first": (_num(PREFETCH), _num(N - PREFETCH)),
            "reader-100": (_num(100 + PREFETCH), _num(N - 100 - PREFETCH)),
        }, shown
        shot(ui, "stream-queue")

        # a classic queue's page has no stream panel
        go(ui, broker.http_url, f"queues/{q('/')}/{q(classic)}", "#queue-details")
        wait_text(ui, "#queue-details", "classic")
        assert not ui.find_element("css selector", "#stream-details").is_displayed()
    finally:
        conn.close()


def _row(ui: Any, table: str, needle: str) -> dict[str, str]:
    """The cells (by class) of the first row of ``table`` that shows ``needle``."""
    for tr in ui.find_elements("css selector", f"{table} tbody tr"):
        if needle in tr.text:
            return {td.get_attribute("class"): td.text
                    for td in tr.find_elements("css selector", "td")}
    raise AssertionError(f"no row with {needle!r} in {table}")


def test_stream_protocol_clients_page(ui: Any, broker: BrokerProcess) -> None:
    rstream = pytest.importorskip("rstream", reason="rstream (test extra) is not installed")
    port = int(broker.info["stream_port"])
    stream = uid("sproto")
    ready, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    async def clients() -> None:
        kw = {"port": port, "username": "guest", "password": "guest",
              "load_balancer_mode": True}
        async with rstream.Producer("127.0.0.1", **kw) as p, \
                rstream.Consumer("127.0.0.1", **kw) as c:
            await p.create_stream(stream)
            for i in (1, 2, 3):
                msg = rstream.AMQPMessage(body=f"u{i}".encode())
                msg.publishing_id = i
                await p.send_wait(stream, msg, publisher_name="ui-writer")
            seen = asyncio.Event()
            count = [0]

            async def on_message(msg: Any, ctx: Any) -> None:
                count[0] += 1
                if count[0] == 3:
                    seen.set()

            await c.start()
            await c.subscribe(stream, on_message, decoder=rstream.amqp_decoder,
                              offset_specification=rstream.ConsumerOffsetSpecification(
                                  rstream.OffsetType.FIRST, None))
            await asyncio.wait_for(seen.wait(), 20)
            ready.set()
            deadline = time.monotonic() + 120
            while not release.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

    def run() -> None:
        try:
            asyncio.run(clients())
        except BaseException as exc:  # reported by the test
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert ready.wait(30) and not errors, errors
        go(ui, broker.http_url, "streams", "#stream-publishers-table")
        assert ui.find_element("css selector", "#nav-streams").is_displayed()
        wait_text(ui, "#stream-publishers-table", "ui-writer")
        pub = _row(ui, "#stream-publishers-table", "ui-writer")
        assert (pub["num published"], pub["num confirmed"], pub["num last-id"],
                pub["num confirmed-id"], pub["stream"]) == ("3", "3", "3", "3", stream), pub
        wait_text(ui, "#stream-consumers-table", stream)
        sub = _row(ui, "#stream-consumers-table", stream)
        assert (sub["num offset"], sub["num lag"], sub["status"], sub["num consumed"]) == (
            "3", "0", "up", "3"), sub
        wait_text(ui, "#stream-connections-table", "guest")
        shot(ui, "stream-protocol-clients")
    finally:
        release.set()
        thread.join(30)
