"""``workers = 2`` with TLS (docs/workers.md, "TLS"): amqps and HTTPS through the node.

The node's amqps port is the supervisor's; it hands each accepted socket to a worker,
which runs the TLS handshake with the node's certificate. Each test starts a real node
(supervisor + two workers), opens amqps connections until both workers hold some
(where a connection landed is read from the workers' private APIs, never assumed), and
checks what a single broker's tests check (tests/integration/test_tls.py): messages
cross between the workers over TLS connections, client certificates are required or
refused, EXTERNAL takes the user from the certificate, the API says ``ssl``.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration._http import Api
from tests.integration.test_tls import (
    _client_cert,
    _context_with,
    _external_params,
    _own_pki,
    amqps_params,
    client_context,
)
from tests.integration.workers_support import connection_names, drain, wait_for, workers_node
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(240)

N = 500


def tls_env(pki: dict[str, Path], **extra: str) -> dict[str, str]:
    return {"AMQPD_TLS_CERT": str(pki["server_cert"]), "AMQPD_TLS_KEY": str(pki["server_key"]),
            "AMQPD_TLS_CA": str(pki["ca"]), **extra}


def tls_on(node: BrokerProcess, index: int, ctx: ssl.SSLContext,
           external: bool = False) -> pika.BlockingConnection:
    """An amqps connection through the node's TLS port that landed on worker ``index``
    (others opened meanwhile are closed)."""
    extras: list[pika.BlockingConnection] = []
    try:
        for _ in range(8):
            name = f"tls-w{index}-{uuid.uuid4().hex[:8]}"
            params = _external_params(node, ctx) if external else amqps_params(node, ctx)
            params.client_properties = {"connection_name": name}
            conn = pika.BlockingConnection(params)
            where = wait_for(lambda n=name: [i for i in (0, 1) if n in connection_names(node, i)],
                             10, f"connection {name} listed by a worker")
            if where == [index]:
                return conn
            extras.append(conn)
        raise AssertionError(f"no amqps connection landed on worker {index} in 8 tries")
    finally:
        for c in extras:
            c.close()


def test_amqps_clients_on_both_workers_exchange_messages_and_https_api(tmp_path: Path) -> None:
    pki, _ca, _ca_key = _own_pki(tmp_path)
    with workers_node(tmp_path / "node", env=tls_env(pki, AMQPD_HTTP_TLS="true"),
                      extra_args=["--tls-port", "0"]) as node:
        tls_port = int(node.info["tls_port"])
        assert tls_port and tls_port != node.port
        ctx = client_context(pki)
        # several clients: both workers get some (read back from the workers)
        conns = [pika.BlockingConnection(amqps_params(node, ctx)) for _ in range(4)]
        wait_for(lambda: all(connection_names(node, i) for i in (0, 1)), 10,
                 "amqps connections on both workers")
        a, b = tls_on(node, 0, ctx), tls_on(node, 1, ctx)
        ca, cb = a.channel(), b.channel()
        # a queue owned by worker 0 (declared there), fed over TLS on worker 1 with
        # confirms, consumed over TLS on worker 0; and the other way round
        ca.queue_declare("tls-w0", durable=True)
        cb.queue_declare("tls-w1", durable=True)
        ca.confirm_delivery()
        cb.confirm_delivery()
        for i in range(N):
            cb.basic_publish("", "tls-w0", f"b{i}".encode(),
                             pika.BasicProperties(delivery_mode=2))
            ca.basic_publish("", "tls-w1", f"a{i}".encode(),
                             pika.BasicProperties(delivery_mode=2))
        for ch, queue, prefix in ((ca, "tls-w0", "b"), (cb, "tls-w1", "a")):
            got = drain(ch, queue, N)
            assert got == [f"{prefix}{i}".encode() for i in range(N)]  # all, in order
        # the node's HTTPS port (the supervisor's front) answers for both workers
        api = Api(f"https://localhost:{node.http_port}", context=client_context(pki))
        listed = api.get("/api/connections").json()
        assert len(listed) == 6 and all(c["ssl"] for c in listed)
        assert {c["port"] for c in listed} == {tls_port}  # the node's port, not a worker's
        assert api.get(f"/api/health/checks/port-listener/{tls_port}").status == 200
        assert api.get("/api/health/checks/protocol-listener/amqps").status == 200
        assert api.get("/api/health/checks/protocol-listener/https").status == 200
        overview = api.get("/api/overview").json()
        assert {(x["protocol"], x["port"]) for x in overview["listeners"]} == {
            ("amqp", node.port), ("amqps", tls_port), ("https", node.http_port)}
        ctl = subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url",
                              f"https://localhost:{node.http_port}", "--cacert",
                              str(pki["ca"]), "--json", "status"], capture_output=True,
                             text=True, timeout=30, check=False)
        assert ctl.returncode == 0, ctl.stderr
        assert f"amqps:127.0.0.1:{tls_port}" in json.loads(ctl.stdout)["listeners"]
        # plain HTTP to the HTTPS port gets no API answer
        with pytest.raises(OSError):
            Api(f"http://127.0.0.1:{node.http_port}").get("/api/overview")
        # a client that speaks no TLS to the amqps port is refused; the node serves on
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", tls_port, connection_attempts=1, socket_timeout=5))
        for c in [a, b, *conns]:
            c.close()
        pika.BlockingConnection(amqps_params(node, ctx)).close()
        pika.BlockingConnection(pika.URLParameters(node.url)).close()  # plain AMQP too


def test_client_certificates_and_external_on_either_worker(tmp_path: Path) -> None:
    pki, ca, ca_key = _own_pki(tmp_path)
    with workers_node(tmp_path / "node", env=tls_env(
            pki, AMQPD_TLS_VERIFY_PEER="true", AMQPD_TLS_FAIL_IF_NO_PEER_CERT="true",
            AMQPD_AUTH_MECHANISMS="EXTERNAL,PLAIN,AMQPLAIN",
            AMQPD_SSL_CERT_LOGIN_FROM="common_name"),
            extra_args=["--tls-port", "0"]) as node:
        day = dt.timedelta(days=1)
        guest = _context_with(pki, *_client_cert(tmp_path, ca, ca_key, "guest", "guest",
                                                 -day, 10 * day))
        expired = _context_with(pki, *_client_cert(tmp_path, ca, ca_key, "guest", "expired",
                                                   -10 * day, -day))
        nobody = _context_with(pki, *_client_cert(tmp_path, ca, ca_key, "nobody", "nobody",
                                                  -day, 10 * day))
        # refused at the handshake, whichever worker a try lands on (four tries: round
        # robin gives each worker some)
        for _ in range(4):
            with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
                pika.BlockingConnection(amqps_params(node, client_context(pki)))
            with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
                pika.BlockingConnection(amqps_params(node, expired))
        # EXTERNAL: the user is the certificate's common name, on each worker
        for index in (0, 1):
            conn = tls_on(node, index, guest, external=True)
            conn.channel().queue_declare(f"ext-{index}")
            users = {c["user"] for c in Api(node.http_url).get("/api/connections").json()}
            assert users == {"guest"}
            conn.close()
        for _ in range(2):  # a certificate naming no user is refused on either worker
            with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
                pika.BlockingConnection(_external_params(node, nobody))
            assert "Login was refused using authentication mechanism EXTERNAL" in str(
                info.value)
        # the refusal is in the node's log as a single broker writes it (the workers
        # write to the node's output)
        wait_for(lambda: node.log_path.read_text().count("EXTERNAL login refused from") >= 2,
                 10, "the refusals in the node's log")
        pika.BlockingConnection(amqps_params(node, guest)).close()  # PLAIN next to it


def test_bad_tls_files_stop_the_node_at_start(tmp_path: Path) -> None:
    node = BrokerProcess(tmp_path / "node", extra_args=["--workers", "2"], env={
        "AMQPD_TLS_CERT": str(tmp_path / "missing.pem"),
        "AMQPD_TLS_KEY": str(tmp_path / "missing.key")})
    with pytest.raises(RuntimeError, match="exited with 1"):
        node.start(timeout=60)
    assert "cannot load TLS" in node.tail()
