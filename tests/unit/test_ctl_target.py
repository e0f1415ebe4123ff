"""amqpctl without --url: the broker's address and credentials from its settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqpd import ctl, ctl_target
from amqpd.config import ConfigError, Settings


def test_the_config_file_is_the_brokers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "etc-amqpd.toml"
    monkeypatch.setattr(ctl_target, "DEFAULT_CONFIG", str(default))
    assert ctl_target.config_path(None, {}) is None  # nothing installed: defaults
    default.write_text("")
    assert ctl_target.config_path(None, {}) == str(default)
    assert ctl_target.config_path(None, {"AMQPD_CONFIG": "/x.toml"}) == "/x.toml"
    assert ctl_target.config_path("/y.toml", {"AMQPD_CONFIG": "/x.toml"}) == "/y.toml"


@pytest.mark.parametrize(("bind", "http_bind", "host"), [
    ("0.0.0.0", "", "127.0.0.1"),
    ("127.0.0.2", "", "127.0.0.2"),
    ("0.0.0.0", "::", "[::1]"),
    ("0.0.0.0", "::1", "[::1]"),
    ("0.0.0.0", "10.1.2.3", "10.1.2.3"),
    ("0.0.0.0", "broker.example", "broker.example"),
])
def test_the_api_address_follows_the_listener(bind: str, http_bind: str, host: str) -> None:
    target = ctl_target.from_settings(Settings(bind=bind, http_bind=http_bind,
                                               http_port=25672), "test")
    assert target.url == f"http://{host}:25672"


def test_credentials_are_the_default_users() -> None:
    target = ctl_target.from_settings(Settings(default_user="ops", default_pass="pw"), "t")
    assert (target.url, target.username, target.password) == (
        "http://127.0.0.1:15672", "ops", "pw")


def test_no_reachable_api_is_explained() -> None:
    with pytest.raises(ctl_target.NoApi, match="management = false"):
        ctl_target.from_settings(Settings(management=False), "config file f")
    with pytest.raises(ctl_target.NoApi, match="http_port = 0"):
        ctl_target.from_settings(Settings(http_port=0), "config file f")
    with pytest.raises(ctl_target.NoApi, match="names no tls_cert"):
        ctl_target.from_settings(Settings(http_tls=True), "config file f")


def test_environment_over_file_and_where_it_came_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctl_target, "DEFAULT_CONFIG", str(tmp_path / "none.toml"))
    config = tmp_path / "amqpd.toml"
    config.write_text('[management]\nhttp_port = 25001\nhttp_bind = "127.0.0.3"\n')
    target = ctl_target.discover(str(config), {"AMQPD_HTTP_PORT": "25002",
                                               "AMQPD_PURE_PYTHON": "1"})
    assert target.url == "http://127.0.0.3:25002"
    assert target.origin == f"config file {config} and environment (AMQPD_HTTP_PORT)"
    assert ctl_target.discover(None, {}).origin == "amqpd's default settings"


def test_https_pins_the_first_certificate_of_tls_cert(tmp_path: Path) -> None:
    chain = tmp_path / "chain.pem"
    leaf = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"
    other = b"-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----"
    chain.write_bytes(leaf + b"\n" + other + b"\n")
    target = ctl_target.from_settings(Settings(http_tls=True, tls_cert=str(chain)), "t")
    assert target.url == "https://127.0.0.1:15672" and target.pinned_cert == leaf
    chain.write_bytes(b"not a certificate")
    with pytest.raises(ConfigError, match="no PEM certificate"):
        ctl_target.from_settings(Settings(http_tls=True, tls_cert=str(chain)), "t")


def test_exit_codes_for_unusable_settings(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMQPCTL_URL", raising=False)
    missing = str(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("port = 'many'\n")
    off = tmp_path / "off.toml"
    off.write_text("management = false\n")
    assert ctl.main(["--config", missing, "list_queues"]) == ctl.EX_NOINPUT
    assert ctl.main(["--config", str(bad), "list_queues"]) == ctl.EX_DATAERR
    assert ctl.main(["--config", str(off), "list_queues"]) == ctl.EX_USAGE


def test_url_and_user_flags_win(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "amqpd.toml"
    config.write_text('default_user = "ops"\ndefault_pass = "pw"\nhttp_port = 25003\n')
    args = ctl.build_parser().parse_args(["--config", str(config), "status"])
    assert ctl.target(args, {}).url == "http://127.0.0.1:25003"
    assert (ctl.target(args, {}).username, ctl.target(args, {}).password) == ("ops", "pw")
    found = ctl.target(args, {"AMQPCTL_USERNAME": "ann", "AMQPCTL_PASSWORD": "x"})
    assert (found.username, found.password) == ("ann", "x")
    args = ctl.build_parser().parse_args(["--url", "http://h:1", "status", "-u", "bob"])
    found = ctl.target(args, {"AMQPD_HTTP_PORT": "25004"})
    assert (found.url, found.username, found.password) == ("http://h:1", "bob", "guest")
    assert ctl.target(ctl.build_parser().parse_args(["status"]),
                      {"AMQPCTL_URL": "http://u:2"}).url == "http://u:2"
