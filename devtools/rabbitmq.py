"""Start and stop a private RabbitMQ node for tests, CI and benchmarks.

The node gets its own directory, its own free loopback ports and its own Erlang
cookie, so several can run side by side next to (and without touching) a system
RabbitMQ::

    python -m devtools.rabbitmq start --dir /tmp/rmq [--plugins rabbitmq_management]
    python -m devtools.rabbitmq stop --dir /tmp/rmq
    python -m devtools.rabbitmq ctl --dir /tmp/rmq -- list_queues name messages

``start`` prints one JSON line ``{"amqp_url", "http_url", "pid", "dir", ...}`` once the
node accepts AMQP connections, and writes the same object to ``DIR/rabbitmq.json``;
``stop`` reads that file and stops exactly that node (and the private epmd it started);
``ctl`` runs rabbitmqctl against that node (same cookie, node name and epmd port).

From Python::

    with running_rabbitmq(tmp_path, plugins=("rabbitmq_management",)) as info:
        pika.BlockingConnection(pika.URLParameters(info.amqp_url))

Environment variables given to the server (all derived from DIR and the free ports):

- ``HOME=DIR``: the Erlang cookie (``DIR/.erlang.cookie``) is private to this node.
- ``RABBITMQ_NODENAME=rabbit-<random>@localhost``: unique node name.
- ``RABBITMQ_NODE_IP_ADDRESS=127.0.0.1``, ``RABBITMQ_NODE_PORT``: the AMQP listener.
- ``RABBITMQ_DIST_PORT``: the Erlang distribution port (on 127.0.0.1, through
  ``RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}``).
- ``ERL_EPMD_PORT``: a private epmd, started here, in the foreground, so its PID is known.
- ``RABBITMQ_MNESIA_BASE=DIR/mnesia``, ``RABBITMQ_LOG_BASE=DIR/log``,
  ``RABBITMQ_PID_FILE=DIR/rabbitmq.pid``.
- ``RABBITMQ_CONFIG_FILE=DIR/rabbitmq.conf`` (listener and plugin ports),
  ``RABBITMQ_ADVANCED_CONFIG_FILE=DIR/advanced.config``,
  ``RABBITMQ_ENABLED_PLUGINS_FILE=DIR/enabled_plugins``,
  ``RABBITMQ_CONF_ENV_FILE=DIR/rabbitmq-env.conf`` (empty: /etc/rabbitmq is never read).

Variables read by this module:

- ``RABBITMQ_SERVER``: path of the ``rabbitmq-server`` script
  (default ``/usr/lib/rabbitmq/bin/rabbitmq-server``, then ``$PATH``).
- ``EPMD``: path of ``epmd`` (default: found on ``$PATH``).

A node that dies while starting because a port it was given was taken meanwhile is
started once more with fresh ports (``start(..., retries=1)``). Nodes of a cluster share
a cookie and an epmd (``start(..., cookie=..., epmd_port=...)``): see
devtools/rabbitmq_cluster.py.

The default ``guest`` user stays loopback-only, exactly as in a stock install; every
listener binds 127.0.0.1. If RabbitMQ is not installed, :class:`RabbitMQNotInstalled`
is raised so that callers can skip.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

DEFAULT_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 60.0
INFO_FILE = "rabbitmq.json"

# Plugins that open a listener of their own, and the rabbitmq.conf key of its port.
_PLUGIN_PORT_KEYS = {
    "rabbitmq_management": ("management.tcp.port", "management.tcp.ip"),
    "rabbitmq_prometheus": ("prometheus.tcp.port", "prometheus.tcp.ip"),
    "rabbitmq_stomp": ("stomp.listeners.tcp.1", None),
    "rabbitmq_mqtt": ("mqtt.listeners.tcp.1", None),
    "rabbitmq_web_stomp": ("web_stomp.tcp.port", "web_stomp.tcp.ip"),
    "rabbitmq_web_mqtt": ("web_mqtt.tcp.port", "web_mqtt.tcp.ip"),
    "rabbitmq_stream": ("stream.listeners.tcp.1", None),
}


class RabbitMQError(RuntimeError):
    """The node could not be started or stopped."""


class RabbitMQNotInstalled(RabbitMQError):
    """rabbitmq-server (or epmd) is not installed on this machine."""


@dataclasses.dataclass(frozen=True)
class RabbitInfo:
    """Where a running private node listens and how to stop it."""

    amqp_url: str
    http_url: str | None
    pid: int
    dir: str
    amqp_port: int
    dist_port: int
    epmd_port: int
    epmd_pid: int | None
    nodename: str
    plugin_ports: dict[str, int]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> RabbitInfo:
        path = Path(directory) / INFO_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise RabbitMQError(f"{path} not found: no node was started in that directory")
        return cls(**data)


def find_server() -> str:
    """Path of the rabbitmq-server script, or RabbitMQNotInstalled."""
    candidates = [
        os.environ.get("RABBITMQ_SERVER"), DEFAULT_SERVER, shutil.which("rabbitmq-server"),
    ]
    for cand in candidates:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise RabbitMQNotInstalled(
        "rabbitmq-server not found (looked at $RABBITMQ_SERVER, "
        f"{DEFAULT_SERVER} and $PATH); install Debian's rabbitmq-server package"
    )


def find_epmd() -> str:
    epmd = os.environ.get("EPMD") or shutil.which("epmd")
    if not epmd:
        for cand in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd")):
            epmd = str(cand)
    if not epmd:
        raise RabbitMQNotInstalled("epmd not found: is Erlang installed?")
    return epmd


# Where free_ports() looks: below the kernel's ephemeral range, so that no bind(0) and
# no outgoing connection on the machine is handed one of the node's ports while the node
# is stopped between `rabbitmqctl stop_app` and `start_app` (a conformance restart).
_STABLE_LOW = 10000
_PICK_ATTEMPTS = 500


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default when it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int, kind: socket.SocketKind = socket.SOCK_STREAM) -> list[int]:
    """n distinct loopback ports (TCP, or UDP with ``kind=SOCK_DGRAM``) that are free now
    and that the kernel does not hand out by itself (outside its ephemeral range, when
    it leaves room below it).

    A node keeps its ports across ``stop_app``/``start_app``; a port from the ephemeral
    range may meanwhile become another process's (a test's bind(0) or the local end of a
    connection), and the node's listener then fails to start (CI saw
    ``could_not_start_listener`` for the management port). Each candidate is checked with
    a bind without SO_REUSEADDR, which also refuses a port held in TIME_WAIT.
    """
    low, _high = _ephemeral_range()
    if low - _STABLE_LOW < 1000:
        return _kernel_ports(n, kind)
    first, end = _own_slice(_STABLE_LOW, low)
    rng = secrets.SystemRandom()
    chosen: list[int] = []
    for _ in range(_PICK_ATTEMPTS):
        if len(chosen) == n:
            break
        port = rng.randrange(first, end)
        if port in chosen:
            continue
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
    if len(chosen) < n:
        raise RabbitMQError(f"no {n} free ports found in {_STABLE_LOW}-{low - 1}")
    return chosen


def _own_slice(low: int, high: int) -> tuple[int, int]:
    """The part of ports [low, high) this process picks from: under pytest-xdist each
    worker gets a slice of its own, so two workers' tests never choose the same port.

    A port is free when chosen, but a node keeps it across a kill or a stop: while it
    is down, another worker's test could pick the same port and hold it, and the
    node's restart then fails with "address already in use" (CI saw that for a warren
    node's HTTP port after a kill -9). Outside xdist (one pytest process, a bench) the
    whole range is used; a worker's own subprocesses inherit its slice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(worker.removeprefix("gw"))
    except ValueError:
        return low, high
    width = (high - low) // count if count > 1 else 0
    if width < 500:  # too many workers for a useful slice each: share the range
        return low, high
    first = low + (index % count) * width
    return first, first + width


def _kernel_ports(n: int, kind: socket.SocketKind = socket.SOCK_STREAM) -> list[int]:
    """n distinct free ports chosen by the kernel (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, kind)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def _amqp_ready(port: int) -> bool:
    """True once the node answers a protocol header with connection.start."""
    try:
        with socket.create_connection(("127.0.0.1", port), 2.0) as s:
            s.settimeout(2.0)
            s.sendall(b"AMQP\x00\x00\x09\x01")
            data = s.recv(7)
            # frame type 1 (method) on channel 0: connection.start
            return len(data) >= 3 and data[0] == 1 and data[1:3] == b"\x00\x00"
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _wait_dead(pid: int, deadline: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return True
        elif not _pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def _write_files(d: Path, amqp_port: int, plugins: Sequence[str], ports: dict[str, int]) -> None:
    lines = [
        f"listeners.tcp.default = 127.0.0.1:{amqp_port}",
        "log.file.level = info",
        "log.console = false",
    ]
    for plugin, port in ports.items():
        port_key, ip_key = _PLUGIN_PORT_KEYS[plugin]
        if ip_key is None:
            lines.append(f"{port_key} = 127.0.0.1:{port}")
        else:
            lines.append(f"{port_key} = {port}")
            lines.append(f"{ip_key} = 127.0.0.1")
    (d / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
    (d / "advanced.config").write_text("[].\n")
    (d / "rabbitmq-env.conf").write_text("")
    (d / "enabled_plugins").write_text("[" + ",".join(plugins) + "].\n")


class _StartCrashed(RabbitMQError):
    """The node exited while starting for a reason a fresh set of ports may cure."""


# What RabbitMQ says when a port it was given was taken between free_ports() and its
# own bind (other work on the machine picks ephemeral ports too).
_PORT_RACE_MARKERS = (b"dist_port_already_used", b"eaddrinuse", b"port_already_used")


def start(directory: str | os.PathLike[str], plugins: Sequence[str] = (),
          timeout: float = START_TIMEOUT, *, nodename: str | None = None,
          cookie: str | None = None, epmd_port: int | None = None,
          retries: int = 1) -> RabbitInfo:
    """Start a node in the background; return once it accepts AMQP connections.

    *nodename* fixes the node name (a restart must keep it: Mnesia's directory is named
    after the node); *cookie* the Erlang cookie (nodes of one cluster share it);
    *epmd_port* makes the node register with an epmd the caller runs (a cluster's
    nodes must meet on one epmd) instead of starting its own.

    A node that dies during start because a port it was given was taken meanwhile
    (``dist_port_already_used``), or whose wrapper exits with status 0 before the node
    answered (the wrapper's exit status whenever the VM stops), is started again with
    fresh ports, up to *retries* times: free ports are only free when looked at.
    """
    attempt = 0
    while True:
        try:
            return _start_once(directory, plugins, timeout, nodename=nodename,
                               cookie=cookie, epmd_port=epmd_port)
        except _StartCrashed as exc:
            attempt += 1
            if attempt > retries:
                raise RabbitMQError(str(exc)) from None
            print(f"devtools.rabbitmq: {exc}; starting again with fresh ports",
                  file=sys.stderr, flush=True)


def _start_once(directory: str | os.PathLike[str], plugins: Sequence[str],
                timeout: float, *, nodename: str | None, cookie: str | None,
                epmd_port: int | None) -> RabbitInfo:
    server = find_server()
    epmd = find_epmd()
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    if (d / INFO_FILE).exists():
        old = RabbitInfo.load(d)
        if _pid_alive(old.pid):
            raise RabbitMQError(f"a node started in {d} is still running (pid {old.pid}); "
                                "stop it first")
    (d / "mnesia").mkdir(exist_ok=True)
    (d / "log").mkdir(exist_ok=True)
    plugins = [p.strip() for p in plugins if p.strip()]
    listen_plugins = [p for p in plugins if p in _PLUGIN_PORT_KEYS]
    ports = free_ports(3 + len(listen_plugins))
    amqp_port, dist_port = ports[:2]
    own_epmd = epmd_port is None
    if epmd_port is None:
        epmd_port = ports[2]
    plugin_ports = dict(zip(listen_plugins, ports[3:], strict=True))
    _write_files(d, amqp_port, plugins, plugin_ports)
    if nodename is None:
        nodename = f"rabbit-{secrets.token_hex(4)}@localhost"

    env = server_env(d, nodename, amqp_port, dist_port, epmd_port)
    cookie_file = d / ".erlang.cookie"
    if cookie is not None:
        if not cookie_file.exists() or cookie_file.read_text() != cookie:
            with contextlib.suppress(FileNotFoundError):
                cookie_file.unlink()
            cookie_file.write_text(cookie)
            cookie_file.chmod(0o400)
    elif not cookie_file.exists():
        cookie_file.write_text(secrets.token_hex(16))
        cookie_file.chmod(0o400)

    out_path = d / "server.out"
    out_offset = out_path.stat().st_size if out_path.exists() else 0
    log = open(out_path, "ab")  # noqa: SIM115 - handed to the child
    epmd_proc: subprocess.Popen[bytes] | None = None
    try:
        if own_epmd:
            epmd_proc = subprocess.Popen(
                [epmd, "-port", str(epmd_port), "-address", "127.0.0.1"],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )
        proc = subprocess.Popen(
            [server], env=env, cwd=str(d), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,
        )
    finally:
        log.close()
    http_url = None
    if "rabbitmq_management" in plugin_ports:
        http_url = f"http://127.0.0.1:{plugin_ports['rabbitmq_management']}"
    info = RabbitInfo(
        amqp_url=f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F",
        http_url=http_url, pid=proc.pid, dir=str(d), amqp_port=amqp_port,
        dist_port=dist_port, epmd_port=epmd_port,
        epmd_pid=epmd_proc.pid if epmd_proc is not None else None,
        nodename=nodename, plugin_ports=plugin_ports,
    )
    (d / INFO_FILE).write_text(info.to_json() + "\n")

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            # the wrapper is gone; make sure its VM is too before anything else
            beam = _beam_pid(d)
            if beam is not None and _pid_alive(beam):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(beam, signal.SIGKILL)
                _wait_dead(beam, time.monotonic() + 10)
            _stop_epmd(info, epmd_proc)
            msg = (f"rabbitmq-server exited with status {proc.returncode} during start; "
                   f"see {out_path} and {d / 'log'}")
            if proc.returncode == 0 or _port_race(out_path, out_offset):
                raise _StartCrashed(msg)
            raise RabbitMQError(msg)
        if _amqp_ready(amqp_port) and (http_url is None or _port_open(plugin_ports[
                "rabbitmq_management"])):
            return info
        if time.monotonic() > deadline:
            stop(d, proc=proc, epmd_proc=epmd_proc)
            raise RabbitMQError(f"rabbitmq-server did not accept AMQP within {timeout:.0f} s; "
                                f"see {d / 'log'}")
        time.sleep(0.2)


def _port_race(out_path: Path, offset: int) -> bool:
    """Whether what the server printed since *offset* says a port was taken."""
    try:
        with open(out_path, "rb") as f:
            f.seek(offset)
            text = f.read().lower()
    except OSError:
        return False
    return any(m in text for m in _PORT_RACE_MARKERS)


def server_env(d: Path, nodename: str, amqp_port: int, dist_port: int,
               epmd_port: int) -> dict[str, str]:
    """The environment rabbitmq-server runs with: everything under *d*, nothing from
    the caller's RABBITMQ_* / ERL_* variables, nothing from /etc/rabbitmq."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
    env.update(
        HOME=str(d),
        ERL_EPMD_PORT=str(epmd_port),
        RABBITMQ_NODENAME=nodename,
        RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
        RABBITMQ_NODE_PORT=str(amqp_port),
        RABBITMQ_DIST_PORT=str(dist_port),
        RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
        RABBITMQ_LOG_BASE=str(d / "log"),
        RABBITMQ_PID_FILE=str(d / "rabbitmq.pid"),
        RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
        RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
        RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
        # the distribution listener on loopback too
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
    )
    return env


def _stop_epmd(info: RabbitInfo, epmd_proc: subprocess.Popen[bytes] | None = None) -> None:
    pid = info.epmd_pid
    if pid is None:
        return
    if epmd_proc is None and not _is_our_epmd(pid, info.epmd_port):
        return  # the PID was reused by something else: leave it alone
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_dead(pid, time.monotonic() + 10, epmd_proc):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_dead(pid, time.monotonic() + 5, epmd_proc)


def _is_our_epmd(pid: int, port: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmd) and cmd[0].endswith(b"epmd") and str(port).encode() in cmd


def _beam_pid(d: Path) -> int | None:
    """The Erlang VM's PID from the node's pid file, if that process is still the VM
    of the node started in *d* (a PID left by a killed node may be reused by now)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((d / "rabbitmq.pid").read_text().strip())
        nodename = RabbitInfo.load(d).nodename
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RABBITMQ_NODENAME={nodename}".encode() in env:
            return pid
    return None


def stop(directory: str | os.PathLike[str], timeout: float = STOP_TIMEOUT, *,
         proc: subprocess.Popen[bytes] | None = None,
         epmd_proc: subprocess.Popen[bytes] | None = None) -> None:
    """Stop the node started in *directory* and wait for it (and its epmd) to exit."""
    d = Path(directory).resolve()
    info = RabbitInfo.load(d)
    beam = _beam_pid(d)
    deadline = time.monotonic() + timeout
    # The wrapper script traps TERM, stops the VM gracefully and waits for it.
    with contextlib.suppress(ProcessLookupError):
        os.kill(info.pid, signal.SIGTERM)
    if beam is not None and _pid_alive(beam):
        with contextlib.suppress(ProcessLookupError):
            os.kill(beam, signal.SIGTERM)
    clean = _wait_dead(info.pid, deadline, proc)
    if beam is not None:
        clean = _wait_dead(beam, deadline) and clean
    if not clean:
        for pid in (info.pid, beam):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _wait_dead(info.pid, time.monotonic() + 10, proc)
    _stop_epmd(info, epmd_proc)


def ctl_command(info: RabbitInfo, *args: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run rabbitmqctl against the node in *info*."""
    server = find_server()
    rabbitmqctl = str(Path(server).with_name("rabbitmqctl"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
    env.update(HOME=info.dir, ERL_EPMD_PORT=str(info.epmd_port),
               RABBITMQ_CONF_ENV_FILE=str(Path(info.dir) / "rabbitmq-env.conf"))
    return [rabbitmqctl, "-q", "-n", info.nodename, *args], env


def ctl(info: RabbitInfo, *args: str, timeout: float = 60) -> str:
    """Run rabbitmqctl against the node; return its stdout (RabbitMQError on failure)."""
    argv, env = ctl_command(info, *args)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise RabbitMQError(f"rabbitmqctl {' '.join(args)} failed ({proc.returncode}): "
                            f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@contextlib.contextmanager
def running_rabbitmq(tmpdir: str | os.PathLike[str], plugins: Sequence[str] = (),
                     timeout: float = START_TIMEOUT) -> Iterator[RabbitInfo]:
    """Run a private node for the duration of the with-block."""
    info = start(tmpdir, plugins=plugins, timeout=timeout)
    try:
        yield info
    finally:
        stop(tmpdir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.rabbitmq", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_start = sub.add_parser("start", help="start a private node in the background")
    p_start.add_argument("--dir", required=True)
    p_start.add_argument("--plugins", default="", help="comma-separated plugin names")
    p_start.add_argument("--timeout", type=float, default=START_TIMEOUT)
    p_stop = sub.add_parser("stop", help="stop the node started in --dir")
    p_stop.add_argument("--dir", required=True)
    p_stop.add_argument("--timeout", type=float, default=STOP_TIMEOUT)
    p_ctl = sub.add_parser("ctl", help="run rabbitmqctl against the node started in --dir")
    p_ctl.add_argument("--dir", required=True)
    p_ctl.add_argument("args", nargs=argparse.REMAINDER, help="rabbitmqctl arguments")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "ctl":
            ctl_args = args.args[1:] if args.args[:1] == ["--"] else args.args
            print(ctl(RabbitInfo.load(args.dir), *ctl_args), end="")
        elif args.cmd == "start":
            info = start(args.dir, plugins=args.plugins.split(","), timeout=args.timeout)
            print(info.to_json(), flush=True)
        else:
            stop(args.dir, timeout=args.timeout)
    except RabbitMQNotInstalled as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except RabbitMQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
