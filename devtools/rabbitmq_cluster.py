"""Start and stop a private multi-node RabbitMQ cluster on this host.

RabbitMQ nodes form a cluster over Erlang distribution: they must find each other
through one epmd and prove the same Erlang cookie. Each node here is a private node of
devtools/rabbitmq.py (its own directory, node name ``rabbit-<random>@localhost`` and
free loopback ports for AMQP, distribution and plugin listeners) except that all of
them share one cookie and one epmd, started here on a free port of its own
(``ERL_EPMD_PORT``), so a system epmd or a system RabbitMQ is never met::

    python -m devtools.rabbitmq_cluster start --dir /tmp/rmqc --nodes 2 \\
        [--plugins rabbitmq_management]
    python -m devtools.rabbitmq_cluster ctl --dir /tmp/rmqc --node 2 -- cluster_status
    python -m devtools.rabbitmq_cluster stop --dir /tmp/rmqc

Layout: ``DIR/cluster.json`` (the :class:`ClusterInfo`, printed by ``start`` too),
``DIR/epmd.out``, and ``DIR/node1``, ``DIR/node2``, ... (each a node directory as
devtools/rabbitmq.py makes it, with its own ``rabbitmq.json``).

The nodes start side by side; then every node but the first is joined to the first
with ``rabbitmqctl stop_app``, ``join_cluster <first>``, ``start_app``, and ``start``
returns once ``cluster_status`` on the first node lists every node as running and
each accepts AMQP connections. Every wait polls with a deadline. ``stop`` stops the
nodes and the epmd by the PIDs recorded at start (and checks that the epmd PID is
still the epmd started here before signalling it).

From Python::

    with running_rabbitmq_cluster(tmp_path, nodes=2) as cluster:
        a, b = cluster.nodes            # RabbitInfo: amqp_url, nodename, pid, dir...
        kill_node(a)                    # kill -9 of a's Erlang VM
        a = restart_node(cluster, 0)    # same name and data, fresh ports

If RabbitMQ is not installed, :class:`devtools.rabbitmq.RabbitMQNotInstalled` is
raised so that callers can skip.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from devtools.rabbitmq import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    RabbitInfo,
    RabbitMQError,
    RabbitMQNotInstalled,
    _amqp_ready,
    _beam_pid,
    _is_our_epmd,
    _pid_alive,
    _port_open,
    _wait_dead,
    ctl,
    find_epmd,
    find_server,
    free_ports,
    start,
    stop,
)

CLUSTER_FILE = "cluster.json"
# rabbitmqctl boots an Erlang VM of its own for every command: 2-3 s on a quiet
# machine, 25-35 s measured under a load average of 15 on two cores
CTL_TIMEOUT = 120.0
JOIN_TIMEOUT = 300.0


@dataclasses.dataclass
class ClusterInfo:
    """A running private cluster: its epmd, its cookie and its nodes (first = seed)."""

    dir: str
    epmd_port: int
    epmd_pid: int
    cookie: str
    plugins: list[str]
    nodes: list[RabbitInfo]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def save(self) -> None:
        (Path(self.dir) / CLUSTER_FILE).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ClusterInfo:
        path = Path(directory) / CLUSTER_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise RabbitMQError(f"{path} not found: no cluster was started there") from None
        data["nodes"] = [RabbitInfo(**n) for n in data["nodes"]]
        return cls(**data)


def _start_epmd(d: Path) -> tuple[int, int]:
    """One epmd for the whole cluster, in the foreground so its PID is ours."""
    epmd = find_epmd()
    deadline = time.monotonic() + 30
    last = ""
    for _ in range(5):  # a port taken between free_ports() and epmd's bind: try another
        port = free_ports(1)[0]
        with open(d / "epmd.out", "ab") as log:
            proc = subprocess.Popen(
                [epmd, "-port", str(port), "-address", "127.0.0.1"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        while time.monotonic() < deadline and proc.poll() is None:
            if _port_open(port):
                return port, proc.pid
            time.sleep(0.05)
        last = f"epmd on port {port} exited with {proc.poll()}"
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
            last = f"epmd on port {port} did not listen within 30 s"
    raise RabbitMQError(f"could not start a private epmd: {last}; see {d / 'epmd.out'}")


def _stop_epmd(cluster: ClusterInfo) -> None:
    pid = cluster.epmd_pid
    if not _is_our_epmd(pid, cluster.epmd_port):
        return  # gone already, or the PID now belongs to something else: leave it
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_dead(pid, time.monotonic() + 10):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_dead(pid, time.monotonic() + 5)
    # epmd is our child when started in this process: reap it
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def running_nodes(node: RabbitInfo) -> list[str]:
    """The running nodes *node*'s cluster_status reports ([] if it cannot answer)."""
    try:
        out = ctl(node, "cluster_status", "--formatter", "json", timeout=CTL_TIMEOUT)
    except (RabbitMQError, subprocess.TimeoutExpired):
        return []
    try:
        data = json.loads(out)
    except ValueError:
        return []
    return list(data.get("running_nodes", []))


def wait_running(node: RabbitInfo, names: Sequence[str],
                 timeout: float = JOIN_TIMEOUT) -> None:
    """Poll *node*'s cluster_status until every one of *names* is running."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        seen = running_nodes(node)
        if set(names) <= set(seen):
            return
        time.sleep(0.5)
    raise RabbitMQError(f"{node.nodename} does not see {sorted(set(names) - set(seen))} "
                        f"running within {timeout:.0f} s (it sees {seen})")


def _wait_amqp(node: RabbitInfo, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _amqp_ready(node.amqp_port):
        if time.monotonic() > deadline:
            raise RabbitMQError(f"{node.nodename} does not accept AMQP on port "
                                f"{node.amqp_port} within {timeout:.0f} s")
        time.sleep(0.2)


def join(node: RabbitInfo, seed: RabbitInfo, timeout: float = JOIN_TIMEOUT) -> None:
    """Make the fresh *node* a member of *seed*'s cluster (RabbitMQ's own procedure)."""
    deadline = time.monotonic() + timeout
    for args in (("stop_app",), ("join_cluster", seed.nodename), ("start_app",)):
        ctl(node, *args, timeout=max(CTL_TIMEOUT, deadline - time.monotonic()))
    _wait_amqp(node, max(30.0, deadline - time.monotonic()))


def start_cluster(directory: str | os.PathLike[str], nodes: int = 2,
                  plugins: Sequence[str] = (), timeout: float = START_TIMEOUT) -> ClusterInfo:
    """Start *nodes* private nodes on one epmd and cookie and join them into a cluster."""
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    find_server()
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    if (d / CLUSTER_FILE).exists():
        old = ClusterInfo.load(d)
        alive = [n.nodename for n in old.nodes if _pid_alive(n.pid)]
        if alive:
            raise RabbitMQError(f"a cluster started in {d} is still running ({alive}); "
                                "stop it first")
    cookie = secrets.token_hex(16)
    epmd_port, epmd_pid = _start_epmd(d)
    cluster = ClusterInfo(dir=str(d), epmd_port=epmd_port, epmd_pid=epmd_pid,
                          cookie=cookie, plugins=list(plugins), nodes=[])
    cluster.save()
    started: list[RabbitInfo | None] = [None] * nodes
    try:
        def one(i: int) -> None:
            started[i] = start(d / f"node{i + 1}", plugins=plugins, timeout=timeout,
                               cookie=cookie, epmd_port=epmd_port)

        with ThreadPoolExecutor(max_workers=nodes) as pool:
            for fut in [pool.submit(one, i) for i in range(nodes)]:
                fut.result()
        cluster.nodes = [n for n in started if n is not None]
        cluster.save()
        seed = cluster.nodes[0]
        for node in cluster.nodes[1:]:
            join(node, seed)
        wait_running(seed, [n.nodename for n in cluster.nodes])
    except BaseException:
        for i in range(nodes):
            if (d / f"node{i + 1}" / "rabbitmq.json").exists():
                with contextlib.suppress(Exception):
                    stop(d / f"node{i + 1}")
        _stop_epmd(cluster)
        raise
    return cluster


def queue_leaders(node: RabbitInfo, vhost: str = "/") -> dict[str, str]:
    """Queue name -> the node its (classic) queue process runs on, i.e. its leader,
    from rabbitmqctl's table on *node* (a pid prints as ``<node.n.n.n>`` there)."""
    out = ctl(node, "list_queues", "-p", vhost, "--no-table-headers", "name", "pid",
              timeout=CTL_TIMEOUT)
    leaders = {}
    for line in out.splitlines():
        name, _, pid = line.partition("\t")
        leaders[name] = pid.strip().lstrip("<").rsplit(".", 3)[0]
    return leaders


def kill_node(node: RabbitInfo) -> None:
    """kill -9 of the node's Erlang VM (a hard node loss); returns once it is dead."""
    beam = _beam_pid(Path(node.dir))
    if beam is None or not _pid_alive(beam):
        raise RabbitMQError(f"{node.nodename}: no running VM (pid file {node.dir}/rabbitmq.pid)")
    os.kill(beam, signal.SIGKILL)
    if not _wait_dead(beam, time.monotonic() + 30):
        raise RabbitMQError(f"{node.nodename}: VM {beam} still alive 30 s after SIGKILL")
    # the wrapper script waits for the VM and exits with it
    _wait_dead(node.pid, time.monotonic() + 30)


def restart_node(cluster: ClusterInfo, index: int,
                 timeout: float = START_TIMEOUT) -> RabbitInfo:
    """Start a stopped or killed node again: same name, cookie, epmd and data (so it
    rejoins its cluster by itself), fresh ports."""
    old = cluster.nodes[index]
    if _pid_alive(old.pid):
        raise RabbitMQError(f"{old.nodename} is still running (pid {old.pid})")
    node = start(old.dir, plugins=cluster.plugins, timeout=timeout,
                 nodename=old.nodename, cookie=cluster.cookie,
                 epmd_port=cluster.epmd_port)
    cluster.nodes[index] = node
    cluster.save()
    return node


def stop_cluster(directory: str | os.PathLike[str], timeout: float = STOP_TIMEOUT) -> None:
    """Stop every node started in *directory* (last first), then the cluster's epmd."""
    cluster = ClusterInfo.load(directory)
    for node in reversed(cluster.nodes):
        if (Path(node.dir) / "rabbitmq.json").exists():
            with contextlib.suppress(RabbitMQError):
                stop(node.dir, timeout=timeout)
    _stop_epmd(cluster)


@contextlib.contextmanager
def running_rabbitmq_cluster(tmpdir: str | os.PathLike[str], nodes: int = 2,
                             plugins: Sequence[str] = (),
                             timeout: float = START_TIMEOUT) -> Iterator[ClusterInfo]:
    """Run a private cluster for the duration of the with-block."""
    cluster = start_cluster(tmpdir, nodes=nodes, plugins=plugins, timeout=timeout)
    try:
        yield cluster
    finally:
        stop_cluster(tmpdir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.rabbitmq_cluster",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_start = sub.add_parser("start", help="start a private cluster in the background")
    p_start.add_argument("--dir", required=True)
    p_start.add_argument("--nodes", type=int, default=2)
    p_start.add_argument("--plugins", default="", help="comma-separated plugin names")
    p_start.add_argument("--timeout", type=float, default=START_TIMEOUT)
    p_stop = sub.add_parser("stop", help="stop the cluster started in --dir")
    p_stop.add_argument("--dir", required=True)
    p_stop.add_argument("--timeout", type=float, default=STOP_TIMEOUT)
    p_ctl = sub.add_parser("ctl", help="run rabbitmqctl against one node of the cluster")
    p_ctl.add_argument("--dir", required=True)
    p_ctl.add_argument("--node", type=int, default=1, help="1-based node number")
    p_ctl.add_argument("args", nargs=argparse.REMAINDER, help="rabbitmqctl arguments")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "start":
            plugins = [p for p in args.plugins.split(",") if p]
            cluster = start_cluster(args.dir, nodes=args.nodes, plugins=plugins,
                                    timeout=args.timeout)
            print(cluster.to_json(), flush=True)
        elif args.cmd == "stop":
            stop_cluster(args.dir, timeout=args.timeout)
        else:
            ctl_args = args.args[1:] if args.args[:1] == ["--"] else args.args
            node = ClusterInfo.load(args.dir).nodes[args.node - 1]
            print(ctl(node, *ctl_args, timeout=CTL_TIMEOUT), end="")
    except RabbitMQNotInstalled as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except RabbitMQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
