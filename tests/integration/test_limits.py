"""Vhost and user limits, channel_max and max_message_size as RabbitMQ 3.10 enforces them
(texts recorded against a private RabbitMQ 3.10.8 through its management API), and
shown in the HTTP API (broker/resource_limits.py, http/limits.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess


@pytest.fixture
def api(broker: BrokerProcess) -> Iterator[Api]:
    a = Api(broker.http_url)
    yield a
    for name in ("max-connections", "max-queues"):
        a.delete(f"/api/vhost-limits/%2F/{name}")
    for name in ("max-connections", "max-channels"):
        a.delete(f"/api/user-limits/guest/{name}")


def connect(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def test_vhost_limits(broker: BrokerProcess, api: Api) -> None:
    assert api.put("/api/vhost-limits/%2F/max-connections", {"value": 1}).status == 204
    assert api.put("/api/vhost-limits/%2F/max-queues", {"value": 1}).status == 204
    shown = [{"vhost": "/", "value": {"max-connections": 1, "max-queues": 1}}]
    assert api.get("/api/vhost-limits").json() == shown
    assert api.get("/api/vhost-limits/%2F").json() == shown
    first = connect(broker)
    try:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            connect(broker)
        assert ("NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection "
                "limit (1) is reached") in str(info.value)
        ch = first.channel()
        ch.queue_declare("lim.q1")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.queue_declare("lim.q2")
        assert closed.value.reply_code == 406
        assert closed.value.reply_text == ("PRECONDITION_FAILED - cannot declare queue "
                                           "'lim.q2': queue limit in vhost '/' (1) is reached")
        ch = first.channel()
        ch.queue_declare("lim.q1")  # redeclaring an existing queue is fine
        ch.queue_delete("lim.q1")
    finally:
        first.close()
    assert api.delete("/api/vhost-limits/%2F/max-connections").status == 204
    assert api.get("/api/vhost-limits").json() == [{"vhost": "/", "value": {"max-queues": 1}}]
    bad = api.put("/api/vhost-limits/%2F/max-bogus", {"value": 1})
    assert bad.status == 400
    assert api.put("/api/vhost-limits/%2F/max-queues", {"value": "x"}).status == 400


def test_http_queue_create_obeys_max_queues(broker: BrokerProcess, api: Api) -> None:
    """PUT /api/queues goes through the same limit as queue.declare (BrokerAPI). RabbitMQ
    3.10.8 (private node, max-queues 1, one queue there) answered PUT of a new queue,
    classic or quorum, with 400 ``{"error":"bad_request","reason":"cannot declare queue
    'lim2': queue limit in vhost '/' (1) is reached"}`` and PUT of the existing one
    with 204."""
    existing = len(api.get("/api/queues/%2F").json())
    assert api.put("/api/vhost-limits/%2F/max-queues", {"value": existing + 1}).status == 204
    try:
        assert api.put("/api/queues/%2F/lim.h1", {"durable": True}).status == 201
        for args in ({}, {"x-queue-type": "quorum"}):
            r = api.put("/api/queues/%2F/lim.h2", {"durable": True, "arguments": args})
            assert (r.status, r.json()) == (400, {
                "error": "bad_request", "reason": "cannot declare queue 'lim.h2': queue "
                f"limit in vhost '/' ({existing + 1}) is reached"})
        assert api.get("/api/queues/%2F/lim.h2").status == 404
        assert api.put("/api/queues/%2F/lim.h1", {"durable": True}).status == 204
    finally:
        api.delete("/api/queues/%2F/lim.h1")


def test_definitions_import_obeys_max_queues(broker: BrokerProcess, api: Api) -> None:
    """An import is checked against the vhost's queue limit as a whole, before anything
    is applied. RabbitMQ 3.10.8 (private node, vhost 'lim' with max-queues 1) answered
    POST /api/definitions with three new queues with 400 and this reason, and imported
    none; re-importing a queue that exists does not count against the limit."""
    assert api.put("/api/vhosts/lim.imp", {}).status == 201
    try:
        assert api.put("/api/vhost-limits/lim.imp/max-queues", {"value": 1}).status == 204

        def doc(*names: str) -> dict[str, object]:
            return {"queues": [{"name": n, "vhost": "lim.imp", "durable": True,
                                "auto_delete": False, "arguments": {}} for n in names]}

        r = api.post("/api/definitions", doc("q1", "q2", "q3"))
        assert (r.status, r.json()) == (400, {
            "error": "bad_request",
            "reason": 'Adding 3 queue(s) to virtual host "lim.imp" would exceed the limit '
                      "of 1 queue(s).\n\nThis virtual host currently has 0 queue(s) "
                      "defined.\n\nImport aborted!"})
        assert api.get("/api/queues/lim.imp").json() == []
        assert api.post("/api/definitions", doc("q1")).status == 204
        assert api.post("/api/definitions", doc("q1")).status == 204  # exists: not new
        one_vhost: dict[str, Any] = {"queues": [
            {"name": n, "durable": True, "auto_delete": False, "arguments": {}}
            for n in ("q5", "q6")]}
        r = api.post("/api/definitions/lim.imp", one_vhost)
        assert r.status == 400
        assert "currently has 1 queue(s) defined" in r.json()["reason"]
        assert [q["name"] for q in api.get("/api/queues/lim.imp").json()] == ["q1"]
    finally:
        api.delete("/api/vhosts/lim.imp")


def test_user_limits(broker: BrokerProcess, api: Api) -> None:
    assert api.put("/api/user-limits/guest/max-connections", {"value": 1}).status == 204
    assert api.put("/api/user-limits/guest/max-channels", {"value": 1}).status == 204
    shown = [{"user": "guest", "value": {"max-connections": 1, "max-channels": 1}}]
    assert api.get("/api/user-limits").json() == shown
    assert api.get("/api/user-limits/guest").json() == shown
    assert api.get("/api/users/guest").json()["limits"] == shown[0]["value"]
    first = connect(broker)
    try:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            connect(broker)
        assert ("NOT_ALLOWED - connection refused for user 'guest': user connection limit "
                "(1) is reached") in str(info.value)
        first.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            first.channel()
        assert closed.value.reply_code == 530
        assert closed.value.reply_text == (
            "NOT_ALLOWED - number of channels opened for user 'guest' has reached the "
            "maximum allowed user limit of (1)")
    finally:
        if first.is_open:
            first.close()
    defs = api.get("/api/definitions").json()
    assert [u["limits"] for u in defs["users"] if u["name"] == "guest"] == [shown[0]["value"]]


def test_limits_survive_a_restart(fresh_broker: BrokerProcess) -> None:
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    api.put("/api/vhost-limits/%2F/max-queues", {"value": 3})
    api.put("/api/user-limits/guest/max-channels", {"value": 7})
    assert fresh_broker.stop() == 0
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    assert api.get("/api/vhost-limits").json() == [{"vhost": "/", "value": {"max-queues": 3}}]
    assert api.get("/api/user-limits").json() == [{"user": "guest",
                                                   "value": {"max-channels": 7}}]


def test_channel_max_and_max_message_size(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", env={"AMQPD_CHANNEL_MAX": "2",
                                                 "AMQPD_MAX_MESSAGE_SIZE": "100"}).start()
    try:
        conn = connect(proc)
        assert conn._impl.params.channel_max == 2
        ch = conn.channel()
        ch.queue_declare("lim.big", exclusive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.basic_publish("", "lim.big", b"x" * 101)
            ch.queue_declare("lim.big", passive=True)  # the close arrives by now
        assert closed.value.reply_code == 406
        assert closed.value.reply_text == ("PRECONDITION_FAILED - message size 101 is larger "
                                           "than configured max size 100")
        conn.channel()
        conn.channel()
        conns = Api(proc.http_url).get("/api/connections").json()
        assert [c["channel_max"] for c in conns] == [2]
        conn.close()
    finally:
        proc.stop()


def test_operator_policies_cap_queue_limits(fresh_broker: BrokerProcess) -> None:
    """The lower of the operator policy and the queue's own limit wins (RabbitMQ 3.10:
    an operator max-length 2 over x-max-length 5 keeps 2 messages); shown in the API,
    kept across a restart, unknown keys refused with RabbitMQ's words."""
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    body = {"pattern": "^opq", "definition": {"max-length": 2}, "priority": 0,
            "apply-to": "queues"}
    assert api.put("/api/operator-policies/%2F/op1", body).status == 201
    listed = api.get("/api/operator-policies").json()
    assert listed == [{"vhost": "/", "name": "op1", "pattern": "^opq", "apply-to": "queues",
                       "definition": {"max-length": 2}, "priority": 0}]
    assert api.get("/api/operator-policies/%2F").json() == listed
    bad = api.put("/api/operator-policies/%2F/op2", {
        "pattern": "^opq", "definition": {"alternate-exchange": "x"}, "apply-to": "queues"})
    assert bad.status == 400
    assert "are not recognised policy settings" in bad.json()["reason"]
    conn = connect(fresh_broker)
    ch = conn.channel()
    ch.queue_declare("opq1", durable=True, arguments={"x-max-length": 5})
    ch.queue_declare("other1", durable=True, arguments={"x-max-length": 5})
    ch.confirm_delivery()
    for _ in range(6):
        ch.basic_publish("", "opq1", b"x")
        ch.basic_publish("", "other1", b"x")
    assert ch.queue_declare("opq1", passive=True).method.message_count == 2
    assert ch.queue_declare("other1", passive=True).method.message_count == 5
    conn.close()
    q = api.get("/api/queues/%2F/opq1").json()
    assert q["operator_policy"] == "op1"
    assert q["effective_policy_definition"] == {"max-length": 2}
    assert fresh_broker.stop() == 0
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    assert api.get("/api/operator-policies").json() == listed
    assert api.get("/api/queues/%2F/opq1").json()["operator_policy"] == "op1"
    assert api.delete("/api/operator-policies/%2F/op1").status == 204
    assert api.get("/api/operator-policies").json() == []
