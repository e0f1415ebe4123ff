"""Settings: embedded defaults < etc/amqpd.toml < AMQPD_* environment < command-line flags.

Every scalar setting has an environment variable named ``AMQPD_`` + its upper-cased name
(``port`` -> ``AMQPD_PORT``, ``data_dir`` -> ``AMQPD_DATA_DIR``). Lists of users, vhosts
and permissions come from the config file only.

The ``[replication]`` section (the warren, docs/warren.md) is the one section that is not
flattened: its keys reuse names of node-wide settings (``node_name``, ``tls_cert``), so it
is parsed into its own typed :class:`ReplicationConfig`, and its environment variables are
``AMQPD_REPLICATION_`` + the upper-cased key (``AMQPD_REPLICATION_LISTEN``). Without the
section, any such variable or ``--replication-*`` flag, ``Settings.replication`` is None
and the node is a single broker exactly as before.
"""

from __future__ import annotations

import os
import socket
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """A setting has a wrong type or value; the message names it."""


@dataclass
class UserConfig:
    name: str
    password: str | None = None
    password_hash: str | None = None
    hashing_algorithm: str = "rabbit_password_hashing_sha256"
    tags: list[str] = field(default_factory=list)


@dataclass
class PermissionConfig:
    user: str
    vhost: str = "/"
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


@dataclass
class ReplicationConfig:
    """The warren: this node's part in an active/standby pair (amqpd/replication/).

    Addresses are ``host:port`` strings. ``listen`` empty means this node serves no
    replication listener (a pure standby). ``secret`` (or the first line of
    ``secret_file``) authenticates standbys by HMAC challenge-response; with ``tls_cert``
    and ``tls_key`` the listener speaks TLS, and with ``tls_ca`` it requires client
    certificates signed by that CA (standbys present the same cert/key).
    """

    node_name: str = ""  # "" = the node's node_name
    listen: str = ""  # host:port of this node's replication listener; "" = none
    # host:port the other nodes reach that listener at (etcd tells them); "" = listen
    advertise: str = ""
    peers: list[str] = field(default_factory=list)  # the other nodes' replication host:port
    secret: str = ""
    secret_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    role: str = "auto"  # auto (etcd decides) | active | standby (static, no failover)
    etcd: list[str] = field(default_factory=list)  # etcd endpoint URLs
    etcd_prefix: str = "/amqpd/warren"
    lease_ttl: float = 3.0  # seconds
    mode: str = "sync"  # sync | async
    min_insync_standbys: int = 1
    max_lag: float = 5.0  # seconds a standby may lag before it leaves the in-sync set
    insync_timeout: float = 10.0  # seconds a confirm waits for in-sync standbys, then nack

    def shared_secret(self) -> bytes:
        """The secret as bytes: ``secret``, else the first line of ``secret_file``."""
        if self.secret:
            return self.secret.encode()
        if self.secret_file:
            try:
                text = Path(self.secret_file).read_text()
            except OSError as exc:
                raise ConfigError(f"replication secret_file: {exc}") from exc
            line = text.strip().splitlines()[0] if text.strip() else ""
            return line.encode()
        return b""


REPLICATION_KEYS = {f.name: f for f in fields(ReplicationConfig)}


def _replication_default(name: str) -> Any:
    return getattr(ReplicationConfig(), name)


def check_replication(rc: ReplicationConfig) -> None:
    """Refuse settings that cannot run, naming the key (called by load_settings)."""
    if rc.role not in ("auto", "active", "standby"):
        raise ConfigError(f"setting 'replication.role' must be 'auto', 'active' or 'standby', "
                          f"not {rc.role!r}")
    if rc.mode not in ("sync", "async"):
        raise ConfigError(f"setting 'replication.mode' must be 'sync' or 'async', not {rc.mode!r}")
    for name in ("listen", *rc.peers):
        addr = rc.listen if name == "listen" else name
        if addr:
            _split_addr(addr, "replication.listen" if name == "listen" else "replication.peers")
    if rc.advertise:
        _split_addr(rc.advertise, "replication.advertise")
    if rc.role == "auto" and not rc.etcd:
        raise ConfigError("setting 'replication.role' is 'auto' (leader election through etcd) "
                          "but 'replication.etcd' names no endpoint; set role = 'active' or "
                          "'standby' for a static pair")
    if rc.role == "standby" and not rc.peers:
        raise ConfigError("setting 'replication.role' is 'standby' but 'replication.peers' "
                          "names no active to follow")
    if bool(rc.tls_cert) != bool(rc.tls_key):
        raise ConfigError("settings 'replication.tls_cert' and 'replication.tls_key' go together")
    if not rc.shared_secret() and not (rc.tls_cert and rc.tls_ca):
        raise ConfigError("the replication listener is never open without authentication: set "
                          "'replication.secret' (or secret_file), or tls_cert + tls_key + tls_ca")
    for key in ("lease_ttl", "max_lag", "insync_timeout"):
        if getattr(rc, key) <= 0:
            raise ConfigError(f"setting 'replication.{key}' must be > 0")
    if rc.min_insync_standbys < 0:
        raise ConfigError("setting 'replication.min_insync_standbys' must be >= 0")


def _split_addr(addr: str, key: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"setting {key!r}: {addr!r} is not host:port")
    return host.strip("[]"), int(port)


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); ConfigError when malformed."""
    return _split_addr(addr, "address")


@dataclass
class Settings:
    # listeners
    bind: str = ""  # "" = every interface, IPv4 ([0.0.0.0]) and IPv6 ([::]), as RabbitMQ
    port: int = 5672
    # node
    node_name: str = field(default_factory=lambda: f"amqpd@{socket.gethostname()}")
    cluster_name: str = ""
    data_dir: str = "./amqpd-data"
    log_level: str = "info"
    log_format: str = "console"
    # protocol limits, RabbitMQ 3.10 defaults
    heartbeat: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    max_message_size: int = 134217728
    handshake_timeout: float = 10.0
    # default user / vhost created on first boot
    default_vhost: str = "/"
    default_user: str = "guest"
    default_pass: str = "guest"
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    # storage
    persistence: bool = True
    fsync: str = "batch"
    segment_size: int = 64 * 1024 * 1024
    # message bodies kept in memory: beyond these, new messages of a queue live only in the
    # log (read back on delivery) and the queue holds a small index entry per message
    queue_memory_limit: int = 16 * 1024 * 1024  # bytes of ready bodies per queue
    message_memory_budget: int = 256 * 1024 * 1024  # bytes of ready bodies in all queues
    # resource alarms (RabbitMQ's defaults): publishers are blocked above these
    vm_memory_high_watermark: float = 0.4  # fraction of physical memory
    memory_high_watermark_bytes: int = 0  # absolute limit; overrides the fraction when > 0
    disk_free_limit: int = 50_000_000  # bytes free on the data directory's filesystem
    # management HTTP API (0 = ephemeral port), TLS listeners, boot definitions
    management: bool = True
    http_bind: str = ""  # "" = same address as ``bind``
    http_port: int = 15672
    http_tls: bool = False  # serve the HTTP API over TLS with tls_cert/tls_key
    tls_port: int = 5671  # amqps listener, started only when tls_cert and tls_key are set
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_verify_peer: bool = False
    tls_fail_if_no_peer_cert: bool = False
    # SASL mechanisms offered (RabbitMQ's auth_mechanisms); EXTERNAL (user name from the
    # client certificate, as rabbitmq_auth_mechanism_ssl) is offered only on TLS
    # connections that presented a verified certificate
    auth_mechanisms: list[str] = field(default_factory=lambda: ["PLAIN", "AMQPLAIN"])
    ssl_cert_login_from: str = "distinguished_name"  # or "common_name"
    definitions_file: str = ""  # RabbitMQ-format definitions JSON imported at boot
    stats_interval: float = 5.0  # seconds between message-rate samples (management API)
    # optional parts outside the core, by name (plugins/<name>/ or entry points)
    plugins: list[str] = field(default_factory=list)
    # static shovels: [[shovels]] tables with the dynamic shovel keys (plugins/shovel)
    shovels: list[dict[str, Any]] = field(default_factory=list)
    # declared in the file
    users: list[UserConfig] = field(default_factory=list)
    vhosts: list[str] = field(default_factory=list)
    permissions: list[PermissionConfig] = field(default_factory=list)
    # the warren ([replication]); None = a single node, exactly as without the feature
    replication: ReplicationConfig | None = None

    @property
    def effective_cluster_name(self) -> str:
        return self.cluster_name or self.node_name


_SCALARS = {f.name: f for f in fields(Settings) if f.name not in ("users", "vhosts",
                                                                   "permissions", "shovels",
                                                                   "replication")}


def _coerce(name: str, value: Any, default: Any) -> Any:
    target = type(default)
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if isinstance(default, list):
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            return list(value)
        return target(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name!r}: cannot use {value!r} ({exc})") from exc


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    settings = Settings()
    env = os.environ if environ is None else environ
    path = config_file or env.get("AMQPD_CONFIG")
    if path:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {p} not found") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p}: {exc}") from exc
        _apply_file(settings, data, str(p))
    for name, _f in _SCALARS.items():
        key = "AMQPD_" + name.upper()
        if key in env:
            setattr(settings, name, _coerce(name, env[key], getattr(settings, name)))
    for name in REPLICATION_KEYS:
        key = "AMQPD_REPLICATION_" + name.upper()
        if key in env:
            _set_replication(settings, name, env[key])
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name.startswith("replication_") and name[12:] in REPLICATION_KEYS:
            _set_replication(settings, name[12:], value)
        else:
            setattr(settings, name, _coerce(name, value, getattr(settings, name)))
    if not settings.node_name:
        settings.node_name = f"amqpd@{socket.gethostname()}"
    unknown = set(settings.auth_mechanisms) - {"PLAIN", "AMQPLAIN", "EXTERNAL"}
    if unknown:
        raise ConfigError(f"setting 'auth_mechanisms': unknown mechanism(s) {sorted(unknown)}")
    if settings.ssl_cert_login_from not in ("distinguished_name", "common_name"):
        raise ConfigError("setting 'ssl_cert_login_from' must be 'distinguished_name' or "
                          f"'common_name', not {settings.ssl_cert_login_from!r}")
    if settings.fsync not in ("batch", "never"):
        raise ConfigError(f"setting 'fsync' must be 'batch' or 'never', not {settings.fsync!r}")
    if settings.replication is not None:
        if not settings.replication.node_name:
            settings.replication.node_name = settings.node_name
        check_replication(settings.replication)
        if not settings.persistence:
            # the warren ships the shared log: the in-memory store has none to ship
            raise ConfigError("a [replication] section needs 'persistence = true': the "
                              "standby follows the active's log, and with persistence off "
                              "there is none (remove [replication] or turn persistence on)")
    return settings


def _set_replication(settings: Settings, name: str, value: Any) -> None:
    if settings.replication is None:
        settings.replication = ReplicationConfig()
    setattr(settings.replication, name,
            _coerce("replication." + name, value, _replication_default(name)))


def _apply_file(settings: Settings, data: dict[str, Any], path: str) -> None:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == "replication" and isinstance(value, dict):
            settings.replication = settings.replication or ReplicationConfig()
            for rkey, rvalue in value.items():
                if rkey not in REPLICATION_KEYS:
                    raise ConfigError(f"{path}: unknown setting 'replication.{rkey}'")
                _set_replication(settings, rkey, rvalue)
        elif isinstance(value, dict) and key not in ("users",):
            flat.update(value)  # [sections] are only for readability
        else:
            flat[key] = value
    for key, value in flat.items():
        if key == "users":
            settings.users = [UserConfig(**u) for u in value]
        elif key == "vhosts":
            settings.vhosts = [v if isinstance(v, str) else v["name"] for v in value]
        elif key == "permissions":
            settings.permissions = [PermissionConfig(**p) for p in value]
        elif key == "shovels":
            settings.shovels = [dict(t) for t in value]
        elif key in _SCALARS:
            setattr(settings, key, _coerce(key, value, getattr(settings, key)))
        else:
            raise ConfigError(f"{path}: unknown setting {key!r}")
