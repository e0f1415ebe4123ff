"""Network namespaces for tests: a bridge in the host's namespace and one namespace per
member, each joined to the bridge by a veth pair.

A member's processes run under ``ip netns exec`` (:attr:`Member.prefix`) and listen on
the member's address; the host reaches every member through the bridge, and members
reach each other and the host (the bridge's own address). :meth:`Lab.cut` takes the
host-side end of a member's veth down: every packet to or from the member vanishes —
its peers, etcd and clients alike — as when a machine's cable is pulled, and its
established TCP connections stay open but silent until :meth:`Lab.restore`. That is the
partition a TCP proxy cannot give: it also cuts connections the test does not route
through a proxy (the nodes' own links).

Needs root (or CAP_NET_ADMIN) and ``ip``; :func:`unavailable` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


_LOCK = "/tmp/amqpd-netns.lock"


def _free_net() -> str:
    """The first 10.x.y of 10.216-247.* that no address here is in."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], check=True,
                         capture_output=True, text=True, timeout=10).stdout
    used = {".".join(word.split("/")[0].split(".")[:3])
            for word in out.split() if word.count(".") == 3 and "/" in word}
    for x in range(216, 248):
        for y in range(256):
            if f"10.{x}.{y}" not in used:
                return f"10.{x}.{y}"
    raise OSError("no free 10.216-247.x.0/24 network for a test lab")


@dataclass
class Member:
    name: str
    netns: str
    host_if: str  # the host-side end of its veth pair (what a cut takes down)
    address: str

    @property
    def prefix(self) -> list[str]:
        """Prepended to a command line to run it inside the member's namespace."""
        return ["ip", "netns", "exec", self.netns]


_counter = threading.Lock()
_next = [0]


def _tag() -> str:
    """Short and unique per lab on this machine (interface names have 15 characters)."""
    with _counter:
        _next[0] += 1
        n = _next[0]
    return f"{os.getpid() % 10000:04d}{n % 10}"


@dataclass
class Lab:
    """A bridge with members; :meth:`close` removes everything it made."""

    tag: str = field(default_factory=_tag)
    members: dict[str, Member] = field(default_factory=dict)
    _made: list[tuple[str, ...]] = field(default_factory=list)  # undo commands, in order

    def __post_init__(self) -> None:
        self.bridge = f"abr{self.tag}"
        self.net = ""  # "10.x.y", chosen by open()
        self.host_address = ""

    def open(self) -> Lab:
        """Make the bridge on a /24 no interface of this machine uses (under a lock, so
        labs of concurrent test processes never share a network)."""
        with open(_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.net = _free_net()
            self.host_address = f"{self.net}.1"
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", "del", self.bridge))
            _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add(self, name: str) -> Member:
        i = len(self.members)
        netns, host_if, ns_if = f"ans{self.tag}{i}", f"avh{self.tag}{i}", f"avn{self.tag}{i}"
        address = f"{self.net}.{i + 2}"
        _ip("netns", "add", netns)
        self._made.append(("netns", "del", netns))
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        self._made.append(("link", "del", host_if))
        _ip("link", "set", ns_if, "netns", netns)
        _ip("link", "set", host_if, "master", self.bridge, "up")
        _ip("netns", "exec", netns, "ip", "addr", "add", f"{address}/24", "dev", ns_if)
        _ip("netns", "exec", netns, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", netns, "ip", "link", "set", "lo", "up")
        member = Member(name, netns, host_if, address)
        self.members[name] = member
        return member

    def cut(self, name: str) -> None:
        _ip("link", "set", self.members[name].host_if, "down")

    def restore(self, name: str) -> None:
        _ip("link", "set", self.members[name].host_if, "up")

    def close(self) -> None:
        for undo in reversed(self._made):
            with contextlib.suppress(Exception):
                _ip(*undo)
        self._made.clear()


@contextlib.contextmanager
def lab() -> Iterator[Lab]:
    made = Lab()
    try:
        yield made.open()
    finally:
        made.close()


def reachable(address: str, port: int, timeout: float = 5.0) -> bool:
    """Whether a TCP connect to ``address:port`` succeeds within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), 0.5):
            return True
        time.sleep(0.05)
    return False


def unavailable() -> str | None:
    """None when this machine can make a lab and carry TCP across it; else why not."""
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2) to make network namespaces"
    try:
        with lab() as probe:
            member = probe.add("probe")
            with socket.socket() as srv:
                srv.bind((probe.host_address, 0))
                srv.listen(1)
                port = srv.getsockname()[1]
                code = ("import socket,sys;"
                        "socket.create_connection((sys.argv[1],int(sys.argv[2])),3).close()")
                out = subprocess.run([*member.prefix, "python3", "-c", code,
                                      probe.host_address, str(port)],
                                     capture_output=True, text=True, timeout=20, check=False)
                if out.returncode != 0:
                    return ("a network namespace cannot reach the host across a bridge "
                            f"(firewall?): {out.stderr.strip()[-200:]}")
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        return f"cannot make network namespaces here (needs root): {exc} {text.strip()}"[:300]
    return None
