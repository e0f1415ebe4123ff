"""The public broker API: the one way into the broker from outside the broker package.

The AMQP channel, the HTTP API (``amqpd/http/``), the plugins (shovel, federation) and,
next, the cluster code change topology, move messages and read state through
:class:`BrokerAPI` (``broker.api``), never by reaching into vhosts, queues or the auth
store. The rules therefore live in one place:

* Errors are :mod:`amqpd.protocol.errors` exceptions carrying the AMQP reply code the
  AMQP layer has always sent (404 not found, 405 locked, 406 precondition failed, 403
  access refused, 530 not allowed...); the channel turns them into ``channel.close``,
  the HTTP layer into 4xx responses.
* Durable state saves itself: every change to durable topology, users, permissions,
  vhosts, policies or parameters made here (or by the stores underneath) is recorded in
  the log through :meth:`Broker.definitions_changed`, the one trigger (a definition
  record, :mod:`amqpd.broker.journal`); no caller of this API persists anything by
  hand, and :meth:`wait_durable` returns once what was recorded is durable. (User
  limits and topic permissions live beside the parameters and are recorded by the
  methods here that change them; operator policies keep their own file, as RabbitMQ
  keeps them out of definitions.)
* Per-message work (publish, deliver, settle) runs in compiled code: :meth:`publish` is
  the publish pipeline (:mod:`amqpd.broker.publish`) and a fetched message is settled
  through its queue type (:mod:`amqpd.broker.queue_type`).

Names are looked up per call (``vhost`` is a vhost name or a :class:`VHost`), so a caller
holds no references that outlive a deletion. The types re-exported at the bottom are the
ones callers may hold and read (a queue's name, counters, ``info()``), not mutate.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from amqpd import hotpath

# quorum and stream are imported for their effect: they register their x-queue-type
from amqpd.broker import quorum, resource_limits, stream, topic_auth  # noqa: F401
from amqpd.broker.auth import HASHING_SHA256, Permission, User, hash_password
from amqpd.broker.definitions import DefinitionsError, export_definitions, import_definitions
from amqpd.broker.defsync import KIND_NAMES as DEFINITION_KINDS
from amqpd.broker.exchange import EXCHANGE_TYPES, Binding, Destination, Exchange, args_key
from amqpd.broker.exchange import register_exchange_type as register_exchange_type

# what the cluster's replicas write and read below the queues (ClusterPort.store): the
# records of a queue's store key, and a stored message's handle in a restored queue
from amqpd.broker.message import LoggedMessage as LoggedMessage
from amqpd.broker.message import Message
from amqpd.broker.operator_policy import effective_definition
from amqpd.broker.parameters import ParameterStore, UnknownComponent
from amqpd.broker.policy import register_policy_key
from amqpd.broker.queue import Consumer, Queue, QueueEntry
from amqpd.broker.queue_type import QUEUE_TYPES, QueueType, queue_type_name, register_queue_type
from amqpd.broker.quorum import QuorumQueue as QuorumQueue
from amqpd.broker.reply_to import PREFIX as REPLY_PREFIX
from amqpd.broker.reply_to import inbox as reply_inbox
from amqpd.broker.stream import StreamQueue as StreamQueue
from amqpd.broker.stream import check_stream_consumer as check_stream_consumer
from amqpd.broker.stream import decode_record as decode_record
from amqpd.broker.stream import refuse_stream_return as refuse_stream_return
from amqpd.broker.stream import start_offset as start_offset
from amqpd.broker.stream import stream_directory as stream_directory
from amqpd.broker.stream_readahead import TAIL_BYTES as TAIL_BYTES
from amqpd.broker.stream_readahead import ReadAhead as ReadAhead
from amqpd.broker.stream_readahead import pool_for as pool_for
from amqpd.broker.vhost import VHost, generate_name
from amqpd.protocol import codec
from amqpd.protocol import constants as wire
from amqpd.protocol.errors import (
    AccessRefused,
    AMQPError,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
    ResourceLocked,
)
from amqpd.store.api import MessageStore as MessageStore

# a commit the replicas did not acknowledge: a nack, not disk trouble (the cluster
# refuses waits with it: amqpd/cluster/deadlines.py, mirror.py)
from amqpd.store.api import NotReplicated as NotReplicated
from amqpd.store.api import StoredMessage as StoredMessage
from amqpd.store.api import StoreError as StoreError
from amqpd.store.api import queue_key as queue_key
from amqpd.store.stream_log import AMQP10 as AMQP10
from amqpd.store.stream_log import CHUNK_START as CHUNK_START
from amqpd.store.stream_log import Record as Record
from amqpd.store.stream_log import StreamLog as StreamLog
from amqpd.store.stream_log import StreamLogError as StreamLogError
from amqpd.streamproto.tracking import Tracking as Tracking

if TYPE_CHECKING:
    # for annotations of callers (http/, plugins), which import only this module
    from amqpd.broker.channel import Channel  # noqa: F401
    from amqpd.broker.dedup import SharedCache
    from amqpd.broker.policy import PolicyStore
    from amqpd.broker.publish import Publisher
    from amqpd.config import Settings
    from amqpd.server import Broker
    from amqpd.session import Session
    from amqpd.transport import AMQPProtocol

log = logging.getLogger("amqpd.api")

# The content-header property names, in wire order, as the broker spells them.
PROPERTY_NAMES: tuple[str, ...] = tuple(name for name, _bit, _kind in codec.PROPERTY_FIELDS)

OnConfirm = Callable[[BaseException | None], None]
# answers another node's request (BrokerAPI.serve_node_requests): args in, JSON-able out
NodeRequestHandler = Callable[[dict[str, Any]], Awaitable[Any]]


@dataclass(slots=True)
class Fetched:
    """A message taken from a queue by :meth:`BrokerAPI.get`, not yet settled."""

    queue: QueueType
    entry: QueueEntry
    body: bytes
    message_count: int  # ready messages left in the queue after this one

    @property
    def message(self) -> Message:
        return self.entry.message

    @property
    def redelivered(self) -> bool:
        return self.entry.redelivered


class WarrenStatus(Protocol):
    """What a warren node says about its part in the pair (read-only): the health checks,
    ``/api/nodes``, the metrics and the standby's refusal ask this. It is
    :class:`amqpd.coord.warren.Warren`; ``BrokerAPI.warren()`` is None on a single node."""

    @property
    def role(self) -> str:
        """candidate | promoting | active | standby | fenced | stopped (static roles:
        the replication layer's starting | active | standby | fenced)."""
        ...

    @property
    def epoch(self) -> int: ...

    def accepting_publishes(self) -> bool:
        """The lease holder that takes publishes (what /health/active says)."""
        ...

    def refusal(self) -> str | None:
        """Why a client may not use this node, naming the active; None: it may."""
        ...

    def in_sync(self) -> bool:
        """A connected standby within ``replication.max_lag`` of its active."""
        ...

    def holds_lease(self) -> bool: ...

    def role_code(self) -> int:
        """The role as a number, for the ``amqpd_warren_role`` gauge."""
        ...

    def active_node(self) -> str | None:
        """The node that holds the leader key, as etcd last said (None: unknown)."""
        ...

    def replication_status(self) -> dict[str, Any]:
        """The replication layer's figures (lag in records, bytes, seconds)."""
        ...

    def node_fields(self) -> dict[str, Any]:
        """amqpd's warren fields of this node's ``/api/nodes`` entry."""
        ...

    def peer_nodes(self) -> list[dict[str, Any]]:
        """The other nodes, as ``/api/nodes`` entries, from their last etcd records."""
        ...

    def election_figures(self) -> dict[str, Any] | None:
        """Lease and election counters for the metrics (None: a static role)."""
        ...


class MembershipError(ValueError):
    """A quorum queue membership edit that RabbitMQ refuses as well (the text says why).

    Defined here, not in the cluster package that raises it, so the HTTP layer can tell
    it apart while reaching the cluster through this API only."""


class QuorumMembership(Protocol):
    """The quorum queues' membership edits (``amqpctl add_member``, ``delete_member``,
    ``grow``, ``shrink``; the HTTP paths of amqpd/http/quorum_members.py): the
    cluster's replica groups of quorum queues (:mod:`amqpd.cluster.quorum_group`),
    given by :meth:`ClusterStatus.quorum_membership`."""

    async def edit_members(self, vhost: str, name: str, add: str | None = None,
                           remove: str | None = None) -> list[str]:
        """Add or remove one member; the members now. :class:`MembershipError` for
        what RabbitMQ refuses, LookupError for no such quorum queue."""
        ...

    def grow_targets(self, node: str, strategy: str) -> list[tuple[str, str]]:
        """(vhost, queue) of the quorum queues ``grow`` adds ``node`` to
        (``strategy``: ``all`` | ``even``)."""
        ...

    def shrink_targets(self, node: str) -> list[tuple[str, str]]:
        """(vhost, queue) of the quorum queues ``node`` is a member of."""
        ...

    def group_size(self, vhost: str, name: str) -> int:
        """The members of a quorum queue's group as last read (0: unknown)."""
        ...

    def is_member_node(self, node: str) -> bool:
        """Is ``node`` a member of the cluster (a node a group may grow to)?"""
        ...


class ClusterPort(Protocol):
    """The node's broker as the cluster's queue types use it (issue 28): the mirrored
    queues (:mod:`amqpd.cluster.mirror` wraps :attr:`store` and leads the queues in
    :attr:`vhosts`), the quorum groups and the remote queues
    (:mod:`amqpd.cluster.remote_queue` installs :attr:`queue_placer`). Given by
    :meth:`BrokerAPI.cluster_port`; exactly these members, so mypy shows every new
    reach of the cluster into the broker here first."""

    store: MessageStore
    vhosts: dict[str, VHost]
    settings: Settings
    publisher: Publisher
    policies: PolicyStore
    transports: set[AMQPProtocol]
    cluster: ClusterStatus | None  # the node's cluster (a queue led elsewhere asks it)
    queue_placer: Callable[[VHost, str, type[QueueType], bool, dict[str, Any]],
                           QueueType | None] | None

    def apply_policies_to(self, vhost: VHost, obj: QueueType | Exchange) -> None: ...

    def definitions_changed(self, obj: QueueType | Exchange | Binding | None = None,
                            deleted: bool = False) -> None: ...


class ClusterStatus(Protocol):
    """What the broker and the HTTP API ask of the cluster (issue 15): it is
    :class:`amqpd.cluster.node.Cluster`, a :class:`amqpd.cluster.view.ClusterView`;
    ``BrokerAPI.cluster()`` is None on a single node (``cluster.name`` empty)."""

    node_name: str

    def serving(self) -> bool:
        """False while this node is paused (pause_minority) or not yet in sync."""
        ...

    def refusal(self) -> str | None:
        """Why an AMQP client may not use this node now; None: it may."""
        ...

    def is_running(self, node: str) -> bool: ...

    def stream_address_of(self, node: str) -> tuple[str, int] | None:
        """``node``'s stream protocol listener as its metadata names it (its record's
        ``stream``); None when unknown or off there."""
        ...

    def queue_leader(self, vhost: str, name: str) -> str | None:
        """The node that leads a durable queue, from the cluster's catalogue."""
        ...

    def records_queue(self, vhost: str, name: str) -> bool:
        """Does this node record the queue's definition in its own log (it leads it)?"""
        ...

    def leadership_confirmed(self) -> bool:
        """May this node claim the durable queues it holds as their leader now? False
        from its start, and after a stall, a pause or etcd out of reach, until it has
        read etcd's definitions again (amqpd/cluster/leadership.py)."""
        ...

    def refresh_queue(self, vhost: str, name: str, done: Callable[[], None]) -> None:
        """Bring this node's record of a durable queue in line with etcd's, then call
        ``done`` (also when etcd cannot be read within ``definition_timeout``: the
        caller goes on with the view it has)."""
        ...

    def after_queue_gone(self, vhost: str, name: str, callback: OnConfirm) -> None:
        """``callback(None)`` once etcd's delete of a durable queue led by another
        node (its leader writes it) has reached this node; an error after
        ``definition_timeout``."""
        ...

    def definition_recorded(self, kind: int, key: str, body: bytes) -> None:
        """The journal recorded a definition change here: mirror it to the cluster."""
        ...

    def runs_here(self, key: str) -> bool:
        """Is this node the one of the cluster that runs the singleton ``key`` (a
        dynamic shovel, a federated exchange's link)? Every node answers the same from
        the running members it sees; a paused node runs none."""
        ...

    def reply_queue(self, vhost: str, name: str, node: str) -> QueueType | None:
        """The stand-in through which a direct reply reaches ``node``'s inbox ``name``
        (``amq.rabbitmq.reply-to.<token>``, the token ``node``'s); None if ``node`` is
        not a running member (the reply is dropped, as a stale one)."""
        ...

    def transient_declared(self, queue: QueueType) -> bool:
        """A queue that is no durable definition (non-durable, or exclusive) was
        created here: make it known on every node (amqpd/cluster/transient.py). True:
        its reply waits until every node knows it (``after_mirrored``)."""
        ...

    def transient_binding(self, binding: Binding, deleted: bool) -> bool:
        """A binding that is no durable definition was made (or, ``deleted``, removed)
        here (a non-durable queue's bindings are known on every node too, wherever they
        were made). True: its reply waits until every node knows it
        (``after_mirrored``)."""
        ...

    def dedup_cache(self, vhost: str, exchange: str) -> SharedCache:
        """The cluster-wide cache of deduplication exchange ``exchange`` (issue 32)."""
        ...

    def share_info(self, section: str, value: Any) -> None:
        """This node's ``section`` (JSON-able) for the other nodes to read."""
        ...

    async def peer_info(self, section: str) -> dict[str, Any]:
        """The other running nodes' ``section``, by node name."""
        ...

    async def ask(self, node: str, kind: str, args: dict[str, Any], timeout: float) -> Any:
        """Another running node's answer to a request (amqpd/cluster/node_requests.py)."""
        ...

    async def ask_running(self, kind: str, args: dict[str, Any], timeout: float,
                          ) -> tuple[dict[str, Any], dict[str, str]]:
        """Every other running node's answer to ``kind`` over the inter-node links
        (amqpd/cluster/peer_ask.py), each given ``timeout`` seconds: the answers by
        node, and the nodes left out with why."""
        ...

    def transient_recorded(self, kind: int, key: str, body: bytes) -> bool:
        """A non-durable exchange or a binding that is not durable changed here (an
        empty body deletes): make it cluster-wide. True: a reply waits for etcd."""
        ...

    def after_mirrored(self, callback: OnConfirm) -> OnConfirm:
        """``callback`` wrapped to run once the changes recorded so far are in etcd
        (and a non-durable queue's, applied by every node)."""
        ...

    def display_name(self) -> str | None:
        """The cluster name set cluster-wide (``set_cluster_name``), None if unset."""
        ...

    async def set_display_name(self, name: str) -> None: ...

    def node_entries(self) -> list[dict[str, Any]]:
        """Every member as an ``/api/nodes`` entry (RabbitMQ's fields + ``running``)."""
        ...

    def status(self) -> dict[str, Any]:
        """``amqpctl cluster_status``: members, running nodes, partitions, paused."""
        ...

    async def join(self, via: str) -> dict[str, Any]: ...

    async def forget(self, node: str) -> None: ...

    def complete_export(self, data: dict[str, Any], vhost: str | None) -> dict[str, Any]:
        """Add the catalogue's queues and bindings that no local object stands for."""
        ...

    def queue_fields(self, vhost: str, name: str, kind: str) -> dict[str, Any]:
        """The management fields the cluster adds to a queue of type ``kind``
        (:meth:`QueueType.listed_type`): a mirrored queue's mirrors, a quorum queue's
        members (empty for others, or before the replicas started)."""
        ...

    def quorum_critical(self) -> list[tuple[str, str]]:
        """(vhost, queue) of the quorum queues stopping this node would leave without
        a majority of running members."""
        ...

    def quorum_membership(self) -> QuorumMembership | None:
        """The quorum queues' membership edits (None before the groups started)."""
        ...

    def request_mirror_sync(self, vhost: str, name: str, action: str) -> bool:
        """``sync`` / ``cancel_sync`` of a mirrored queue's unsynchronised mirrors,
        done by its leader (this node, or asked over the link). False: the leader
        cannot be reached (or mirrored queues have not started here)."""
        ...

    def mirror_sync_critical(self) -> list[tuple[str, str]]:
        """(vhost, queue) of the mirrored queues stopping this node would leave
        without a synchronised replica."""
        ...


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """The node-level facts ``/api/overview``, ``/api/nodes`` and ``/metrics`` show, read
    at one moment by :meth:`BrokerAPI.node_status` (a copy: holding it holds nothing)."""

    name: str  # the node name (``rabbit@host`` in RabbitMQ's spelling)
    cluster_name: str  # the set cluster name, else the node name
    started_at: float  # wall-clock seconds since the epoch when the broker was built
    alarms: tuple[str, ...]  # active resource alarms, sorted ("disk", "memory", "store")
    memory_limit: int  # the memory high watermark in bytes (0: none)
    disk_free_limit: int  # the free-disk low watermark in bytes
    data_dir: str  # where the node keeps its files (its disk_free is measured there)
    plugins: tuple[str, ...]  # the enabled plugins' names, sorted
    hot_path: str  # how the hot path runs: amqpd.hotpath.MODE ("compiled (mypyc)", ...)


class BrokerAPI:
    """Everything outside the broker package may do to a broker (one per broker)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    # ------------------------------------------------------------------ the node
    @property
    def settings(self) -> Settings:
        """The node's configuration (read-only by convention)."""
        return self._broker.settings

    def local_uri(self, vhost: str = "/") -> str:
        """An AMQP URI to this broker, for plugins' links (RabbitMQ's bare "amqp://")."""
        return self._broker.local_uri(vhost)

    def listeners(self) -> list[tuple[str, str, int]]:
        """(protocol, host, port) of every bound listener (empty before start)."""
        return list(self._broker.listeners)

    def stream_address(self) -> tuple[str, int] | None:
        """The stream protocol listener's address as metadata names it (host, port);
        None while the listener is off."""
        listener = self._broker.stream_listener
        return listener.advertised if listener is not None else None

    def http_port(self) -> int:
        """The bound port of the HTTP API (0 while it is not listening)."""
        http = self._broker.http
        return int(http.port or 0) if http is not None else 0

    def node_name(self) -> str:
        """This node's name (the ``node`` field of every management object)."""
        return self._broker.settings.node_name

    def data_dir(self) -> str:
        """The node's data directory (the HTTP layer keeps its login sessions there)."""
        return str(self._broker.settings.data_dir)

    def cluster_name(self) -> str:
        """The cluster name: the one set (config, definitions, ``PUT /api/cluster-name``),
        else the node name, as RabbitMQ answers for a node nobody named a cluster. In a
        cluster: the name set cluster-wide, else the configured one, else ``cluster.name``."""
        cluster = self._broker.cluster
        settings = self._broker.settings
        if cluster is not None:
            return cluster.display_name() or settings.cluster_name or settings.cluster.name
        return settings.effective_cluster_name

    def cluster_port(self) -> ClusterPort:
        """The broker as the cluster's queue types use it (:class:`ClusterPort`): for
        amqpd/cluster/ only, which replicates and places queues below this API."""
        return self._broker

    def cluster(self) -> ClusterStatus | None:
        """This node's cluster (amqpd/cluster/), or None on a single node."""
        return self._broker.cluster

    async def set_cluster_name_everywhere(self, name: str) -> None:
        """``PUT /api/cluster-name``, ``amqpctl set_cluster_name``: in a cluster the
        name is written to etcd and every node answers it (also after restarts); on a
        single node it is :meth:`set_cluster_name`."""
        cluster = self._broker.cluster
        if cluster is None:
            self.set_cluster_name(name)
            return
        await cluster.set_display_name(name)

    async def join_cluster(self, via: str) -> dict[str, Any]:
        """``amqpctl join_cluster <via>``: make this node a member of the cluster
        ``via`` belongs to (again, after forget_cluster_node); its definitions are
        replaced by the cluster's. 404 if ``via`` is no member; 400 without a cluster."""
        cluster = self._require_cluster()
        try:
            return await cluster.join(via)
        except LookupError as exc:
            raise NotFound(str(exc)) from None

    async def forget_cluster_node(self, node: str) -> None:
        """``amqpctl forget_cluster_node``: remove a stopped node from the members.
        405 (HTTP 409) while it runs or for this node itself; 404 for a non-member."""
        cluster = self._require_cluster()
        try:
            await cluster.forget(node)
        except LookupError as exc:
            raise NotFound(str(exc)) from None
        except RuntimeError as exc:  # amqpd.cluster.membership.NotAllowed
            raise ResourceLocked(str(exc)) from None

    def serves_clients(self) -> bool:
        """Does this node serve AMQP clients now? Always on a single node; in a cluster
        once the cluster is up and synchronised and while the node is not paused (a
        plugin's link to this node would be refused before: 320)."""
        cluster = self._broker.cluster
        if cluster is None:
            return not self.clustered()
        return cluster.serving()

    def runs_here(self, key: str) -> bool:
        """Does this node run the cluster-wide singleton ``key`` (a dynamic shovel, a
        federated exchange's link: one node of a cluster runs each, as RabbitMQ's
        mirrored supervisors do)? Always on a single node; not before the cluster has
        started on a node configured for one."""
        cluster = self._broker.cluster
        if cluster is None:
            return not self.clustered()
        return cluster.runs_here(key)

    def share_cluster_info(self, section: str, value: Any) -> None:
        """In a cluster, publish this node's ``section`` (JSON-able; e.g. the dynamic
        shovels it runs) for the other nodes (amqpd/cluster/node_info.py); nothing on
        a single node."""
        cluster = self._broker.cluster
        if cluster is not None:
            cluster.share_info(section, value)

    async def cluster_info(self, section: str) -> dict[str, Any]:
        """The other running nodes' ``section`` by node name ({} on a single node):
        what lets any node answer for the whole cluster, as RabbitMQ's do."""
        cluster = self._broker.cluster
        if cluster is None:
            return {}
        return await cluster.peer_info(section)

    def serve_node_requests(self, kind: str, handler: NodeRequestHandler) -> None:
        """Answer the ``kind`` requests other nodes of the cluster make of this one
        (:meth:`ask_node`) with ``await handler(args)`` (JSON-able; an :class:`AMQPError`
        goes back as its reply code). May be called before the cluster is up (plugins
        are built first)."""
        self._broker.node_request_handlers[kind] = handler

    def node_request_handler(self, kind: str) -> NodeRequestHandler | None:
        """The handler :meth:`serve_node_requests` registered for ``kind``, if any."""
        return self._broker.node_request_handlers.get(kind)

    def lists_cluster_wide(self) -> bool:
        """Do the management API's lists of connections, channels and consumers show
        the whole cluster's (a cluster member with ``cluster.wide_lists``)?"""
        return self._broker.cluster is not None and self._broker.settings.cluster.wide_lists

    async def ask_every_node(self, kind: str, args: dict[str, Any],
                             ) -> tuple[dict[str, Any], dict[str, str]]:
        """Every other running node's answer to ``kind`` (the handler it registered
        with :meth:`serve_node_requests`), asked over the inter-node links, each given
        ``cluster.list_timeout`` seconds: the answers by node, and the nodes left out
        with why (no link, no answer in time, an error; logged). Nothing on a single
        node."""
        cluster = self._broker.cluster
        if cluster is None:
            return {}, {}
        return await cluster.ask_running(kind, args, self._broker.settings.cluster.list_timeout)

    async def ask_node(self, node: str, kind: str, args: dict[str, Any],
                       timeout: float = 5.0) -> Any:
        """Ask ``node``, another running node of the cluster, to do ``kind`` (what
        RabbitMQ's nodes do with an RPC: restart the shovel or federation link that
        node runs) and return its answer. 404 when ``node`` is not another running
        node or its handler answered 404 (the error of any other error answer);
        :class:`TimeoutError` without an answer within ``timeout`` seconds; 406
        without a cluster."""
        return await self._require_cluster().ask(node, kind, args, timeout)

    def clustered(self) -> bool:
        """Is this node configured to be in a cluster (``cluster.name`` set)? True from
        the start, before the cluster itself is up (plugins start first)."""
        return bool(self._broker.settings.cluster.enabled)

    def _require_cluster(self) -> ClusterStatus:
        cluster = self._broker.cluster
        if cluster is None:
            raise PreconditionFailed("this node is not in a cluster (cluster.name is not set)")
        return cluster

    # ------------------------------------------------------------------ cluster definitions
    def definition_entries(self) -> dict[tuple[int, str], bytes]:
        """Every durable definition, as the journal records it (the cluster's mirror)."""
        from amqpd.broker.defsync import local_entries

        return local_entries(self._broker)

    def transient_definition_entries(self) -> dict[tuple[int, str], bytes]:
        """The non-durable exchanges and bindings, as the journal's entries (a cluster
        makes them cluster-wide: amqpd/cluster/transient_defs.py)."""
        from amqpd.broker.defsync import transient_entries

        return transient_entries(self._broker)

    def apply_definition(self, kind: int, key: str, body: bytes | None) -> None:
        """Apply a definition change made on another node (an empty body deletes);
        raises when it cannot be applied (the caller logs it)."""
        from amqpd.broker.defsync import apply_entry

        apply_entry(self._broker, kind, key, body)

    def set_cluster_name(self, name: str) -> None:
        """Rename the cluster for this run of the node. Like a definitions import of the
        ``cluster_name`` global parameter it is not written to the log: a restart goes
        back to the configured name (exported definitions carry the new one)."""
        self._broker.settings.cluster_name = name

    def node_status(self) -> NodeStatus:
        """The node's identity, uptime origin, alarms and limits, as one snapshot."""
        b = self._broker
        alarms = b.alarms
        return NodeStatus(
            name=b.settings.node_name,
            cluster_name=self.cluster_name(),
            started_at=b.started_at,
            alarms=tuple(sorted(alarms)),
            memory_limit=int(alarms.memory_limit or 0),
            disk_free_limit=int(alarms.disk_limit or 0),
            data_dir=str(b.settings.data_dir),
            plugins=tuple(sorted(b.plugins)),
            hot_path=hotpath.MODE,
        )

    def alarms(self) -> list[str]:
        """The resource alarms in effect, sorted ("disk", "memory", "store"); empty: none."""
        return sorted(self._broker.alarms)

    def set_memory_high_watermark(self, *, fraction: float | None = None,
                                  absolute: int | None = None) -> int:
        """Change the memory limit at run time (rabbitmqctl set_vm_memory_high_watermark):
        ``absolute`` bytes, else ``fraction`` of the machine's memory. The memory alarm
        is re-evaluated at once; returns the new limit in bytes. Not persisted: a restart
        goes back to the configured watermark, as in RabbitMQ."""
        return self._broker.alarms.set_memory_high_watermark(fraction=fraction,
                                                             absolute=absolute)

    def enabled_plugins(self) -> list[str]:
        """The names of the enabled plugins, sorted (the web UI shows their pages)."""
        return sorted(self._broker.plugins)

    def plugin_http_routes(self) -> list[Callable[[Any], None]]:
        """Each enabled plugin's ``http_routes(router)`` hook, in plugin order: the HTTP
        layer calls them with its router to add ``/api/shovels``, ``/api/federation-links``."""
        hooks: list[Callable[[Any], None]] = []
        for plugin in self._broker.plugins.values():
            add_routes = getattr(plugin, "http_routes", None)
            if add_routes is not None:
                hooks.append(add_routes)
        listener = self._broker.stream_listener  # /api/stream/... (amqpd.streamproto)
        if listener is not None:
            hooks.append(listener.http_routes)
        return hooks

    def stopping(self) -> bool:
        """True once the node has begun to shut down."""
        return self._broker.stopping

    def alarms_active(self) -> bool:
        """True while a resource alarm blocks publishers (memory, disk, store)."""
        return bool(self._broker.alarms)

    def plugin(self, name: str) -> Any:
        """An enabled plugin by name (KeyError if it is not enabled)."""
        return self._broker.plugins[name]

    def on_policy_applied(self, callback: Callable[[VHost, QueueType | Exchange], None]) -> None:
        """Call ``callback(vhost, queue or exchange)`` after a policy is (re)applied."""
        self._broker.policies.on_applied.append(callback)

    # ------------------------------------------------------------------ lookups
    def vhost(self, vhost: VHost | str) -> VHost:
        """The vhost, or 404 NOT_FOUND."""
        if isinstance(vhost, VHost):
            return vhost
        vh = self._broker.vhosts.get(vhost)
        if vh is None:
            raise NotFound(f"no vhost '{vhost}'")
        return vh

    def vhosts(self) -> list[VHost]:
        return sorted(self._broker.vhosts.values(), key=lambda v: v.name)

    def has_vhost(self, name: str) -> bool:
        return name in self._broker.vhosts

    def exchange(self, vhost: VHost | str, name: str) -> Exchange:
        return self.vhost(vhost).get_exchange(name)

    def queue(self, vhost: VHost | str, name: str) -> QueueType:
        return self.vhost(vhost).get_queue(name)

    def find_queue(self, vhost: str, name: str) -> QueueType | None:
        vh = self._broker.vhosts.get(vhost)
        return vh.queues.get(name) if vh is not None else None

    def find_exchange(self, vhost: str, name: str) -> Exchange | None:
        vh = self._broker.vhosts.get(vhost)
        return vh.exchanges.get(name) if vh is not None else None

    def queues(self, vhost: VHost | str) -> list[QueueType]:
        return sorted(self.vhost(vhost).queues.values(), key=lambda q: q.name)

    def exchanges(self, vhost: VHost | str) -> list[Exchange]:
        return sorted(self.vhost(vhost).exchanges.values(), key=lambda e: e.name)

    def bindings(self, vhost: VHost | str) -> list[Binding]:
        return self.vhost(vhost).bindings()

    def sessions(self) -> list[Session]:
        """Open client connections (past the handshake)."""
        return list(self._broker.sessions)

    def socket_count(self) -> int:
        """Accepted sockets, handshaking or not."""
        return len(self._broker.transports)

    def on_queue_deleted(self, vhost: VHost | str,
                         callback: Callable[[QueueType], None]) -> None:
        """Call ``callback(queue)`` after each queue deletion in the vhost."""
        vh = self.vhost(vhost)
        if callback not in vh.on_queue_deleted:
            vh.on_queue_deleted.append(callback)

    def store_stats(self) -> dict[str, int]:
        """The message store's numbers (bytes on disk, fsyncs...) for metrics."""
        return dict(self._broker.store.stats())

    # ------------------------------------------------------------------ the warren
    def warren(self) -> WarrenStatus | None:
        """This node's part in a warren (amqpd/coord), or None on a single node."""
        return self._broker.warren

    def replication_status(self) -> dict[str, Any] | None:
        """The replication layer's figures (what ``GET /api/replication`` shows: role,
        epoch, standbys and their lag), or None when replication is not configured."""
        roles = self._broker.roles
        return dict(roles.status()) if roles is not None else None

    async def promote(self) -> int:
        """A static warren standby becomes active at the next epoch (``amqpctl
        promote``: the manual failover without etcd); returns the epoch. 405
        RESOURCE_LOCKED when the role cannot change now (e.g. already active), 406
        PRECONDITION_FAILED when replication is not configured."""
        return await self._broker.promote_standby()

    # ------------------------------------------------------------------ exchanges
    def declare_exchange(
        self, vhost: VHost | str, name: str, type_: str, *, passive: bool = False,
        durable: bool = False, auto_delete: bool = False, internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        """exchange.declare: 403 on ``amq.*`` and the default exchange, 404 (passive),
        503 unknown type, 406 inequivalent redeclaration."""
        return self.vhost(vhost).declare_exchange(
            name, type_, passive=passive, durable=durable, auto_delete=auto_delete,
            internal=internal, arguments=arguments)

    def delete_exchange(self, vhost: VHost | str, name: str, *, if_unused: bool = False) -> None:
        """exchange.delete: idempotent; 403 on built-ins, 406 in use with ``if_unused``."""
        self.vhost(vhost).delete_exchange(name, if_unused=if_unused)

    # ------------------------------------------------------------------ queues
    def declare_queue(
        self, vhost: VHost | str, name: str, *, passive: bool = False, durable: bool = False,
        exclusive_owner: object | None = None, auto_delete: bool = False,
        arguments: dict[str, Any] | None = None, owner: object | None = None,
        server_named: bool = False,
    ) -> QueueType:
        """queue.declare: ``x-queue-type`` picks the queue type; 404 (passive), 405
        (another connection's exclusive queue), 406 (inequivalent, bad arguments, or a
        new queue over the vhost's ``max-queues`` limit), 403 (``amq.*`` names).

        The queue limit is enforced here, for every declaring caller (AMQP, HTTP,
        plugins), as RabbitMQ enforces it for AMQP and management alike."""
        vh = self.vhost(vhost)
        if not passive and name not in vh.queues:
            resource_limits.check_queue(self._broker, vh.name, len(vh.queues), name)
        return vh.declare_queue(
            name, passive=passive, durable=durable, exclusive_owner=exclusive_owner,
            auto_delete=auto_delete, arguments=arguments, owner=owner,
            server_named=server_named)

    def delete_queue(
        self, vhost: VHost | str, name: str, *, if_unused: bool = False,
        if_empty: bool = False, owner: object | None = None,
    ) -> int:
        """queue.delete: the number of ready messages dropped; idempotent."""
        return self.vhost(vhost).delete_queue_named(
            name, if_unused=if_unused, if_empty=if_empty, owner=owner)

    def purge_queue(self, vhost: VHost | str, name: str, *, owner: object | None = None) -> int:
        """queue.purge: the number of ready messages dropped."""
        return self.vhost(vhost).purge_queue(name, owner=owner)

    def check_exclusive(self, queue: QueueType, owner: object | None) -> None:
        """405 RESOURCE_LOCKED unless ``owner`` may use ``queue``."""
        queue.vhost.check_exclusive(queue, owner)

    # ------------------------------------------------------------------ bindings
    def bind(
        self, vhost: VHost | str, kind: str, destination: str, source: str,
        routing_key: str, arguments: dict[str, Any] | None = None,
        owner: object | None = None, username: str | None = None,
    ) -> None:
        """queue.bind (``kind="queue"``) or exchange.bind (``kind="exchange"``). With
        ``username``, a topic exchange as source needs that user's topic read
        permission on the key first (403, :meth:`check_topic_permission`)."""
        vh = self.vhost(vhost)
        if username is not None:
            self.check_topic_permission(username, vh, source, routing_key, "read")
            if kind == "queue":  # a client's bind (not the cluster's replay of one)
                queue = vh.queues.get(destination)
                if queue is not None:
                    queue.check_bind()
        vh.bind(kind, destination, source, routing_key, arguments, owner)

    def unbind(
        self, vhost: VHost | str, kind: str, destination: str, source: str,
        routing_key: str, arguments: dict[str, Any] | None = None,
        owner: object | None = None, username: str | None = None,
    ) -> None:
        """queue.unbind / exchange.unbind; ``username`` as for :meth:`bind`."""
        vh = self.vhost(vhost)
        if username is not None:
            self.check_topic_permission(username, vh, source, routing_key, "read")
        vh.unbind(kind, destination, source, routing_key, arguments, owner)

    def on_binding_changed(self, vhost: VHost | str, callback: Callable[[Exchange], None]) -> None:
        """Call ``callback(source exchange)`` after each bind/unbind in the vhost."""
        vh = self.vhost(vhost)
        if callback not in vh.on_binding_changed:
            vh.on_binding_changed.append(callback)

    # ------------------------------------------------------------------ messages
    def publish(
        self, vhost: VHost | str, exchange: str, message: Message, username: str | None,
        on_confirm: OnConfirm | None = None, on_unroutable: Callable[[], None] | None = None,
        only: frozenset[str] | None = None,
    ) -> list[QueueType]:
        """Route and enqueue ``message``: the publish pipeline every publisher uses
        (see :meth:`amqpd.broker.publish.Publisher.publish` for the confirm contract).
        404 for an unknown exchange; 406 for a forged user-id or bad expiration; with
        ``username``, 403 when a topic exchange refuses that user's routing key (topic
        write permission, :meth:`check_topic_permission`). The AMQP channel applies the
        same check through its session's cache before its per-message call into the
        pipeline. ``only``: just the queues of the route with these names (see
        :meth:`route_names`)."""
        vh = self.vhost(vhost)
        if username is not None:
            self.check_topic_permission(username, vh, exchange, message.routing_key,
                                        "write")
        return self._broker.publisher.publish(vh, exchange, message, username, on_confirm,
                                              on_unroutable, only)

    def route_names(self, vhost: VHost | str, exchange: str, message: Message) -> list[str]:
        """The names of the queues a publish of ``message`` to ``exchange`` reaches now
        (a federation link publishes per queue when there are several, so that a retry
        goes only to the queues that did not take it). 404 for an unknown exchange."""
        return self._broker.publisher.route_names(self.vhost(vhost), exchange, message)

    def get(self, vhost: VHost | str, name: str, *, owner: object | None = None) -> Fetched | None:
        """basic.get without a channel: take the head of the queue (None when empty).
        The result stays unacknowledged until :meth:`ack` or :meth:`reject`. A get
        counts as use of the queue for ``x-expires``, as basic.get does."""
        q = self.queue(vhost, name)
        q.vhost.check_exclusive(q, owner)
        q.touch()
        entry = q.fetch()  # as basic.get shows it (a quorum queue's x-delivery-count)
        if entry is None:
            return None
        body = self._broker.body_of(entry.message)
        q.delivered(entry, acked=False)
        return Fetched(q, entry, body, q.message_count)

    def ack(self, fetched: list[Fetched]) -> None:
        """The fetched messages are done with."""
        for queue, entries in _by_queue(fetched).items():
            queue.settle(entries)

    def reject(self, fetched: list[Fetched], requeue: bool) -> None:
        """basic.reject / basic.nack: back to their places (marked redelivered), or
        dead-lettered (reason ``rejected``) and settled."""
        for queue, entries in _by_queue(fetched).items():
            if requeue and not queue.deleted:
                queue.requeue(entries)
            else:
                self._broker.dead_letter(queue, entries, "rejected")
                queue.settle(entries)

    def body_of(self, message: Message) -> bytes:
        return self._broker.body_of(message)

    # ------------------------------------------------------------------ consumers
    def consume(
        self, vhost: VHost | str, name: str, channel: Any, tag: str, *, no_ack: bool,
        exclusive: bool, prefetch: int, arguments: dict[str, Any] | None,
        owner: object | None, global_prefetch: int = 0,
    ) -> Consumer:
        """basic.consume: attach a consumer of ``channel`` (which implements
        :class:`amqpd.broker.queue.ConsumerChannel`). 404, 405 (exclusive queue of
        another connection), 403 ACCESS_REFUSED (exclusive use), 406 (bad arguments)."""
        vh = self.vhost(vhost)
        q = vh.get_queue(name)
        vh.check_exclusive(q, owner)
        if q.consumers and (exclusive or any(c.exclusive for c in q.consumers)):
            raise AccessRefused(f"queue '{q.name}' in vhost '{vh.name}' in exclusive use")
        args = dict(arguments or {})
        q.check_consume(args, global_prefetch)  # global_prefetch: the channel's global QoS
        consumer = Consumer(channel, q, tag, no_ack, exclusive, prefetch, args)
        q.check_consumer(consumer)  # a stream: no automatic acks, a prefetch
        return consumer

    def start_consumer(self, consumer: Consumer) -> None:
        """Begin deliveries to a consumer made by :meth:`consume` (after consume-ok)."""
        consumer.queue.add_consumer(consumer)

    def cancel(self, consumer: Consumer) -> None:
        """basic.cancel: no more deliveries; an auto-delete queue may go with it."""
        consumer.queue.remove_consumer(consumer)

    def has_demand(self, vhost: str, name: str, min_priority: int = 0) -> bool:
        """Would a message put into this queue now go straight to a consumer? True when
        the queue has nothing ready and a consumer of priority >= ``min_priority`` has
        credit and an open, unblocked channel (federated queues pull only then).
        404 if the queue does not exist."""
        q = self.queue(vhost, name)
        if q.message_count:
            return False
        return any(c.priority >= min_priority and c.has_credit() and c.channel.can_deliver(c)
                   for c in q.consumers)

    def queue_type_info(self, q: QueueType) -> dict[str, Any]:
        """What the management API shows of a queue beyond :meth:`QueueType.info` for
        its kind (:meth:`QueueType.type_info`), e.g. a quorum queue's leader and members."""
        out = q.type_info(self._broker.settings.node_name)
        cluster = self._broker.cluster
        if cluster is not None:  # its mirrors, its quorum group's members (amqpd/cluster)
            out.update(cluster.queue_fields(q.vhost.name, q.name, q.listed_type()))
        return out

    def quorum_critical(self) -> list[tuple[str, str]]:
        """(vhost, queue) of the quorum queues that stopping this node would leave
        without a majority of running members (empty on a single node)."""
        cluster = self._broker.cluster
        return cluster.quorum_critical() if cluster is not None else []

    def mirror_sync_critical(self) -> list[tuple[str, str]]:
        """(vhost, queue) of the mirrored queues that stopping this node would leave
        without a synchronised replica (empty on a single node)."""
        cluster = self._broker.cluster
        return cluster.mirror_sync_critical() if cluster is not None else []

    def overdue_waits(self, source: str | None = None) -> list[tuple[float, str, str]]:
        """Requests waiting longer than ``definition_timeout`` (amqpd/watchdog.py):
        ``(seconds waited, source, what they wait on)``; ``source`` "definitions": only
        the definition changes (declares, HTTP writes) waiting to become durable."""
        now = time.monotonic()
        return [(now - started, name, what) for started, name, what
                in self._broker.watchdog.overdue(now, source)]

    def wait_limit(self) -> float:
        """The seconds after which a waiting request is overdue (definition_timeout)."""
        return self._broker.watchdog.wait_limit

    # ------------------------------------------------------------------ durability
    async def wait_durable(self) -> None:
        """Return once every definition change recorded so far is durable (a change made
        through this API is acknowledged only then; raises if the store failed)."""
        await self._broker.definitions.wait_durable()

    # ------------------------------------------------------------------ vhosts
    def add_vhost(self, name: str, *, description: str | None = None,
                  tags: list[str] | None = None,
                  default_queue_type: str | None = None) -> bool:
        """Create a vhost (or update its metadata); True if it was created."""
        broker = self._broker
        existed = name in broker.vhosts
        meta = broker.parameters.vhost_meta.setdefault(name, {})
        if description is not None:
            meta["description"] = description
        if tags is not None:
            meta["tags"] = tags
        if default_queue_type is not None:
            meta["default_queue_type"] = default_queue_type
        broker.add_vhost(name)
        broker.definitions_changed()
        return not existed

    def vhost_meta(self, name: str) -> dict[str, Any]:
        return dict(self._broker.parameters.vhost_meta.get(name, {}))

    def delete_vhost(self, name: str) -> None:
        """Close the vhost's connections (320), drop its queues, exchanges, permissions,
        policies and parameters. 404 if there is no such vhost."""
        broker = self._broker
        vh = self.vhost(name)
        del broker.vhosts[name]
        for session in list(broker.sessions):
            if session.vhost is vh:
                self.close_connection(session, f"vhost '{name}' is deleted")
        for q in list(vh.queues.values()):
            vh.delete_queue(q, reason="vhost deleted")
        changed = broker.definitions_changed
        for ex in list(vh.exchanges.values()):
            for binding in list(ex.bindings.values()):  # exchange-to-exchange ones are left
                changed(binding, True)
            changed(ex, True)
            ex.close()
        broker.auth.clear_vhost(name)
        broker.parameters.clear_vhost(name)
        for p in broker.policies.list(name):
            broker.policies.clear(name, p["name"])
        broker.definitions_changed()

    # ------------------------------------------------------------------ connections
    def close_connection(self, session: Session, reason: str) -> None:
        """Close a client connection with 320 CONNECTION_FORCED and ``reason``."""
        broker = self._broker
        broker.close_session(session, 320, reason)

    # ------------------------------------------------------------------ users, permissions
    def users(self) -> list[User]:
        return sorted(self._broker.auth.users.values(), key=lambda u: u.name)

    def user(self, name: str) -> User | None:
        return self._broker.auth.users.get(name)

    def put_user(self, name: str, *, tags: list[str], password: str | None = None,
                 password_hash: str | None = None,
                 algorithm: str = HASHING_SHA256) -> bool:
        """Create or replace a user; True if it was created."""
        auth = self._broker.auth
        existed = name in auth.users
        auth.add_user(name, password, tags, password_hash=password_hash, algorithm=algorithm)
        return not existed

    def delete_user(self, name: str) -> bool:
        return self._broker.auth.delete_user(name)

    def permissions(self) -> list[tuple[str, str, Permission]]:
        """(user, vhost, permission), sorted."""
        return [(u, v, p) for (u, v), p in sorted(self._broker.auth.permissions.items())]

    def permission(self, user: str, vhost: str) -> Permission | None:
        return self._broker.auth.permissions.get((user, vhost))

    def set_permissions(self, user: str, vhost: str, configure: str, write: str,
                        read: str) -> bool:
        """True if the user had no permissions in the vhost before. 404 NOT_FOUND for an
        unknown user or vhost, 406 PRECONDITION_FAILED for a pattern that is not a
        regular expression."""
        self._permission_target(user, vhost)
        _check_patterns(configure=configure, write=write, read=read)
        auth = self._broker.auth
        existed = (user, vhost) in auth.permissions
        auth.set_permissions(user, vhost, configure, write, read)
        return not existed

    def _permission_target(self, user: str, vhost: str) -> None:
        if user not in self._broker.auth.users:
            raise NotFound(f"no user '{user}'")
        self.vhost(vhost)

    def clear_permissions(self, user: str, vhost: str) -> bool:
        auth = self._broker.auth
        if (user, vhost) not in auth.permissions:
            return False
        auth.clear_permissions(user, vhost)
        return True

    def can_access_vhost(self, user: str, vhost: str) -> bool:
        return self._broker.auth.can_access_vhost(user, vhost)

    def authenticate(self, username: str, password: str,
                     peer_is_loopback: bool) -> User | None:
        return self._broker.auth.authenticate(username, password, peer_is_loopback)

    def is_loopback_only(self, user: str) -> bool:
        """True if ``user`` may connect from localhost only (``loopback_users``)."""
        return user in self._broker.auth.loopback_users

    def check_permission(self, user: str, vhost: str, kind: str, resource_type: str,
                         name: str) -> None:
        """403 ACCESS_REFUSED unless ``user`` may ``kind`` the resource."""
        self._broker.auth.check(user, vhost, kind, resource_type, name)

    def check_topic_permission(self, user: str, vhost: VHost | str, exchange: str,
                               routing_key: str, permission: str) -> None:
        """403 ACCESS_REFUSED (RabbitMQ's text) unless ``user``'s topic permission
        ``permission`` ("write": publish, "read": bind/unbind) allows ``routing_key`` on
        ``exchange``; only topic exchanges are checked, and a missing exchange passes
        (the operation itself then answers 404), as in RabbitMQ."""
        vh = self.vhost(vhost)
        entries = self._broker.parameters.topic_permissions
        if not entries:
            return
        ex = vh.exchanges.get(exchange)
        if ex is not None and ex.type_name == "topic":
            topic_auth.check(entries, user, vh.name, exchange, routing_key, permission)

    # ------------------------------------------------------------------ policies
    def set_policy(self, vhost: str, name: str, pattern: Any, definition: Any, *,
                   priority: Any = 0, apply_to: Any = "all") -> None:
        """406 on an invalid policy (RabbitMQ's validation)."""
        self._broker.policies.set(vhost, name, pattern, definition, priority=priority,
                                  apply_to=apply_to)

    def clear_policy(self, vhost: str, name: str) -> None:
        self._broker.policies.clear(vhost, name)

    def policy(self, vhost: str, name: str) -> dict[str, Any] | None:
        return self._broker.policies.get(vhost, name)

    def policies(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return self._broker.policies.list(vhost)

    # ------------------------------------------------------------------ operator policies
    def operator_policies(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return self._broker.operator_policies.list(vhost)

    def operator_policy(self, vhost: str, name: str) -> dict[str, Any] | None:
        return self._broker.operator_policies.get(vhost, name)

    def set_operator_policy(self, vhost: str, name: str, pattern: Any, definition: Any, *,
                            priority: Any = 0, apply_to: Any = "all") -> None:
        """406 on an invalid operator policy (only the keys that cap queue limits)."""
        self._broker.operator_policies.set(vhost, name, pattern, definition,
                                           priority=priority, apply_to=apply_to)

    def clear_operator_policy(self, vhost: str, name: str) -> None:
        self._broker.operator_policies.clear(vhost, name)

    def effective_policy(self, q: QueueType) -> tuple[str | None, dict[str, Any]]:
        """The name of the operator policy applying to ``q`` (None if none) and the
        definition in force: the policy's, lowered to the operator policy's caps."""
        operator = self._broker.operator_policies.match(q.vhost.name, "queues", q.name)
        return (operator.name if operator is not None else None,
                effective_definition(q.policy,
                                     operator.definition if operator is not None else None))

    # ------------------------------------------------------------------ limits
    def vhost_limits(self, vhost: str) -> dict[str, int]:
        """A vhost's limits (``max-connections``, ``max-queues``); {} when none."""
        return dict(resource_limits.vhost_limits(self._broker, vhost))

    def set_vhost_limit(self, vhost: str, name: str, value: Any) -> None:
        """ValueError (RabbitMQ's words) for an unknown limit or a non-integer value;
        404 NOT_FOUND for an unknown vhost."""
        self.vhost(vhost)
        checked = resource_limits.validate({name: value}, resource_limits.VHOST_LIMITS)
        limits = self.vhost_limits(vhost)
        limits.update(checked)
        self._broker.parameters.set(resource_limits.COMPONENT, vhost, "limits", limits)

    def clear_vhost_limit(self, vhost: str, name: str) -> bool:
        """False if the vhost had no such limit."""
        limits = self.vhost_limits(vhost)
        if name not in limits:
            return False
        del limits[name]
        if limits:
            self._broker.parameters.set(resource_limits.COMPONENT, vhost, "limits", limits)
        else:
            self._broker.parameters.clear(resource_limits.COMPONENT, vhost, "limits")
        return True

    def user_limits(self) -> dict[str, dict[str, int]]:
        """Every user's limits (``max-connections``, ``max-channels``), by user."""
        return {u: dict(v) for u, v in self._broker.parameters.user_limits.items()}

    def set_user_limit(self, user: str, name: str, value: Any) -> None:
        """ValueError (RabbitMQ's words) for an unknown limit or a non-integer value;
        404 NOT_FOUND for an unknown user."""
        if user not in self._broker.auth.users:
            raise NotFound(f"no user '{user}'")
        checked = resource_limits.validate({name: value}, resource_limits.USER_LIMITS)
        self._broker.parameters.user_limits.setdefault(user, {}).update(checked)
        self._broker.definitions_changed()

    def clear_user_limit(self, user: str, name: str) -> bool:
        """False if the user had no such limit."""
        all_limits = self._broker.parameters.user_limits
        limits = all_limits.get(user, {})
        if name not in limits:
            return False
        del limits[name]
        if not limits:
            all_limits.pop(user, None)
        self._broker.definitions_changed()
        return True

    # ------------------------------------------------------------------ topic permissions
    def topic_permissions(self, user: str | None = None,
                          vhost: str | None = None) -> list[dict[str, Any]]:
        """Topic permission entries (RabbitMQ's shape), all or one user's / vhost's."""
        return [dict(e) for e in self._broker.parameters.topic_permissions
                if (user is None or e.get("user") == user)
                and (vhost is None or e.get("vhost") == vhost)]

    def put_topic_permission(self, user: str, vhost: str, exchange: str, write: str,
                             read: str) -> bool:
        """Set one exchange's topic permission for (user, vhost), enforced at once;
        True if it replaced one. 404 and 406 as :meth:`set_permissions`."""
        self._permission_target(user, vhost)
        _check_patterns(write=write, read=read)
        broker = self._broker
        existed = topic_auth.put(broker.parameters.topic_permissions, user, vhost,
                                 exchange, write, read)
        broker.auth.version += 1  # sessions drop their cached checks
        broker.definitions_changed()
        return existed

    def clear_topic_permissions(self, user: str, vhost: str,
                                exchange: str | None = None) -> int:
        """Remove the user's topic permissions in the vhost (one exchange's, or all);
        how many went."""
        broker = self._broker
        gone = topic_auth.remove(broker.parameters.topic_permissions, user, vhost, exchange)
        if gone:
            broker.auth.version += 1
            broker.definitions_changed()
        return gone

    # ------------------------------------------------------------------ parameters
    @property
    def parameters(self) -> ParameterStore:
        """Runtime parameters (components register validators here); every change
        through it is saved."""
        return self._broker.parameters

    # ------------------------------------------------------------------ definitions
    def export_definitions(self, vhost: str | None = None) -> dict[str, Any]:
        data = export_definitions(self._broker, vhost)
        cluster = self._broker.cluster
        if cluster is not None:  # the whole cluster's topology, whichever node leads it
            data = cluster.complete_export(data, vhost)
        return data

    def import_definitions(self, data: Any, vhost: str | None = None) -> None:
        """Raises :class:`DefinitionsError` (HTTP 400) on a bad document."""
        import_definitions(self._broker, data, vhost)


def _check_patterns(**patterns: str) -> None:
    """406 unless every permission pattern compiles (what HTTP has always answered 400)."""
    for name, text in patterns.items():
        try:
            re.compile(text)
        except re.error as exc:
            raise PreconditionFailed(f"{name}: invalid regular expression: {exc}") from None


def _by_queue(fetched: list[Fetched]) -> dict[QueueType, list[QueueEntry]]:
    out: dict[QueueType, list[QueueEntry]] = {}
    for f in fetched:
        out.setdefault(f.queue, []).append(f.entry)
    return out


__all__ = [
    "DEFINITION_KINDS",
    "EXCHANGE_TYPES",
    "HASHING_SHA256",
    "PROPERTY_NAMES",
    "QUEUE_TYPES",
    "REPLY_PREFIX",
    "AMQPError",
    "AccessRefused",
    "Binding",
    "BrokerAPI",
    "ClusterPort",
    "ClusterStatus",
    "Consumer",
    "DefinitionsError",
    "Destination",
    "Exchange",
    "Fetched",
    "Message",
    "NodeStatus",
    "NotFound",
    "NotImplemented_",
    "ParameterStore",
    "Permission",
    "PreconditionFailed",
    "Queue",
    "QueueType",
    "QuorumMembership",
    "ResourceLocked",
    "UnknownComponent",
    "User",
    "VHost",
    "WarrenStatus",
    "args_key",
    "codec",
    "generate_name",
    "hash_password",
    "queue_type_name",
    "register_exchange_type",
    "register_policy_key",
    "register_queue_type",
    "reply_inbox",
    "wire",
]
