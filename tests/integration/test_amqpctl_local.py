"""amqpctl with no --url reaches the broker of its config file / AMQPD_* variables, as
rabbitmqctl reaches its node: non-default ports and credentials, and HTTPS with the
broker's own certificate pinned."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pika
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from devtools.rabbitmq import free_ports
from tests.support.brokerproc import BrokerProcess


def free_port() -> int:
    """A port nobody listens on now (the broker binds it right after), outside the
    kernel's ephemeral range (devtools.rabbitmq.free_ports)."""
    return free_ports(1)[0]


def ctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """amqpctl with only ``env`` beyond the basics: no AMQPCTL_* or AMQPD_* settings of
    the test session leak in."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("AMQPCTL_", "AMQPD_")) or k == "AMQPD_PURE_PYTHON"}
    return subprocess.run([sys.executable, "-m", "amqpd.ctl", *args], capture_output=True,
                          text=True, timeout=60, env={**base, **env}, check=False)


def declare(proc: BrokerProcess, user: str, password: str) -> str:
    name = f"local-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", proc.port, credentials=pika.PlainCredentials(user, password)))
    conn.channel().queue_declare(name)
    conn.close()
    return name


def listed(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [row["name"] for row in json.loads(result.stdout)]


def test_only_the_config_file(tmp_path: Path) -> None:
    port, password = free_port(), uuid.uuid4().hex
    config = tmp_path / "amqpd.toml"
    config.write_text(f'[defaults]\ndefault_user = "ops"\ndefault_pass = "{password}"\n'
                      f"[management]\nhttp_port = {port}\n")
    proc = BrokerProcess(tmp_path / "amqpd", extra_args=["--config", str(config)],
                         env={"AMQPD_HTTP_PORT": str(port)})  # what the file says
    proc.start()
    try:
        assert proc.http_port == port
        name = declare(proc, "ops", password)
        assert name in listed(ctl("--config", str(config), "--json", "list_queues", env={}))
        assert name in listed(ctl("--json", "list_queues", env={"AMQPD_CONFIG": str(config)}))
        # the config's credentials, not guest's: guest does not exist on this broker
        refused = ctl("--config", str(config), "-u", "guest", "--password", "guest",
                      "list_queues", env={})
        assert refused.returncode == 77, refused.stderr
    finally:
        proc.stop()


def test_only_amqpd_variables(tmp_path: Path) -> None:
    port, password = free_port(), uuid.uuid4().hex
    env = {"AMQPD_HTTP_PORT": str(port), "AMQPD_DEFAULT_USER": "ops2",
           "AMQPD_DEFAULT_PASS": password}
    proc = BrokerProcess(tmp_path / "amqpd", env=env)
    proc.start()
    try:
        name = declare(proc, "ops2", password)
        assert name in listed(ctl("--json", "list_queues", env=env))
        proc.stop()
        down = ctl("list_queues", env=env)
        assert down.returncode == 69
        assert f"cannot connect to http://127.0.0.1:{port} (from environment (" in down.stderr
    finally:
        proc.stop()


def _certificate(directory: Path, name: str, issuer: tuple[x509.Certificate,
                 ec.EllipticCurvePrivateKey] | None = None) -> tuple[x509.Certificate,
                                                                     ec.EllipticCurvePrivateKey]:
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (x509.CertificateBuilder().subject_name(subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=2)))
    if issuer is None:  # a CA
        builder = builder.issuer_name(subject).add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True)
        cert = builder.sign(key, hashes.SHA256())
    else:  # a server certificate for a host name that is not the loopback address
        builder = builder.issuer_name(issuer[0].subject).add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        cert = builder.sign(issuer[1], hashes.SHA256())
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return cert, key


def test_https_with_the_brokers_certificate_pinned(tmp_path: Path) -> None:
    """The broker's certificate names broker.example.test, not 127.0.0.1, and is issued
    by a CA amqpctl was never told about: it is accepted because it is the very one the
    config's tls_cert holds. Another certificate from the same CA is not."""
    ca = _certificate(tmp_path, "test-ca")
    _certificate(tmp_path, "broker.example.test", ca)
    _certificate(tmp_path, "impostor.example.test", ca)
    port = free_port()
    settings = (f"http_port = {port}\nhttp_tls = true\ntls_port = 0\n"
                f'tls_key = "{tmp_path}/broker.example.test.key"\n')
    config = tmp_path / "amqpd.toml"
    config.write_text(settings + f'tls_cert = "{tmp_path}/broker.example.test.pem"\n')
    proc = BrokerProcess(tmp_path / "amqpd", extra_args=["--config", str(config)],
                         env={"AMQPD_HTTP_PORT": str(port)})
    proc.start()
    try:
        name = declare(proc, "guest", "guest")
        assert name in listed(ctl("--config", str(config), "--json", "list_queues", env={}))
        wrong = tmp_path / "wrong.toml"
        wrong.write_text(settings + f'tls_cert = "{tmp_path}/impostor.example.test.pem"\n')
        refused = ctl("--config", str(wrong), "list_queues", env={})
        assert refused.returncode == 69
        assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr, refused.stderr
        # --cacert verifies against the CA instead, host name included: 127.0.0.1 is not
        # in the certificate
        by_ca = ctl("--config", str(config), "--cacert", str(tmp_path / "test-ca.pem"),
                    "list_queues", env={})
        assert by_ca.returncode == 69 and "127.0.0.1" in by_ca.stderr, by_ca.stderr
    finally:
        proc.stop()
