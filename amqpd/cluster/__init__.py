"""The cluster (issue 15): several amqpd nodes that clients use as one broker.

Started by ``amqpd.server.serve`` when ``cluster.name`` is set; on a single node nothing
here is imported. Operator guide: docs/clustering.md. The interface others code against
(also written down in docs/ARCHITECTURE.md):

* ``broker.cluster`` / ``BrokerAPI.cluster()``: :class:`amqpd.cluster.node.Cluster`, a
  :class:`amqpd.cluster.view.ClusterView`: ``node_name``, ``nodes() -> {name: NodeInfo}``,
  ``is_running(node)``, ``subscribe(callback(node, running))``, ``serving()``,
  ``queue_leader(vhost, name)``, ``catalogue``, ``link_address`` (set by the link
  listener, then ``await publish_record()``), ``cookie`` (bytes), ``config``
  (:class:`amqpd.config.ClusterConfig`).
* ``membership.py``: etcd keys ``members/``, ``nodes/``, ``meta/``; the lease.
* ``heartbeat.py``: UDP heartbeats (asyncio-dgram).
* ``definitions.py``: every durable definition mirrored through etcd, applied in
  revision order on every node; calls ``amqpd.cluster.remote_queue.materialise`` (the
  inter-node links) for queues led by another node, when that module exists.
* ``link_wire.py``, ``link.py``: the inter-node links (one authenticated, multiplexed TCP
  connection per node pair, credit-based flow control).
* ``remote_queue.py``: queues led by another node (``RemoteQueue``, the leader's side of
  its streams, leader locators, node loss); ``start(...)`` from ``serve``.
* ``mirror.py``, ``mirror_state.py``, ``mirror_wire.py``: mirrored classic queues
  (issue 16: ``ha-mode`` policies, replication, failover); ``start(...)`` from
  ``serve``, reachable as ``cluster.mirrors``.
* ``quorum_group.py``, ``quorum_state.py``: quorum queues' replica groups (issue 16:
  members, majority commit, terms and elections, membership edits); ``start(...)``
  from ``serve`` after the mirrors, reachable as ``cluster.quorum_groups``.
"""
