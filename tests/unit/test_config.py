"""etc/amqpd.toml documents every setting, and loads; env and flags override it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from amqpd.config import (
    _SCALARS,
    ConfigError,
    check_data_dir,
    host_port,
    load_settings,
    split_addr,
)

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


def test_no_replication_section_is_a_single_node() -> None:
    assert load_settings(TOML, environ={}).replication is None


def test_every_replication_key_is_documented_in_etc_toml() -> None:
    from amqpd.config import REPLICATION_KEYS

    text = TOML.read_text()
    section = text[text.index("# [replication]"):]
    missing = [k for k in REPLICATION_KEYS if not re.search(rf"^#\s*{k}\s*=", section, re.M)]
    assert not missing, f"replication keys not documented in etc/amqpd.toml: {missing}"


def test_replication_section_file_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "r.toml"
    cfg.write_text('node_name = "n1"\n[replication]\nlisten = "127.0.0.1:5680"\n'
                   'peers = ["127.0.0.1:5681"]\nsecret = "s"\nrole = "active"\n'
                   'lease_ttl = 2\n')
    s = load_settings(cfg, {"replication_mode": "async"},
                      environ={"AMQPD_REPLICATION_MAX_LAG": "1.5",
                               "AMQPD_REPLICATION_PEERS": "a:1, b:2"})
    rc = s.replication
    assert rc is not None
    assert rc.node_name == "n1" and rc.listen == "127.0.0.1:5680"
    assert rc.peers == ["a:1", "b:2"] and rc.role == "active"
    assert rc.lease_ttl == 2.0 and isinstance(rc.lease_ttl, float)
    assert rc.mode == "async" and rc.max_lag == 1.5
    assert rc.min_insync_standbys == 0 and rc.insync_timeout == 10.0
    assert rc.etcd_prefix == "/amqpd/warren"
    assert s.node_name == "n1"  # the section's keys do not leak into the node's settings


def test_replication_env_alone_enables_it() -> None:
    s = load_settings(None, environ={"AMQPD_REPLICATION_ROLE": "active",
                                     "AMQPD_REPLICATION_SECRET": "x"})
    assert s.replication is not None and s.replication.role == "active"
    assert s.replication.standby_ack == "fsync"  # the default


def test_standby_ack_from_the_environment_and_a_flag() -> None:
    env = {"AMQPD_REPLICATION_ROLE": "standby", "AMQPD_REPLICATION_SECRET": "x",
           "AMQPD_REPLICATION_PEERS": "a:1"}
    s = load_settings(None, environ={**env, "AMQPD_REPLICATION_STANDBY_ACK": "write"})
    assert s.replication is not None and s.replication.standby_ack == "write"
    s = load_settings(None, {"replication_standby_ack": "write"}, environ=env)
    assert s.replication is not None and s.replication.standby_ack == "write"


@pytest.mark.parametrize("env, fragment", [
    ({"AMQPD_REPLICATION_ROLE": "boss", "AMQPD_REPLICATION_SECRET": "x"}, "replication.role"),
    ({"AMQPD_REPLICATION_ROLE": "active", "AMQPD_REPLICATION_SECRET": "x",
      "AMQPD_REPLICATION_STANDBY_ACK": "memory"}, "replication.standby_ack"),
    ({"AMQPD_REPLICATION_ROLE": "active"}, "authentication"),
    ({"AMQPD_REPLICATION_ROLE": "auto", "AMQPD_REPLICATION_SECRET": "x"}, "etcd"),
    ({"AMQPD_REPLICATION_ROLE": "standby", "AMQPD_REPLICATION_SECRET": "x"}, "peers"),
    ({"AMQPD_REPLICATION_ROLE": "active", "AMQPD_REPLICATION_SECRET": "x",
      "AMQPD_REPLICATION_LISTEN": "nohost"}, "host:port"),
    ({"AMQPD_REPLICATION_ROLE": "active", "AMQPD_REPLICATION_SECRET": "x",
      "AMQPD_REPLICATION_MODE": "maybe"}, "replication.mode"),
    ({"AMQPD_REPLICATION_ROLE": "active", "AMQPD_REPLICATION_SECRET": "x",
      "AMQPD_REPLICATION_MAX_LAG": "x"}, "replication.max_lag"),
])
def test_replication_bad_values_are_named(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_settings(None, environ=env)


def test_replication_unknown_key_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "u.toml"
    cfg.write_text('[replication]\nsecret = "s"\nrole = "active"\nlisten_port = 1\n')
    with pytest.raises(ConfigError, match=re.escape("replication.listen_port")):
        load_settings(cfg, environ={})


def test_replication_needs_persistence(tmp_path: Path) -> None:
    """The warren ships the shared log; the in-memory store of persistence = false has
    none, so the pair is refused at start with a reason, not half started."""
    cfg = tmp_path / "p.toml"
    cfg.write_text('persistence = false\n[replication]\nsecret = "s"\nrole = "active"\n')
    with pytest.raises(ConfigError, match=re.escape("'persistence = true'")):
        load_settings(cfg, environ={})
    s = load_settings(cfg, environ={"AMQPD_PERSISTENCE": "true"})
    assert s.replication is not None and s.persistence


def test_replication_secret_file(tmp_path: Path) -> None:
    (tmp_path / "sec").write_text("topsecret\n")
    s = load_settings(None, environ={"AMQPD_REPLICATION_ROLE": "active",
                                     "AMQPD_REPLICATION_SECRET_FILE": str(tmp_path / "sec")})
    assert s.replication is not None and s.replication.shared_secret() == b"topsecret"


def test_replication_cli_flags() -> None:
    from amqpd.cli import build_parser

    args = build_parser().parse_args(["--replication-role", "standby",
                                      "--replication-peers", "h:1",
                                      "--replication-min-insync-standbys", "2",
                                      "--replication-max-lag", "0.5"])
    assert args.replication_role == "standby" and args.replication_peers == "h:1"
    assert args.replication_min_insync_standbys == 2 and args.replication_max_lag == 0.5


def test_no_cluster_name_is_a_single_node() -> None:
    s = load_settings(TOML, environ={})
    assert s.cluster.name == "" and not s.cluster.enabled


def test_every_cluster_key_is_documented_in_etc_toml() -> None:
    from amqpd.config import CLUSTER_KEYS

    text = TOML.read_text()
    section = text[text.index("# [cluster]"):]
    missing = [k for k in CLUSTER_KEYS if not re.search(rf"^#\s*{k}\s*=", section, re.M)]
    assert not missing, f"cluster keys not documented in etc/amqpd.toml: {missing}"


def test_cluster_section_file_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('node_name = "n1"\n[cluster]\nname = "prod"\n'
                   'etcd = ["http://127.0.0.1:2379"]\npartition_handling = "ignore"\n')
    s = load_settings(cfg, {"cluster_lease_ttl": 3.0},
                      environ={"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "1.5"})
    c = s.cluster
    assert (c.name, c.etcd, c.partition_handling) == ("prod", ["http://127.0.0.1:2379"],
                                                     "ignore")
    assert c.lease_ttl == 3.0 and c.heartbeat_timeout == 1.5
    assert c.definition_timeout == 10.0  # the default
    assert c.loop_hang_timeout == 60.0
    s = load_settings(cfg, environ={"AMQPD_CLUSTER_LOOP_HANG_TIMEOUT": "120"})
    assert s.cluster.loop_hang_timeout == 120.0
    s = load_settings(cfg, {"cluster_definition_timeout": 2.5},
                      environ={"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "3"})
    assert (s.cluster.definition_timeout, s.cluster.heartbeat_timeout) == (2.5, 3.0)
    s = load_settings(cfg, environ={"AMQPD_CLUSTER_DEFINITION_TIMEOUT": "30"})
    assert s.cluster.definition_timeout == 30.0
    assert s.cluster.quorum_max_members == 0  # the default: no limit
    s = load_settings(cfg, environ={"AMQPD_CLUSTER_QUORUM_MAX_MEMBERS": "1"})
    assert s.cluster.quorum_max_members == 1
    cfg.write_text(cfg.read_text() + "definition_timeout = 4.0\nheartbeat_timeout = 2.0\n")
    s = load_settings(cfg, environ={})
    assert (s.cluster.definition_timeout, s.cluster.heartbeat_timeout) == (4.0, 2.0)
    assert s.node_name == "n1" and s.cluster_name == ""  # the display name is apart


@pytest.mark.parametrize("env, words", [
    ({"AMQPD_CLUSTER": "x"}, "cluster.etcd"),
    ({"AMQPD_CLUSTER": "x", "AMQPD_CLUSTER_ETCD": "http://e:1",
      "AMQPD_CLUSTER_PARTITION_HANDLING": "autoheal"}, "partition_handling"),
    ({"AMQPD_CLUSTER": "x", "AMQPD_CLUSTER_ETCD": "http://e:1",
      "AMQPD_CLUSTER_QUEUE_LEADER_LOCATOR": "nearest"}, "queue_leader_locator"),
    ({"AMQPD_CLUSTER": "x", "AMQPD_CLUSTER_ETCD": "http://e:1",
      "AMQPD_CLUSTER_HEARTBEAT_LISTEN": "nowhere"}, "heartbeat_listen"),
    ({"AMQPD_CLUSTER": "x", "AMQPD_CLUSTER_ETCD": "http://e:1",
      "AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "0.1"}, "heartbeat_timeout"),
    ({"AMQPD_CLUSTER": "x", "AMQPD_CLUSTER_ETCD": "http://e:1",
      "AMQPD_CLUSTER_DEFINITION_TIMEOUT": "0"}, "definition_timeout"),
    ({"AMQPD_CLUSTER": "x", "AMQPD_CLUSTER_ETCD": "http://e:1",
      "AMQPD_CLUSTER_LOOP_HANG_TIMEOUT": "-1"}, "loop_hang_timeout"),
    ({"AMQPD_CLUSTER": "x", "AMQPD_CLUSTER_ETCD": "http://e:1",
      "AMQPD_CLUSTER_QUORUM_MAX_MEMBERS": "-1"}, "quorum_max_members"),
    ({"AMQPD_CLUSTER": "x", "AMQPD_CLUSTER_ETCD": "http://e:1",
      "AMQPD_REPLICATION_ROLE": "active", "AMQPD_REPLICATION_SECRET": "s",
      "AMQPD_REPLICATION_LISTEN": "127.0.0.1:1"}, "not both"),
])
def test_cluster_settings_refused(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_settings(None, environ=env)


def test_cluster_cookie_file_created_once(tmp_path: Path) -> None:
    from amqpd.config import ClusterConfig

    cc = ClusterConfig(name="x", etcd=["http://e:1"])
    first = cc.shared_cookie(str(tmp_path))
    assert first and (tmp_path / "cluster.cookie").stat().st_mode & 0o777 == 0o600
    assert cc.shared_cookie(str(tmp_path)) == first
    assert ClusterConfig(cookie="abc").shared_cookie(str(tmp_path)) == b"abc"


def test_amqpd_cluster_name_stays_the_advertised_name() -> None:
    """AMQPD_CLUSTER_NAME is the node-wide cluster_name (server properties, federation);
    the [cluster] section's name is AMQPD_CLUSTER."""
    s = load_settings(None, environ={"AMQPD_CLUSTER_NAME": "site-a"})
    assert s.cluster_name == "site-a" and not s.cluster.enabled
    s = load_settings(None, environ={"AMQPD_CLUSTER": "prod",
                                     "AMQPD_CLUSTER_ETCD": "http://e:1"})
    assert s.cluster.name == "prod" and s.cluster_name == ""


@pytest.mark.parametrize(("source", "fragment"), [
    ({"file": "port = 99999\n"}, "setting 'port': port 99999 is out of range"),
    ({"env": {"AMQPD_HTTP_PORT": "70000"}}, "setting 'http_port': port 70000 is out of range"),
    ({"flags": {"tls_port": -1}}, "setting 'tls_port': port -1 is out of range"),
    ({"file": "[replication]\nrole = 'active'\nlisten = '127.0.0.1:70000'\nsecret = 's'\n"},
     "port 70000 in '127.0.0.1:70000' is out of range"),
    ({"env": {"AMQPD_CLUSTER": "c", "AMQPD_CLUSTER_ETCD": "http://127.0.0.1:2379",
              "AMQPD_CLUSTER_LINK_LISTEN": "127.0.0.1:65536"}}, "port 65536"),
    ({"file": "log_level = 'verbose'\n"}, "setting 'log_level' must be one of debug, info"),
])
def test_ports_and_log_level_are_checked_wherever_they_come_from(
        tmp_path: Path, source: dict[str, Any], fragment: str) -> None:
    cfg = None
    if "file" in source:
        cfg = tmp_path / "c.toml"
        cfg.write_text(source["file"])
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, source.get("flags"), environ=source.get("env", {}))
    assert fragment in str(err.value)


def test_the_port_range_ends_are_accepted() -> None:
    s = load_settings(None, {"port": 0, "http_port": 65535, "tls_port": 1}, environ={})
    assert (s.port, s.http_port, s.tls_port) == (0, 65535, 1)


def test_host_port_brackets_ipv6() -> None:
    assert host_port("::", 5672) == "[::]:5672"
    assert host_port("::1", 15672) == "[::1]:15672"
    assert host_port("127.0.0.1", 5672) == "127.0.0.1:5672"
    assert split_addr(host_port("::1", 80)) == ("::1", 80)


def test_data_dir_problems_name_the_data_directory(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=r"data directory '.*file' is not a directory"):
        check_data_dir(str(a_file))
    with pytest.raises(ConfigError, match=r"data directory '.*file/sub' cannot be created: "
                                          r"Not a directory"):
        check_data_dir(str(a_file / "sub"))
    fresh = tmp_path / "a" / "b"
    check_data_dir(str(fresh))
    assert fresh.is_dir()
