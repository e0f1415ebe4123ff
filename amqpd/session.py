"""The broker side of one client connection: login, vhost, channels, exclusive queues.

:class:`Session` is the :class:`~amqpd.protocol.connection.ConnectionDelegate` of one
:class:`~amqpd.protocol.connection.AMQPConnection`. It knows users and vhosts; the
connection machine knows frames. Channel commands are forwarded to
:class:`~amqpd.broker.channel.Channel` objects.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from pamqp import decode
from pamqp.base import Frame as PamqpFrame

from amqpd.broker import resource_limits
from amqpd.broker.channel import Channel
from amqpd.broker.message import Message
from amqpd.broker.queue_type import QueueType
from amqpd.logs import bind_channel
from amqpd.protocol.connection import AMQPConnection, Limits, PublishTarget
from amqpd.protocol.constants import CLASS_CONNECTION, CONNECTION_OPEN, method_of
from amqpd.protocol.errors import (
    ChannelErrorCode,
    CommandInvalid,
    ConnectionAccessRefused,
    ConnectionForced,
    NotAllowed,
    SyntaxError_,
)

if TYPE_CHECKING:
    from amqpd.broker.vhost import VHost
    from amqpd.server import Broker
    from amqpd.transport import AMQPProtocol

log = logging.getLogger("amqpd.session")


def parse_plain(response: bytes) -> tuple[str, str]:
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise SyntaxError_("PLAIN response is malformed")
    return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")


def parse_amqplain(response: bytes) -> tuple[str, str]:
    """AMQPLAIN: a field table *without* its length prefix, with LOGIN and PASSWORD."""
    try:
        _, table = decode.field_table(len(response).to_bytes(4, "big") + response)
    except Exception as exc:
        raise SyntaxError_("AMQPLAIN response is malformed") from exc
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if isinstance(login, bytes):
        login = login.decode()
    if isinstance(password, bytes):
        password = password.decode()
    if not isinstance(login, str) or not isinstance(password, str):
        raise SyntaxError_("AMQPLAIN response lacks LOGIN or PASSWORD")
    return login, password


class Session(PublishTarget):
    def __init__(self, broker: Broker, peer: tuple[str, int] | None, limits: Limits,
                 name: str = "") -> None:
        self.broker = broker
        self.peer = peer
        self.name = name
        self.conn = AMQPConnection(self, broker.server_properties(), limits)
        self.username = ""
        self.user_tags: list[str] = []
        self.vhost: VHost = None  # type: ignore[assignment]
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: list[QueueType] = []
        self.blocked_delivery = False
        self.delivery_stalled = False  # deliveries held back by the per-tick burst cap
        self.blocked = False  # connection.blocked sent (alarm)
        self.has_published = False
        self._perm_cache: dict[tuple[str, str, str], bool] = {}
        self._perm_version = -1
        self._write_ok: str | None = None  # the exchange last published to, allowed
        self.connected_at = time.time()
        self.closed = False
        self.protocol: AMQPProtocol | None = None  # set by the transport, None in tests
        self.peer_cert: dict[str, Any] | None = None  # verified client certificate (amqps)
        self.tls = False
        # a warren node that serves no client (a standby): why, naming the active; set at
        # start-ok, sent as connection.close 320 at connection.open (where a close frame
        # is allowed; a start-ok error only drops the socket)
        self.refused: str | None = None
        self.conn.mechanisms = " ".join(m for m in broker.settings.auth_mechanisms
                                        if m != "EXTERNAL")

    @property
    def peer_is_loopback(self) -> bool:
        if self.peer is None:
            return True
        host = self.peer[0]
        return host.startswith(("127.", "::ffff:127.")) or host in ("::1", "localhost")

    def tls_established(self, peer_cert: dict[str, Any] | None) -> None:
        """Called by the transport on an amqps connection, before connection.start:
        EXTERNAL is offered (first, as configured) when the peer sent a certificate."""
        self.tls = True
        self.peer_cert = peer_cert
        if peer_cert and "EXTERNAL" in self.broker.settings.auth_mechanisms:
            self.conn.mechanisms = " ".join(self.broker.settings.auth_mechanisms)

    # ------------------------------------------------------------------ delegate
    def authenticate(self, mechanism: str, response: bytes, client_properties: dict) -> None:
        # a warren standby, or a paused cluster node (pause_minority), serves no client
        warren = self.broker.warren or self.broker.cluster
        if warren is not None:
            self.refused = warren.refusal()
            if self.refused is not None:  # no credentials are checked: nothing is served
                return
        offered = self.conn.mechanisms.split()
        if mechanism not in offered:
            raise CommandInvalid(f"unknown authentication mechanism '{mechanism}'")
        if mechanism == "EXTERNAL":
            self._authenticate_external()
            return
        if mechanism == "PLAIN":
            username, password = parse_plain(response)
        else:
            username, password = parse_amqplain(response)
        user = self.broker.auth.authenticate(username, password, self.peer_is_loopback)
        if user is None and not self.peer_is_loopback and \
                self.broker.auth.authenticate(username, password, True) is not None:
            # right password, wrong place: say so, in RabbitMQ's words
            log.warning("login refused for loopback-only user %r from %s", username, self.peer)
            raise ConnectionAccessRefused(f"user '{username}' can only connect via localhost")
        if user is None:
            log.warning("login refused for user %r from %s (mechanism %s)", username,
                        self.peer, mechanism)
            raise ConnectionAccessRefused(
                f"Login was refused using authentication mechanism {mechanism}. "
                "For details see the broker logfile."
            )
        self.username = username
        self.user_tags = list(user.tags)

    def _authenticate_external(self) -> None:
        """SASL EXTERNAL (rabbitmq_auth_mechanism_ssl): the user is named by the verified
        client certificate; no password. The user must exist, and loopback-only users
        stay loopback-only."""
        from amqpd.tls import login_from_certificate

        username = login_from_certificate(self.peer_cert,
                                          self.broker.settings.ssl_cert_login_from)
        user = self.broker.auth.users.get(username) if username else None
        if user is not None and not self.peer_is_loopback and \
                username in self.broker.auth.loopback_users:
            log.warning("login refused for loopback-only user %r from %s", username, self.peer)
            raise ConnectionAccessRefused(f"user '{username}' can only connect via localhost")
        if user is None:
            log.warning("EXTERNAL login refused from %s: %s", self.peer,
                        "no peer certificate" if not self.peer_cert else
                        f"user '{username}' - invalid credentials")
            raise ConnectionAccessRefused(
                "Login was refused using authentication mechanism EXTERNAL. "
                "For details see the broker logfile.")
        self.username = username
        self.user_tags = list(user.tags)

    def open_vhost(self, vhost: str) -> None:
        if self.refused is not None:  # a warren standby: clients belong on the active
            log.info("connection refused from %s: %s", self.peer, self.refused)
            raise ConnectionForced(self.refused)
        vh = self.broker.vhosts.get(vhost)
        if vh is None:
            raise NotAllowed(f"vhost {vhost} not found", CLASS_CONNECTION,
                             method_of(CONNECTION_OPEN))
        if not self.broker.auth.can_access_vhost(self.username, vhost):
            raise NotAllowed(f"access to vhost '{vhost}' refused for user '{self.username}'",
                             CLASS_CONNECTION, method_of(CONNECTION_OPEN))
        resource_limits.check_connection(self.broker, self, vhost)
        self.vhost = vh
        self.broker.session_opened(self)
        log.info("connection opened: user=%s vhost=%s peer=%s", self.username, vhost, self.peer)

    def channel_opened(self, channel: int) -> None:
        resource_limits.check_channel(self.broker, self)
        self.channels[channel] = Channel(self, channel)

    def channel_closed(self, channel: int) -> None:
        ch = self.channels.pop(channel, None)
        if ch is not None:
            ch.close()

    def on_method(self, channel: int, method: PamqpFrame) -> None:
        ch = self.channels.get(channel)
        if ch is None:
            raise ChannelErrorCode(f"expected 'channel.open' on channel {channel}")
        bind_channel(channel)
        ch.handle(method)

    def on_publish(self, channel: int, exchange: str, routing_key: str, mandatory: bool,
                   immediate: bool, properties: bytes, body: bytes) -> None:
        self.channels[channel].publish(exchange, routing_key, mandatory, immediate, properties,
                                       body)
        if not self.has_published:
            self.has_published = True
            if self.broker.alarms:
                self.broker.alarms.block(self)

    def on_ack(self, channel: int, delivery_tag: int, multiple: bool) -> None:
        self.channels[channel].ack(delivery_tag, multiple)

    def on_connection_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.username:
            log.info("connection closed: user=%s vhost=%s peer=%s reason=%s", self.username,
                     self.vhost.name if self.vhost else None, self.peer,
                     self.conn.close_reason or "socket closed")
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        # a copy: each deletion calls _forget_queue (on_removed), which takes the queue
        # out of this list; iterating the list itself skipped every second queue, so
        # the second of two exclusive queues outlived its owner (issue 33: 405
        # RESOURCE_LOCKED on a new connection's redeclare)
        for q in list(self.exclusive_queues):
            q.vhost.delete_queue(q, reason="exclusive owner gone")
        self.exclusive_queues.clear()
        self.broker.session_closed(self)

    # ------------------------------------------------------------------ helpers
    def own_queue(self, queue: QueueType) -> None:
        if queue not in self.exclusive_queues:
            self.exclusive_queues.append(queue)
            queue.on_removed.append(self._forget_queue)

    def _forget_queue(self, queue: QueueType) -> None:
        if queue in self.exclusive_queues:
            self.exclusive_queues.remove(queue)

    def check_permission(self, kind: str, resource: str, name: str) -> None:
        """Permission check, cached per (kind, resource, name) until permissions change:
        publishing checks write access on every message."""
        auth = self.broker.auth
        if self._perm_version != auth.version:
            self._perm_cache.clear()
            self._perm_version = auth.version
        key = (kind, resource, name)
        if key in self._perm_cache:
            return
        auth.check(self.username, self.vhost.name, kind, resource, name)
        if len(self._perm_cache) < 1024:
            self._perm_cache[key] = True

    def check_publish(self, exchange: str) -> None:
        """Write permission on the exchange of a publish. A publisher repeats the same
        exchange, so the last one allowed is remembered until permissions change: no
        key tuple and no cache lookup per message."""
        if exchange == self._write_ok and self._perm_version == self.broker.auth.version:
            return
        self.check_permission("write", "exchange", exchange or "amq.default")
        self._write_ok = exchange

    def check_topic(self, permission: str, exchange: str, routing_key: str) -> None:
        """Topic permission on a topic exchange (broker/topic_auth.py), cached like
        :meth:`check_permission`."""
        entries = self.broker.parameters.topic_permissions
        if not entries:
            return
        auth = self.broker.auth
        if self._perm_version != auth.version:
            self._perm_cache.clear()
            self._perm_version = auth.version
        key = ("topic:" + permission, exchange, routing_key)
        if key in self._perm_cache:
            return
        from amqpd.broker import topic_auth

        topic_auth.check(entries, self.username, self.vhost.name, exchange, routing_key,
                         permission)
        if len(self._perm_cache) < 1024:
            self._perm_cache[key] = True

    def body_of(self, message: Message) -> bytes:
        return self.broker.body_of(message)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "user": self.username,
            "vhost": self.vhost.name if self.vhost else None,
            "peer_host": self.peer[0] if self.peer else None,
            "peer_port": self.peer[1] if self.peer else None,
            "channels": len(self.channels),
            "frame_max": self.conn.frame_max,
            "channel_max": self.conn.channel_max,
            "timeout": self.conn.heartbeat,
            "client_properties": self.conn.client_properties,
            "connected_at": int(self.connected_at * 1000),
            "state": "blocked" if self.blocked else "flow" if self.conn.in_flow else "running",
        }
