"""etc/amqpd.toml documents every setting, and loads; env and flags override it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amqpd.config import _SCALARS, ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]
TOML = ROOT / "etc" / "amqpd.toml"


def test_every_setting_is_documented_in_etc_toml() -> None:
    text = TOML.read_text()
    missing = [k for k in _SCALARS if not re.search(rf"^#?\s*{k}\s*=", text, re.M)]
    assert not missing, f"settings not documented in etc/amqpd.toml: {missing}"


def test_etc_toml_loads_with_defaults() -> None:
    s = load_settings(TOML, environ={})
    assert s.port == 5672
    assert s.node_name.startswith("amqpd@")
    assert s.fsync == "batch"


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "a.toml"
    cfg.write_text("port = 1111\nheartbeat = 5\n")
    s = load_settings(cfg, {"port": 3333}, environ={"AMQPD_PORT": "2222",
                                                     "AMQPD_HEARTBEAT": "7"})
    assert s.port == 3333
    assert s.heartbeat == 7


def test_bad_values_are_named(tmp_path: Path) -> None:
    cfg = tmp_path / "b.toml"
    cfg.write_text("port = 'abc'\n")
    with pytest.raises(ConfigError, match="port"):
        load_settings(cfg, environ={})
    cfg.write_text("no_such_setting = 1\n")
    with pytest.raises(ConfigError, match="no_such_setting"):
        load_settings(cfg, environ={})
    with pytest.raises(ConfigError, match="fsync"):
        load_settings(None, environ={"AMQPD_FSYNC": "sometimes"})


def test_users_and_permissions_from_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('vhosts = ["/", "app"]\n[[users]]\nname = "u"\npassword = "p"\n'
                   'tags = ["management"]\n[[permissions]]\nuser = "u"\nvhost = "app"\n')
    s = load_settings(cfg, environ={})
    assert s.vhosts == ["/", "app"]
    assert s.users[0].name == "u" and s.users[0].tags == ["management"]
    assert s.permissions[0].vhost == "app"


def test_auth_mechanisms_and_certificate_login() -> None:
    from amqpd.config import ConfigError, load_settings
    from amqpd.tls import login_from_certificate

    s = load_settings(environ={"AMQPD_AUTH_MECHANISMS": "EXTERNAL,PLAIN",
                               "AMQPD_SSL_CERT_LOGIN_FROM": "common_name"})
    assert s.auth_mechanisms == ["EXTERNAL", "PLAIN"]
    with pytest.raises(ConfigError):
        load_settings(environ={"AMQPD_AUTH_MECHANISMS": "KERBEROS"})
    cert = {"subject": ((("countryName", "FR"),), (("organizationName", "A, B"),),
                        (("commonName", "guest"),))}
    assert login_from_certificate(cert, "common_name") == "guest"
    assert login_from_certificate(cert, "distinguished_name") == "CN=guest,O=A\\, B,C=FR"
    assert login_from_certificate(None, "common_name") == ""
