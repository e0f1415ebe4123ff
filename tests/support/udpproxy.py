"""A UDP relay a test controls: it stands in front of one node's heartbeat port, so a
test can drop heartbeats to and from chosen cluster nodes (a partition) and restore them.

Each datagram received on the relay's port is forwarded to ``target`` unless the relay
is cut (everything to the node behind it is dropped) or the datagram's sender is in
``drop_senders``. The sender is read from the heartbeat's JSON payload (the node name,
``"n"``), which is how amqpd's heartbeats (amqpd/cluster/heartbeat.py) identify it;
the relay does not check the tag (the receiver does). A thread of its own, bounded
waits, ended by :meth:`stop`.
"""

from __future__ import annotations

import json
import socket
import threading


class UdpRelay:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.2)
        self.address: tuple[str, int] = self.sock.getsockname()
        self.cut = False
        self.drop_senders: set[str] = set()
        self.forwarded = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="udprelay")

    @property
    def addr(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def start(self) -> UdpRelay:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    @staticmethod
    def sender(data: bytes) -> str | None:
        try:
            name = json.loads(data.split(b"\n", 1)[0]).get("n")
        except (ValueError, AttributeError):
            return None
        return name if isinstance(name, str) else None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, _src = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if self.cut or self.sender(data) in self.drop_senders:
                self.dropped += 1
                continue
            try:
                self.sock.sendto(data, self.target)
                self.forwarded += 1
            except OSError:
                self.dropped += 1
