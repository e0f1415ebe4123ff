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
* ``membership.py``: etcd keys ``members/``, ``nodes/``, ``meta/``; the lease (renewed
  from a thread, amqpd/coord/lease.py).
* ``heartbeat.py``: UDP heartbeats (asyncio-dgram).
* ``definitions.py``: every durable definition mirrored through etcd, applied in
  revision order on every node; calls ``ClusterQueues.materialise`` (the
  inter-node links) for queues led by another node, when the view has links.
* What the parts below share: ``node_part.py`` (``NodePart``: what the mirrored, quorum
  and stream parts hold of the node), ``periodic.py`` (a step every few seconds, tasks
  kept and cancelled), ``leased_push.py`` (keys a node keeps under its lease:
  ``transient.py``, ``node_info.py``), ``prefix_watch.py`` (read an etcd prefix, then
  watch it, again after each end: ``transient.py``, ``node_requests.py``).
* ``link_wire.py``, ``link.py``: the inter-node links (one authenticated, multiplexed TCP
  connection per node pair, credit-based flow control); ``link_records.py`` (compiled):
  the batches' records read as the broker's Messages and QueueEntries, and the loops
  over them.
* ``cluster_queues.py``: ``ClusterQueues`` (the links, leader locators, node loss, the
  streams other nodes open here: ``remote_served.py``); ``start(...)`` from ``serve``.
  ``remote_queue.py`` (with ``remote_state.py``, ``remote_consume.py``,
  ``remote_failover.py``): ``RemoteQueue``, a queue led by another node.
* ``mirror.py``: mirrored classic queues (issue 16: ``ha-mode`` policies, replication,
  failover); ``start(...)`` from ``serve``, reachable as ``cluster.mirrors``
  (the HTTP API asks ``ClusterStatus.request_mirror_sync``). Its parts:
  ``mirror_store.py`` (the store wrapper), ``mirror_leading.py`` (the leader's streams
  and catch-up), ``mirror_copy.py`` (a mirror's copy), ``mirror_frames.py`` (the link
  protocol), ``mirror_adopt.py`` (copies kept across a restart), ``mirror_failover.py``
  (promotion); ``mirror_state.py`` and ``mirror_wire.py`` sans-IO.
* ``election.py``: the one election round of both replica kinds (a ``Ballot`` each);
  ``takeover_txn.py``: the winner's etcd transaction, a lost answer read back.
* ``quorum_group.py``: quorum queues' replica groups (issue 16: members, majority
  commit, terms and elections, membership edits); ``start(...)`` from ``serve`` after
  the mirrors, reachable as ``cluster.quorum_groups`` (the HTTP API's
  ``ClusterStatus.quorum_membership()``). Its parts: ``quorum_leading.py``
  (the leader, checkouts), ``quorum_failover.py`` (the election's ballot, promotion),
  ``quorum_voter.py`` (a member without a copy votes);
  ``quorum_state.py`` sans-IO; ``group_records.py`` (the group records in etcd) and
  ``group_walk.py`` (the reconciliation's walk over the queues a group leads), shared
  with the streams.
* ``stream_group.py``: replicated streams (issue 30: members, majority commit of the
  leader's offsets, elections with the quorum ballot, add/delete_replica); ``start(...)``
  from ``serve`` after the quorum groups, reachable as ``cluster.stream_groups``. Its
  parts: ``stream_leading.py`` (the leader: shipping, the commit gate),
  ``stream_replica.py`` (a member's copy, epochs), ``stream_copies.py`` (a member's
  side of the frames: its copies of streams led elsewhere), ``stream_local.py`` (this
  node's consumers reading its copy up to the commit point), ``stream_wire.py`` (frames
  110-116).
"""
