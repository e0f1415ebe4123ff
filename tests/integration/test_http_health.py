"""Health checks (RabbitMQ 3.10 bodies), /health/ready, aliveness-test and alarms."""

from __future__ import annotations

import time

import pytest

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http_url)


@pytest.mark.parametrize("path", [
    "/api/health/checks/alarms",
    "/api/health/checks/local-alarms",
    "/api/health/checks/virtual-hosts",
    "/api/health/checks/node-is-mirror-sync-critical",
    "/api/health/checks/node-can-declare",
    "/api/health/checks/protocol-listener/amqp091",
    "/api/health/checks/protocol-listener/amqp",
    "/api/health/checks/certificate-expiration/1/months",
    "/api/aliveness-test/%2F",
])
def test_healthy_checks_are_200_ok(api: Api, path: str) -> None:
    r = api.get(path)
    assert r.status == 200, r.text
    assert r.json()["status"] == "ok"
    assert r.headers["Content-Type"].startswith("application/json")


def test_checks_need_a_management_user(api: Api) -> None:
    r = api.as_user(None).get("/api/health/checks/alarms")
    assert r.status == 401
    assert r.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_port_listener(api: Api, broker: BrokerProcess) -> None:
    assert api.get(f"/api/health/checks/port-listener/{broker.port}").json() == {
        "status": "ok", "port": broker.port}
    r = api.get("/api/health/checks/port-listener/1")
    assert r.status == 503
    body = r.json()
    assert body["status"] == "failed" and body["reason"] == "No active listener"
    assert body["missing"] == 1 and broker.port in body["ports"]
    r = api.get("/api/health/checks/port-listener/abc")
    assert r.status == 400
    assert r.json() == {"error": "bad_request", "reason": "Invalid port"}


def test_http_listener_counts_as_a_listener(api: Api, broker: BrokerProcess) -> None:
    """RabbitMQ lists the management listener among the node's listeners (``http`` on its
    port), so both checks pass for it; the HTTP listener's own port and scheme are read from
    what it bound."""
    assert api.get(f"/api/health/checks/port-listener/{broker.http_port}").json() == {
        "status": "ok", "port": broker.http_port}
    assert api.get("/api/health/checks/protocol-listener/http").json() == {
        "status": "ok", "protocol": "http"}
    assert api.get("/api/health/checks/protocol-listener/https").status == 503


def test_protocol_listener_missing(api: Api) -> None:
    r = api.get("/api/health/checks/protocol-listener/mqtt")
    assert r.status == 503
    assert r.json()["status"] == "failed"


def test_quorum_critical_single_node(api: Api) -> None:
    assert api.get("/api/health/checks/node-is-quorum-critical").json() == {
        "status": "ok", "reason": "single node cluster"}


def test_aliveness_leaves_no_queue_and_unknown_vhost_is_404(api: Api) -> None:
    assert api.get("/api/aliveness-test/%2F").status == 200
    assert api.get("/api/queues/%2F/aliveness-test").status == 404
    assert api.get("/api/aliveness-test/no-such-vhost").status == 404


def test_aliveness_leaves_an_existing_queue_of_that_name_alone(api: Api) -> None:
    api.put("/api/queues/%2F/aliveness-test", {"durable": True})
    api.post("/api/exchanges/%2F/amq.default/publish",
             {"routing_key": "aliveness-test", "payload": "precious"})
    assert api.get("/api/aliveness-test/%2F").status == 200
    assert api.get("/api/queues/%2F/aliveness-test").json()["messages"] == 1
    assert api.delete("/api/queues/%2F/aliveness-test").status == 204


def test_ready_needs_no_credentials(api: Api) -> None:
    r = api.as_user(None).get("/health/ready")
    assert r.status == 200 and r.json() == {"status": "ok"}


def test_single_node_is_its_own_active_and_no_standby(api: Api) -> None:
    """Without [replication] the one node is where clients belong (an HAProxy in front
    of a single node works unchanged); it is nobody's standby."""
    anonymous = api.as_user(None)
    r = anonymous.get("/health/active")
    assert r.status == 200 and r.json() == {"status": "ok"}
    r = anonymous.get("/health/standby")
    assert r.status == 503 and "not part of a warren" in r.json()["reason"]
    assert "X-Amqpd-Role" not in r.headers
    assert api.get("/api/overview").json()["amqpd_role"] is None
    nodes = api.get("/api/nodes").json()
    assert len(nodes) == 1 and "amqpd_role" not in nodes[0]


def test_certificate_expiration_bad_unit(api: Api) -> None:
    assert api.get("/api/health/checks/certificate-expiration/1/fortnights").status == 400


def _wait_status(api: Api, path: str, status: int, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = api.get(path)
        if r.status == status or time.monotonic() > deadline:
            assert r.status == status, r.text
            return r.json()
        time.sleep(0.1)


def test_alarm_makes_checks_503(fresh_broker: BrokerProcess) -> None:
    fresh_broker.env["AMQPD_MEMORY_HIGH_WATERMARK_BYTES"] = "1"  # always above it
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    body = _wait_status(api, "/api/health/checks/alarms", 503)
    assert body["reason"] == "There are alarms in effect in the cluster"
    assert body["alarms"][0]["resource"] == "memory"
    body = api.get("/api/health/checks/local-alarms").json()
    assert body["reason"] == "There are alarms in effect on the node"
    r = api.as_user(None).get("/health/ready")
    assert r.status == 503 and r.json()["status"] == "failed"
    r = api.get("/api/aliveness-test/%2F")
    assert r.status == 503 and r.json()["status"] == "failed"
    assert api.get("/api/nodes").json()[0]["mem_alarm"] is True
    metrics = api.as_user(None).get("/metrics").text
    assert "rabbitmq_alarms_memory_used_watermark 1" in metrics


def test_busy_http_port_refuses_the_start(broker: BrokerProcess,
                                          fresh_broker: BrokerProcess) -> None:
    """Half a broker (AMQP without its API) is refused, as RabbitMQ refuses to start
    when a listener cannot bind (issue 18; tests/integration/test_startup_refusal.py)."""
    fresh_broker.env["AMQPD_HTTP_PORT"] = str(broker.http_port)  # taken by the other broker
    with pytest.raises(RuntimeError, match="exited with 1"):
        fresh_broker.start()
    assert "HTTP API cannot listen on" in fresh_broker.tail()
