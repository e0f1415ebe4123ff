"""Policies over the management API: priority, apply-to, clearing, the JSON shape."""

from __future__ import annotations

import base64
import json
import urllib.request

from tests.integration.ext_support import (
    channel,
    clear_policy,
    count,
    drain,
    queue_exists,
    set_policy,
    wait_for,
)


def _get(url: str) -> object:
    req = urllib.request.Request(url)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def test_highest_priority_applies_whole_and_clear_removes(broker) -> None:
    assert set_policy(broker.http_url, "/", "pp-low", "^pp\\.", {"max-length": 1},
                      priority=1) in (201, 204)
    assert set_policy(broker.http_url, "/", "pp-high", "^pp\\.q", {"message-ttl": 600000},
                      priority=5) in (201, 204)
    with channel(broker.url) as ch:
        ch.queue_declare("pp.q")
        for body in (b"1", b"2", b"3"):
            ch.basic_publish("", "pp.q", body)
        assert drain(ch, "pp.q") == [b"1", b"2", b"3"]  # pp-high wins; no merge with pp-low
        clear_policy(broker.http_url, "/", "pp-high")  # now pp-low applies
        for body in (b"4", b"5"):
            ch.basic_publish("", "pp.q", body)
        assert drain(ch, "pp.q") == [b"5"]
        clear_policy(broker.http_url, "/", "pp-low")
        for body in (b"6", b"7"):
            ch.basic_publish("", "pp.q", body)
        assert drain(ch, "pp.q") == [b"6", b"7"]


def test_apply_to_exchanges_leaves_queues_alone_and_json_shape(broker) -> None:
    assert set_policy(broker.http_url, "/", "pp-x", "^ppx", {"max-length": 1},
                      apply_to="exchanges") in (201, 204)
    with channel(broker.url) as ch:
        ch.queue_declare("ppx.q")
        ch.basic_publish("", "ppx.q", b"1")
        ch.basic_publish("", "ppx.q", b"2")
        wait_for(lambda: count(ch, "ppx.q") == 2, 3)
    listed = _get(f"{broker.http_url}/api/policies/%2F")
    assert isinstance(listed, list)
    (mine,) = [p for p in listed if p["name"] == "pp-x"]
    assert mine == {"vhost": "/", "name": "pp-x", "pattern": "^ppx", "apply-to": "exchanges",
                    "definition": {"max-length": 1}, "priority": 0}


def test_expires_and_dead_letter_routing_key_by_policy(broker) -> None:
    assert set_policy(broker.http_url, "/", "pp-exp", "^ppe\\.tmp$", {"expires": 150},
                      apply_to="queues") in (201, 204)
    assert set_policy(broker.http_url, "/", "pp-dl", "^ppe\\.work$", {
        "dead-letter-exchange": "", "dead-letter-routing-key": "ppe.dead"}) in (201, 204)
    with channel(broker.url) as ch:
        ch.queue_declare("ppe.tmp")
        ch.queue_declare("ppe.dead")
        ch.queue_declare("ppe.work")
        ch.basic_publish("", "ppe.work", b"x")
        method = wait_for(lambda: ch.basic_get("ppe.work", auto_ack=False)[0], 3)
        ch.basic_reject(method.delivery_tag, requeue=False)
        wait_for(lambda: count(ch, "ppe.dead") == 1, 3)
    wait_for(lambda: not queue_exists(broker.http_url, "/", "ppe.tmp"), 3, 0.05)
