"""Tell systemd (``Type=notify`` units, etc/amqpd.service) that the broker is ready.

systemd passes the path of a unix datagram socket in ``$NOTIFY_SOCKET``; a service
reports its state by sending it newline-separated ``KEY=value`` assignments in one
datagram (sd_notify(3)). amqpd sends ``READY=1`` once every listener accepts
connections, so ``systemctl start amqpd`` returns, and units ordered after amqpd start,
only when clients can connect. The protocol is one ``sendto``: no library is needed.
(Stopping needs no message: systemd sent the SIGTERM and waits for the process to exit.)

Without ``$NOTIFY_SOCKET`` (not started by systemd, or ``Type=simple``) nothing is sent.
A socket that cannot be reached is logged and otherwise ignored: readiness reporting
must never stop a broker that works.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("amqpd")


def _address(value: str) -> str | None:
    """``$NOTIFY_SOCKET`` as a socket address: a path, or ``@name`` for the abstract
    namespace (written with a leading NUL). Other kinds (vsock) are not supported."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=..."``) to the service manager.

    Returns whether it was sent; False without ``$NOTIFY_SOCKET``."""
    env = os.environ if environ is None else environ
    value = env.get("NOTIFY_SOCKET", "")
    if not value:
        return False
    address = _address(value)
    if address is None:
        log.warning("NOTIFY_SOCKET=%r is not a unix socket address; not notifying", value)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.warning("cannot notify the service manager at %s: %s", value, exc)
        return False
    return True
