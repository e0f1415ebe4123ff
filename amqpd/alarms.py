"""Resource alarms: memory high-watermark and disk-free limit, as RabbitMQ has them.

Checked once a second. While an alarm is in effect, every connection that publishes is
sent ``connection.blocked`` (if the client advertised the capability) and its socket is
no longer read, so publishers stop instead of growing the broker; consumers keep being
served, which is what lets memory fall again. When the alarm clears, the same connections
get ``connection.unblocked`` and reading resumes. A connection that has not published yet
is blocked the moment it does (RabbitMQ's "blocking" state).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from amqpd.protocol import codec
from amqpd.protocol.constants import CONNECTION_BLOCKED, CONNECTION_UNBLOCKED

if TYPE_CHECKING:
    from amqpd.server import Broker
    from amqpd.session import Session

log = logging.getLogger("amqpd.alarms")

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss() -> int:
    """Resident set size of this process in bytes (Linux /proc; 0 when unknown)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def total_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * _PAGE
    except (ValueError, OSError, AttributeError):
        return 0


def disk_free(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


class Alarms:
    """Owns the alarm state of a node and blocks/unblocks publishing connections."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        s = broker.settings
        total = total_memory()
        self.memory_limit = s.memory_high_watermark_bytes or int(total * s.vm_memory_high_watermark)
        self.disk_limit = s.disk_free_limit
        self.active: set[str] = set()
        self.rss = 0
        self.free = -1

    # Behaves like the set of active alarm names ("memory", "disk") for readers.
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(self.active))

    def __contains__(self, name: object) -> bool:
        return name in self.active

    def __len__(self) -> int:
        return len(self.active)

    def __bool__(self) -> bool:
        return bool(self.active)

    def reason(self) -> str:
        parts = []
        if "memory" in self.active:
            parts.append("low on memory")
        if "disk" in self.active:
            parts.append("low on disk")
        if "store" in self.active:
            parts.append("message store failing")
        return " & ".join(parts)

    def check(self) -> None:
        """Measure and raise/clear alarms (called every second by the broker)."""
        self.rss = process_rss()
        self.free = disk_free(self.broker.settings.data_dir)
        self._set("memory", bool(self.memory_limit) and self.rss > self.memory_limit,
                  f"memory resource limit alarm: rss {self.rss} > limit {self.memory_limit}")
        self._set("disk", self.disk_limit > 0 and 0 <= self.free < self.disk_limit,
                  f"disk resource limit alarm: free {self.free} < limit {self.disk_limit}")

    def set_memory_high_watermark(self, fraction: float | None = None,
                                  absolute: int | None = None) -> int:
        """Change the memory limit at run time (rabbitmqctl set_vm_memory_high_watermark);
        the alarm is re-evaluated at once. Returns the new limit in bytes."""
        if absolute is not None:
            self.memory_limit = int(absolute)
        elif fraction is not None:
            self.memory_limit = int(total_memory() * fraction)
        self.check()
        return self.memory_limit

    def set_external(self, name: str, on: bool, detail: str) -> None:
        """Raise/clear an alarm decided elsewhere (e.g. the store failing to write)."""
        self._set(name, on, detail)

    def _set(self, name: str, on: bool, detail: str) -> None:
        if on and name not in self.active:
            self.active.add(name)
            log.warning("alarm set: %s", detail)
            self._apply()
        elif not on and name in self.active:
            self.active.discard(name)
            log.warning("alarm cleared: %s", name)
            self._apply()

    def _apply(self) -> None:
        for session in list(self.broker.sessions):
            if session.has_published:
                if self.active:
                    self.block(session)
                else:
                    self.unblock(session)

    def block(self, session: Session) -> None:
        if session.blocked:
            return
        session.blocked = True
        if session.conn.capabilities.get("connection.blocked"):
            session.conn.write(codec.method_frame(0, CONNECTION_BLOCKED,
                                                     codec.shortstr(self.reason())))
        proto = getattr(session, "protocol", None)
        if proto is not None:
            proto.pause_reading()

    def unblock(self, session: Session) -> None:
        if not session.blocked:
            return
        session.blocked = False
        if session.conn.capabilities.get("connection.blocked"):
            session.conn.write(codec.method_frame(0, CONNECTION_UNBLOCKED))
        proto = getattr(session, "protocol", None)
        if proto is not None:
            proto.resume_reading()
