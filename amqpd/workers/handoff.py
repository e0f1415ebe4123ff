"""The supervisor-worker control channel: one unix ``SOCK_SEQPACKET`` pair per worker.

Messages keep their boundaries (a seqpacket socket), so each is one byte of kind and a
payload:

* supervisor -> worker: ``A`` (an accepted AMQP connection) or ``S`` (an accepted
  amqps connection, its TLS handshake not begun: the worker runs it), the socket itself
  attached with ``SCM_RIGHTS``; the supervisor closes its copy once sent, so from then
  on the connection is the worker's alone (the node's HTTP port is the supervisor's own:
  :mod:`amqpd.workers.http_front`);
* worker -> supervisor: ``R`` + JSON once the worker serves (its pid, member name and
  private ports).

Why hand over sockets instead of ``SO_REUSEPORT``: docs/workers.md ("Process model").
"""

from __future__ import annotations

import json
import socket
from typing import Any, Final

ACCEPTED_AMQP: Final = b"A"
ACCEPTED_AMQPS: Final = b"S"
READY: Final = b"R"
MAX_MESSAGE: Final = 65536
MAX_FDS: Final = 16


def pair() -> tuple[socket.socket, socket.socket]:
    """The supervisor's end and the worker's end (inheritable, for the child)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    ours.setblocking(False)
    return ours, theirs


def hand_over(control: socket.socket, kind: bytes, conn: socket.socket) -> None:
    """Pass ``conn`` to the worker behind ``control`` (raises OSError when its queue is
    full or it is gone: the caller tries another worker or drops the connection)."""
    socket.send_fds(control, [kind], [conn.fileno()])


def send_ready(control: socket.socket, info: dict[str, Any]) -> None:
    control.sendall(READY + json.dumps(info).encode())


def receive(control: socket.socket) -> list[tuple[bytes, bytes, list[socket.socket]]]:
    """Every message waiting on a non-blocking ``control`` socket as (kind, payload,
    sockets); an empty kind means the other end closed."""
    out: list[tuple[bytes, bytes, list[socket.socket]]] = []
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(control, MAX_MESSAGE, MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return out
        if not data and not fds:
            out.append((b"", b"", []))
            return out
        socks = [socket.socket(fileno=fd) for fd in fds]
        out.append((data[:1], data[1:], socks))
