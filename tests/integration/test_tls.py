"""TLS: pika over amqps with a test-generated CA, HTTPS API, client-certificate checks."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import sys
from pathlib import Path

import pika
import pika.exceptions
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def make_pki(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("amqpd test CA"))
          .issuer_name(_name("amqpd test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    paths = {"ca": d / "ca.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for role, cn, usage in (("server", "localhost", ExtendedKeyUsageOID.SERVER_AUTH),
                            ("client", "guest", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=10))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if role == "server":
            import ipaddress

            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        paths[f"{role}_cert"] = d / f"{role}.pem"
        paths[f"{role}_key"] = d / f"{role}.key"
        paths[f"{role}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, paths[f"{role}_key"])
    return paths


def start_tls_broker(proc: BrokerProcess, pki: dict[str, Path], **extra: str) -> BrokerProcess:
    proc.extra_args += ["--tls-port", "0"]
    proc.env.update({"AMQPD_TLS_CERT": str(pki["server_cert"]),
                     "AMQPD_TLS_KEY": str(pki["server_key"]),
                     "AMQPD_TLS_CA": str(pki["ca"]), **extra})
    proc.start()
    return proc


def client_context(pki: dict[str, Path], with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if with_cert:
        ctx.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
    return ctx


def amqps_params(proc: BrokerProcess, ctx: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host="127.0.0.1", port=int(proc.info["tls_port"]),
        credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(ctx, server_hostname="localhost"),
        connection_attempts=1)


def test_pika_over_amqps_and_https_api(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    proc = start_tls_broker(fresh_broker, pki, AMQPD_HTTP_TLS="true")
    assert proc.info["tls_port"]
    conn = pika.BlockingConnection(amqps_params(proc, client_context(pki)))
    ch = conn.channel()
    ch.queue_declare("tls-q")
    ch.basic_publish("", "tls-q", b"over tls")
    _, _, body = ch.basic_get("tls-q", auto_ack=True)
    assert body == b"over tls"
    api = Api(f"https://localhost:{proc.http_port}", context=client_context(pki))
    conns = api.get("/api/connections").json()
    assert [c["ssl"] for c in conns] == [True]
    assert api.get(f"/api/health/checks/port-listener/{proc.info['tls_port']}").status == 200
    assert api.get("/api/health/checks/protocol-listener/amqps").status == 200
    assert api.get("/api/health/checks/certificate-expiration/1/weeks").status == 200
    r = api.get("/api/health/checks/certificate-expiration/1/months")
    assert r.status == 503 and r.json()["status"] == "failed"  # server cert: 10 days
    conn.close()
    ctl = subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url",
                          f"https://localhost:{proc.http_port}", "--cacert", str(pki["ca"]),
                          "--json", "status"], capture_output=True, text=True, timeout=30,
                         check=False)
    assert ctl.returncode == 0, ctl.stderr
    assert f"amqps:127.0.0.1:{proc.info['tls_port']}" in json.loads(ctl.stdout)["listeners"]
    untrusted = subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url",
                                f"https://localhost:{proc.http_port}", "status"],
                               capture_output=True, text=True, timeout=30, check=False)
    assert untrusted.returncode == 69  # certificate not trusted: cannot connect
    # plain HTTP to the HTTPS port does not get an API answer
    with pytest.raises(OSError):
        Api(f"http://127.0.0.1:{proc.http_port}").get("/api/overview")


def test_client_certificate_required(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    proc = start_tls_broker(fresh_broker, pki, AMQPD_TLS_VERIFY_PEER="true",
                            AMQPD_TLS_FAIL_IF_NO_PEER_CERT="true")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(amqps_params(proc, client_context(pki)))
    conn = pika.BlockingConnection(amqps_params(proc, client_context(pki, with_cert=True)))
    assert conn.is_open
    conn.close()
    # the plain listener keeps working next to amqps
    plain = pika.BlockingConnection(pika.URLParameters(proc.url))
    plain.close()


def test_bad_tls_files_fail_startup(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    fresh_broker.env.update({"AMQPD_TLS_CERT": str(tmp_path / "missing.pem"),
                             "AMQPD_TLS_KEY": str(tmp_path / "missing.key")})
    with pytest.raises(RuntimeError, match="exited with 1"):
        fresh_broker.start()
    assert "cannot load TLS" in fresh_broker.tail()
