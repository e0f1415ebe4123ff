"""What a node's part in replicated queues (mirrored queues:
:class:`~amqpd.cluster.mirror.Mirrors`, quorum queues:
:class:`~amqpd.cluster.quorum_group.QuorumGroups`, streams:
:class:`~amqpd.cluster.stream_group.StreamGroups`) holds of the node it runs in, set up
in one place: :class:`NodePart`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, ClusterPort
    from amqpd.cluster.cluster_queues import ClusterQueues
    from amqpd.cluster.node import Cluster
    from amqpd.coord.etcd import EtcdClient


class NodePart:
    """The broker's cluster port, the cluster view, the node's queue links, its name,
    its etcd client and the cluster's etcd root."""

    def __init__(self, api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> None:
        self.broker: ClusterPort = api.cluster_port()
        self.cluster = cluster
        self.queues = queues
        self.node: str = cluster.node_name
        self.etcd: EtcdClient = cluster.etcd
        self.root: str = cluster.root


__all__ = ["NodePart"]
