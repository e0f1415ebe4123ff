"""Settings: embedded defaults < etc/amqpd.toml < AMQPD_* environment < command-line flags.

Every scalar setting has an environment variable named ``AMQPD_`` + its upper-cased name
(``port`` -> ``AMQPD_PORT``, ``data_dir`` -> ``AMQPD_DATA_DIR``). Lists of users, vhosts
and permissions come from the config file only.
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

    @property
    def effective_cluster_name(self) -> str:
        return self.cluster_name or self.node_name


_SCALARS = {f.name: f for f in fields(Settings) if f.name not in ("users", "vhosts",
                                                                   "permissions", "shovels")}


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
    for name, value in (overrides or {}).items():
        if value is not None:
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
    return settings


def _apply_file(settings: Settings, data: dict[str, Any], path: str) -> None:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in ("users",):
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
