"""``amqpd``: start a broker. Flags override AMQPD_* variables, which override the file."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

import amqpd
from amqpd import hotpath, sdnotify
from amqpd.config import (
    CLUSTER_KEYS,
    REPLICATION_KEYS,
    ClusterConfig,
    ConfigError,
    ReplicationConfig,
    check_data_dir,
    host_port,
    load_settings,
    worker_count,
)
from amqpd.server import Broker, serve


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="amqpd", description="AMQP 0-9-1 message broker")
    p.add_argument("--version", action="version",
                   version=f"amqpd {amqpd.__version__} (hot path: {hotpath.MODE})")
    p.add_argument("--config", help="TOML config file (default: $AMQPD_CONFIG)")
    p.add_argument("--bind", help="listen address (default: every interface, IPv4 and IPv6)")
    p.add_argument("--port", type=int, help="AMQP port (default 5672; 0 = ephemeral)")
    p.add_argument("--data-dir", help="data directory (default ./amqpd-data)")
    p.add_argument("--node-name", help="node name (default amqpd@<hostname>)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["console", "json"])
    p.add_argument("--http-port", type=int, help="HTTP API port (default 15672; 0 = ephemeral)")
    p.add_argument("--stream-port", type=int,
                   help="serve the RabbitMQ Stream protocol on this port (5552 as "
                        "RabbitMQ; 0 = ephemeral); off unless this, stream = true in the "
                        "config file or AMQPD_STREAM=1")
    p.add_argument("--tls-port", type=int, help="amqps port (default 5671; 0 = ephemeral; "
                                                "needs tls_cert and tls_key)")
    p.add_argument("--workers", type=int,
                   help="worker processes behind the one AMQP port (default 1; 0 = one "
                        "per core; docs/workers.md)")
    p.add_argument("--ready-file", help="write listener ports as JSON here once listening "
                                        "(for tests and supervisors)")
    rep = p.add_argument_group("replication (the warren; docs/warren.md)")
    for name, f in REPLICATION_KEYS.items():
        default = getattr(ReplicationConfig(), name)
        kind: type = float if isinstance(default, float) else (
            int if isinstance(default, int) else str)
        help_ = "comma-separated list" if isinstance(default, list) else None
        rep.add_argument("--replication-" + name.replace("_", "-"), type=kind, help=help_,
                         dest="replication_" + name, metavar=f.name.upper())
    clu = p.add_argument_group("cluster (docs/clustering.md)")
    for name, f in CLUSTER_KEYS.items():
        default = getattr(ClusterConfig(), name)
        kind = float if isinstance(default, float) else (
            int if isinstance(default, int) else str)
        help_ = "comma-separated list" if isinstance(default, list) else None
        clu.add_argument("--cluster-" + name.replace("_", "-"), type=kind, help=help_,
                         dest="cluster_" + name, metavar=f.name.upper())
    return p


def _replication_info(broker: Broker) -> dict[str, object] | None:
    roles = broker.roles
    if roles is None:
        return None
    source = roles.source
    return {"role": roles.role, "epoch": roles.epoch,
            "port": source.port if source is not None else None}


def overrides_from_args(args: argparse.Namespace) -> dict[str, object]:
    """The settings the command line gives (None: not given), for ``load_settings``;
    a worker (amqpd.workers.worker) reads the node's command line through it too."""
    return {
        "bind": args.bind, "port": args.port, "data_dir": args.data_dir,
        "node_name": args.node_name, "log_level": args.log_level,
        "log_format": args.log_format, "http_port": args.http_port,
        "tls_port": args.tls_port, "stream_port": args.stream_port,
        "stream": True if args.stream_port is not None else None,
        "workers": args.workers,
        **{"replication_" + k: getattr(args, "replication_" + k) for k in REPLICATION_KEYS},
        **{"cluster_" + k: getattr(args, "cluster_" + k) for k in CLUSTER_KEYS},
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config, overrides_from_args(args))
        check_data_dir(settings.data_dir)
    except ConfigError as exc:
        print(f"amqpd: {exc}", file=sys.stderr)
        return 2
    try:
        from amqpd import logs

        logs.configure(settings.log_level, settings.log_format)
    except ValueError as exc:
        print(f"amqpd: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop  # type: ignore[import-not-found]

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    if worker_count(settings) > 1:  # docs/workers.md; workers = 1 never gets here
        from amqpd.workers import supervisor

        return supervisor.run(settings, sys.argv[1:] if argv is None else argv,
                              args.ready_file)

    def ready(broker: Broker) -> None:
        if args.ready_file:
            tmp = args.ready_file + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({"amqp_port": broker.port, "pid": os.getpid(),
                           "listeners": broker.listeners,
                           "http_port": (broker.http.port or None) if broker.http else None,
                           "stream_port": next((p for proto, _, p in broker.listeners
                                                if proto == "stream"), None),
                           "stream_tls_port": next((p for proto, _, p in broker.listeners
                                                    if proto == "stream/ssl"), None),
                           "tls_port": next((p for proto, _, p in broker.listeners
                                             if proto == "amqps"), None),
                           # the warren: role and the replication listener's port
                           "replication": _replication_info(broker)}, fh)
            os.replace(tmp, args.ready_file)
        # systemd Type=notify (etc/amqpd.service): every listener is up now
        listening = ", ".join(f"{proto} {host_port(host, port)}"
                              for proto, host, port in broker.listeners)
        if broker.http is not None and broker.http.port:
            listening += f", http port {broker.http.port}"
        sdnotify.notify(f"READY=1\nSTATUS=listening on {listening}")

    try:
        asyncio.run(serve(settings, ready))
    except OSError as exc:
        logging.getLogger("amqpd").error("cannot start: %s", exc)
        return 1
    except ValueError as exc:  # TLS files or boot definitions file unusable
        logging.getLogger("amqpd").error("cannot start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
