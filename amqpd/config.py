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

The ``[cluster]`` section (issue 15, docs/clustering.md) is typed the same way
(:class:`ClusterConfig`, ``AMQPD_CLUSTER_<KEY>``, ``--cluster-<key>``; its ``name`` is
``AMQPD_CLUSTER``, since ``AMQPD_CLUSTER_NAME`` is the node-wide ``cluster_name``) and
always present: its ``name`` empty (the default) means no cluster, nothing of it starts.
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


MAX_PORT = 65535
# the settings that are TCP ports; 0 asks the kernel for an ephemeral one (tests do)
PORT_SETTINGS = ("port", "http_port", "tls_port")
LOG_LEVELS = ("debug", "info", "warning", "error")


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
    # 0: confirms wait for every in-sync standby, and one that is gone or lags past
    # max_lag leaves the set (recorded in etcd first) so the active confirms alone;
    # >= 1: no confirm without that many in-sync standbys (nacked after insync_timeout)
    min_insync_standbys: int = 0
    max_lag: float = 5.0  # seconds a standby may lag before it leaves the in-sync set
    insync_timeout: float = 10.0  # seconds a confirm waits for in-sync standbys, then nack
    # when this node, as a standby, acknowledges records: "fsync" once they are durable
    # here; "write" once they are written (page cache), fsync'd right after
    # (docs/warren.md "What a confirm means")
    standby_ack: str = "fsync"

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

PARTITION_HANDLING = ("pause_minority", "ignore")
LEADER_LOCATORS = ("client-local", "min-masters", "random")


@dataclass
class ClusterConfig:
    """This node's membership of a named cluster (amqpd/cluster/, docs/clustering.md).

    ``name`` empty: a single node, nothing of the cluster starts. The node's name is the
    node-wide ``node_name``. Membership, definitions and partition decisions go through
    etcd (``etcd``, keys under ``etcd_prefix``/``name``); node-to-node UDP heartbeats
    (``heartbeat_listen``) notice a dead node within about ``heartbeat_timeout`` seconds,
    the etcd lease (``lease_ttl``) is the slow backstop. ``cookie`` (or the first line of
    ``cookie_file``; by default a file in the data directory created on first start)
    authenticates inter-node links and heartbeats, as Erlang's cookie does.
    """

    name: str = ""  # "" = no cluster
    etcd: list[str] = field(default_factory=list)  # etcd endpoint URLs
    etcd_prefix: str = "/amqpd/cluster"
    link_listen: str = "127.0.0.1:0"  # inter-node link listener host:port (0 = ephemeral)
    link_advertise: str = ""  # "" = what link_listen bound
    heartbeat_listen: str = "127.0.0.1:0"  # UDP host:port of the heartbeat socket
    heartbeat_advertise: str = ""  # where other nodes send heartbeats; "" = what it bound
    heartbeat_interval: float = 0.2  # seconds between heartbeats to each running node
    heartbeat_timeout: float = 1.0  # seconds of silence after which a node is not running
    # seconds a reply to a definition change (declare-ok, an HTTP change) waits for etcd
    # to hold it before the client is told it failed (etcd out of reach)
    definition_timeout: float = 10.0
    lease_ttl: float = 5.0  # seconds of the node's etcd lease (its presence key)
    # seconds the event loop may run nothing before the lease's thread stops renewing
    # (a hung node must not stay present; a slow one must): amqpd/cluster/membership.py
    loop_hang_timeout: float = 60.0
    cookie: str = ""
    cookie_file: str = ""  # "" = <data_dir>/cluster.cookie, created on first start
    partition_handling: str = "pause_minority"  # pause_minority | ignore
    queue_leader_locator: str = "client-local"  # client-local | min-masters | random
    # seconds a mirrored queue's synchronised mirror may hold a confirm before it leaves
    # the synchronised set (amqpd/cluster/mirror.py)
    mirror_sync_timeout: float = 5.0
    # seconds a reply to a definition change (declare-ok, bind-ok) also waits for every
    # linked node to apply it (amqpd/cluster/visibility.py); 0: it waits for etcd only.
    # The workers of one node set it (docs/workers.md): they must act as one process
    visible_wait: float = 0.0
    # the management API's lists of connections, channels and consumers (AMQP and the
    # stream protocol) are the whole cluster's, each other node's part asked over the
    # links (docs/clustering.md, "Lists of the whole cluster"). The workers of one node
    # set it false: the node's HTTP front merges their lists itself (docs/workers.md)
    wide_lists: bool = True
    # seconds another node gets to give its part of such a list; one that does not
    # answer in time (stopped, overloaded) is left out, with a log line
    list_timeout: float = 2.0
    # at most this many members for a new quorum queue, whatever its
    # x-quorum-initial-group-size (0: no limit). The workers of one node set 1
    # (docs/workers.md): members on one machine's workers share its disk and its fate, a
    # majority of two needs both, and every commit would cross to the other worker
    quorum_max_members: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.name)

    def shared_cookie(self, data_dir: str) -> bytes:
        """The cookie as bytes: ``cookie``, else the first line of ``cookie_file`` (by
        default ``<data_dir>/cluster.cookie``, written with a random value on first use,
        mode 0600; nodes of one cluster must then be given the same file)."""
        if self.cookie:
            return self.cookie.encode()
        path = Path(self.cookie_file or os.path.join(data_dir, "cluster.cookie"))
        if not path.exists() and not self.cookie_file:
            import secrets

            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32) + "\n")
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cluster cookie_file: {exc}") from exc
        if not text:
            raise ConfigError(f"cluster cookie_file {path} is empty")
        return text.splitlines()[0].encode()


CLUSTER_KEYS = {f.name: f for f in fields(ClusterConfig)}


def cluster_env_var(key: str) -> str:
    """``AMQPD_CLUSTER_<KEY>``, but ``AMQPD_CLUSTER`` for ``name``: AMQPD_CLUSTER_NAME
    has long been the node-wide ``cluster_name`` (the name advertised to clients and
    federation peers), and keeps that meaning."""
    return "AMQPD_CLUSTER" if key == "name" else "AMQPD_CLUSTER_" + key.upper()


def check_cluster(cc: ClusterConfig) -> None:
    """Refuse cluster settings that cannot run, naming the key (called by load_settings)."""
    if not cc.enabled:
        return
    if not cc.etcd:
        raise ConfigError("setting 'cluster.name' is set but 'cluster.etcd' names no "
                          "endpoint: membership and definitions go through etcd")
    if cc.partition_handling not in PARTITION_HANDLING:
        raise ConfigError("setting 'cluster.partition_handling' must be 'pause_minority' or "
                          f"'ignore', not {cc.partition_handling!r}")
    if cc.queue_leader_locator not in LEADER_LOCATORS:
        raise ConfigError("setting 'cluster.queue_leader_locator' must be one of "
                          f"{', '.join(LEADER_LOCATORS)}, not {cc.queue_leader_locator!r}")
    for key in ("link_listen", "heartbeat_listen", "link_advertise", "heartbeat_advertise"):
        value = getattr(cc, key)
        if value:
            _split_addr(value, "cluster." + key)
    for key in ("heartbeat_interval", "heartbeat_timeout", "lease_ttl", "mirror_sync_timeout",
                "definition_timeout", "loop_hang_timeout", "list_timeout"):
        if getattr(cc, key) <= 0:
            raise ConfigError(f"setting 'cluster.{key}' must be > 0")
    if cc.visible_wait < 0:
        raise ConfigError("setting 'cluster.visible_wait' must be >= 0")
    if cc.quorum_max_members < 0:
        raise ConfigError("setting 'cluster.quorum_max_members' must be >= 0 (0: no limit)")
    if cc.heartbeat_timeout <= cc.heartbeat_interval:
        raise ConfigError("setting 'cluster.heartbeat_timeout' must be longer than "
                          "'cluster.heartbeat_interval'")
    if cc.lease_ttl < 2:
        raise ConfigError("setting 'cluster.lease_ttl' must be >= 2 seconds (etcd's minimum)")
    if "/" in cc.name:
        raise ConfigError("setting 'cluster.name' may not contain '/' (it is an etcd key part)")


def _replication_default(name: str) -> Any:
    return getattr(ReplicationConfig(), name)


def check_replication(rc: ReplicationConfig) -> None:
    """Refuse settings that cannot run, naming the key (called by load_settings)."""
    if rc.role not in ("auto", "active", "standby"):
        raise ConfigError(f"setting 'replication.role' must be 'auto', 'active' or 'standby', "
                          f"not {rc.role!r}")
    if rc.mode not in ("sync", "async"):
        raise ConfigError(f"setting 'replication.mode' must be 'sync' or 'async', not {rc.mode!r}")
    if rc.standby_ack not in ("fsync", "write"):
        raise ConfigError(f"setting 'replication.standby_ack' must be 'fsync' or 'write', "
                          f"not {rc.standby_ack!r}")
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
    if int(port) > MAX_PORT:
        raise ConfigError(f"setting {key!r}: port {port} in {addr!r} is out of range "
                          f"(0 = ephemeral, or 1-{MAX_PORT})")
    return host.strip("[]"), int(port)


def host_port(host: str, port: int) -> str:
    """``host:port`` for logs and URLs, an IPv6 address in brackets (``[::]:5672``), so
    the port cannot be read as the address's last group (split_addr's inverse)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
    # copy a segment's live messages forward once they are at most this fraction of what
    # it held, so a few long-lived messages do not pin a whole segment (0 = never copy)
    compact_ratio: float = 0.1
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
    # the RabbitMQ Stream protocol listener (amqpd.streamproto), off by default as
    # RabbitMQ's rabbitmq_stream plugin; 0 = an ephemeral port
    stream: bool = False
    stream_port: int = 5552
    stream_advertised_host: str = ""  # what metadata tells clients; "" = bind or hostname
    stream_advertised_port: int = 0  # 0 = the port listened on
    stream_tls_port: int = 5551  # stream over TLS, started with stream when TLS is set up
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
    # the web UI's login sessions; "" = <data_dir>/http-sessions.json (the workers of a
    # node share one, docs/workers.md)
    http_sessions_file: str = ""
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
    # the cluster ([cluster]); its name empty = a single node, exactly as without it
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # processes behind the node's one AMQP port (docs/workers.md): 1 = one process, as
    # before; 0 = as many as cores this process may use
    workers: int = 1

    @property
    def effective_cluster_name(self) -> str:
        return self.cluster_name or self.node_name


_SCALARS = {f.name: f for f in fields(Settings) if f.name not in ("users", "vhosts",
                                                                   "permissions", "shovels",
                                                                   "replication", "cluster")}


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
    for name in CLUSTER_KEYS:
        key = cluster_env_var(name)
        if key in env:
            _set_cluster(settings, name, env[key])
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name.startswith("replication_") and name[12:] in REPLICATION_KEYS:
            _set_replication(settings, name[12:], value)
        elif name.startswith("cluster_") and name[8:] in CLUSTER_KEYS:
            _set_cluster(settings, name[8:], value)
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
    check_node_settings(settings)
    check_cluster(settings.cluster)
    check_workers(settings)
    if settings.cluster.enabled and settings.replication is not None:
        raise ConfigError("a node is either in a [cluster] or in a warren ([replication]), "
                          "not both")
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


def check_node_settings(settings: Settings) -> None:
    """Refuse a port outside 0-65535 (the socket layer would wrap it or raise
    OverflowError at bind time) and a log level logging does not have (it would fall
    back to info in silence), naming the setting, wherever it came from."""
    for name in PORT_SETTINGS:
        port = getattr(settings, name)
        if not 0 <= port <= MAX_PORT:
            raise ConfigError(f"setting {name!r}: port {port} is out of range "
                              f"(0 = ephemeral, or 1-{MAX_PORT})")
    if settings.log_level not in LOG_LEVELS:
        raise ConfigError(f"setting 'log_level' must be one of {', '.join(LOG_LEVELS)}, "
                          f"not {settings.log_level!r}")


MAX_WORKERS = 256


def worker_count(settings: Settings) -> int:
    """The number of worker processes ``workers`` asks for: 0 means the cores this
    process may use (its CPU affinity, not the machine's count: a container or
    ``taskset`` limits it)."""
    if settings.workers == 0:
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # no affinity call on this platform
            return max(1, os.cpu_count() or 1)
    return settings.workers


def check_workers(settings: Settings) -> None:
    """Refuse a ``workers`` value that cannot run, and (phase 1 of issue 35,
    docs/workers.md) the settings several workers cannot serve yet, naming them."""
    n = settings.workers
    if not 0 <= n <= MAX_WORKERS:
        raise ConfigError(f"setting 'workers' must be 0 (one per core) or 1-{MAX_WORKERS}, "
                          f"not {n}")
    if worker_count(settings) == 1:
        return
    refused = [("a [cluster]", settings.cluster.enabled),
               ("a warren ([replication])", settings.replication is not None),
               ("the stream protocol (stream)", settings.stream)]
    for what, present in refused:
        if present:
            raise ConfigError(f"setting 'workers' = {n}: {what} cannot run with more than "
                              "one worker yet (docs/workers.md, phase 1); use workers = 1")


def check_data_dir(path: str) -> None:
    """Make the data directory (and its parents) or say, naming it, why it cannot be
    one: a file in its place, a parent that is a file, no permission to write. The
    broker would otherwise stop on the bare OSError ("[Errno 17] File exists")."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"data directory {path!r} is not a directory (a file is there)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"data directory {path!r} cannot be created: "
                          f"{exc.strerror or exc}") from exc
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"data directory {path!r} is not writable by this user")


def _set_replication(settings: Settings, name: str, value: Any) -> None:
    if settings.replication is None:
        settings.replication = ReplicationConfig()
    setattr(settings.replication, name,
            _coerce("replication." + name, value, _replication_default(name)))


def _set_cluster(settings: Settings, name: str, value: Any) -> None:
    setattr(settings.cluster, name,
            _coerce("cluster." + name, value, getattr(ClusterConfig(), name)))


def _apply_file(settings: Settings, data: dict[str, Any], path: str) -> None:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == "replication" and isinstance(value, dict):
            settings.replication = settings.replication or ReplicationConfig()
            for rkey, rvalue in value.items():
                if rkey not in REPLICATION_KEYS:
                    raise ConfigError(f"{path}: unknown setting 'replication.{rkey}'")
                _set_replication(settings, rkey, rvalue)
        elif key == "cluster" and isinstance(value, dict):
            for ckey, cvalue in value.items():
                if ckey not in CLUSTER_KEYS:
                    raise ConfigError(f"{path}: unknown setting 'cluster.{ckey}'")
                _set_cluster(settings, ckey, cvalue)
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
