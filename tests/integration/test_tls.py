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


# -- peer verification and EXTERNAL (issue 18) ---------------------------------------------


def _ca(d: Path, cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path]:
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path = d / f"{cn.replace(' ', '_')}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def _client_cert(d: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, cn: str,
                 tag: str, valid_from: dt.timedelta, valid_to: dt.timedelta) -> tuple[Path, Path]:
    """A client certificate valid from now+valid_from to now+valid_to."""
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + valid_from).not_valid_after(now + valid_to)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = d / f"{tag}.pem", d / f"{tag}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path


def _context_with(pki: dict[str, Path], cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _own_pki(tmp_path: Path) -> tuple[dict[str, Path], x509.Certificate,
                                      ec.EllipticCurvePrivateKey]:
    """A PKI whose CA key the test keeps (to issue expired / future certificates)."""
    import ipaddress

    ca, ca_key, ca_path = _ca(tmp_path, "amqpd issue18 CA")
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    server = (x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca.subject)
              .public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(days=1))
              .not_valid_after(now + dt.timedelta(days=10))
              .add_extension(x509.SubjectAlternativeName([
                  x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                  critical=False)
              .sign(ca_key, hashes.SHA256()))
    pki = {"ca": ca_path, "server_cert": tmp_path / "srv.pem", "server_key": tmp_path / "srv.key"}
    pki["server_cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pki["server_key"])
    return pki, ca, ca_key


def _refused_handshake(proc: BrokerProcess, ctx: ssl.SSLContext) -> None:
    with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
        pika.BlockingConnection(amqps_params(proc, ctx))


def test_peer_verification_refuses_wrong_ca_expired_and_future_certificates(
        fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    pki, ca, ca_key = _own_pki(tmp_path)
    proc = start_tls_broker(fresh_broker, pki, AMQPD_TLS_VERIFY_PEER="true",
                            AMQPD_TLS_FAIL_IF_NO_PEER_CERT="true")
    day = dt.timedelta(days=1)
    good = _client_cert(tmp_path, ca, ca_key, "guest", "good", -day, 10 * day)
    conn = pika.BlockingConnection(amqps_params(proc, _context_with(pki, *good)))
    conn.close()
    other, other_key, _ = _ca(tmp_path, "someone else's CA")
    _refused_handshake(proc, _context_with(
        pki, *_client_cert(tmp_path, other, other_key, "guest", "wrong_ca", -day, 10 * day)))
    _refused_handshake(proc, _context_with(
        pki, *_client_cert(tmp_path, ca, ca_key, "guest", "expired", -10 * day, -day)))
    _refused_handshake(proc, _context_with(
        pki, *_client_cert(tmp_path, ca, ca_key, "guest", "future", day, 10 * day)))
    # and a client that trusts another CA refuses the broker's certificate
    _, _, other_ca_path = _ca(tmp_path, "a third CA")
    _refused_handshake(proc, ssl.create_default_context(cafile=str(other_ca_path)))
    # the broker kept serving: a good client still gets in
    conn = pika.BlockingConnection(amqps_params(proc, _context_with(pki, *good)))
    conn.close()


def _external_params(proc: BrokerProcess, ctx: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host="127.0.0.1", port=int(proc.info["tls_port"]),
        credentials=pika.credentials.ExternalCredentials(),
        ssl_options=pika.SSLOptions(ctx, server_hostname="localhost"), connection_attempts=1)


def test_external_mechanism_takes_the_user_from_the_certificate(
        fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    pki, ca, ca_key = _own_pki(tmp_path)
    proc = start_tls_broker(fresh_broker, pki, AMQPD_TLS_VERIFY_PEER="true",
                            AMQPD_AUTH_MECHANISMS="EXTERNAL,PLAIN,AMQPLAIN",
                            AMQPD_SSL_CERT_LOGIN_FROM="common_name")
    day = dt.timedelta(days=1)
    guest = _client_cert(tmp_path, ca, ca_key, "guest", "guest", -day, 10 * day)
    conn = pika.BlockingConnection(_external_params(proc, _context_with(pki, *guest)))
    ch = conn.channel()
    ch.queue_declare("ext-q")
    users = [c["user"] for c in Api(proc.http_url).get("/api/connections").json()]
    assert users == ["guest"]
    conn.close()
    nobody = _client_cert(tmp_path, ca, ca_key, "nobody", "nobody", -day, 10 * day)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(_external_params(proc, _context_with(pki, *nobody)))
    assert "Login was refused using authentication mechanism EXTERNAL" in str(info.value)
    # without a client certificate, or over plain AMQP, EXTERNAL is not offered
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(_external_params(proc, client_context(pki)))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=proc.port, connection_attempts=1,
            credentials=pika.credentials.ExternalCredentials()))
    # PLAIN still works next to it
    pika.BlockingConnection(amqps_params(proc, _context_with(pki, *guest))).close()
