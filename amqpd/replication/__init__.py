"""The warren's data path: log shipping from an active to its standbys.

Agreed interface (issue 14; the etcd election, fencing policy and HAProxy health build
on it and call only what is listed here):

``amqpd.config.ReplicationConfig``  the ``[replication]`` section (None: single node)

``source.ReplicationSource(store, config, history, epoch)``  runs on the active
    ``await start()`` / ``await stop()``; ``standbys() -> list[StandbyState]`` (name,
    address, acked_seq, lag_records, lag_bytes, lag_seconds, in_sync);
    ``insync_count() -> int``; ``port`` (the bound replication listener);
    ``gate`` (``gate.SyncGate``: synchronous confirms, ``None`` in mode "async")

``follower.ReplicationFollower(log_dir, config, history)``  runs on a standby
    ``start(active_addr)`` / ``await stop()`` (everything received is fsync'd on
    return); ``last_seq`` (durable here), ``epoch``, ``connected``, ``lag`` (seconds),
    ``lag_records``, ``active_seq``

``epochs.EpochHistory(log_dir)``  ``[(epoch, first_seq)]`` in ``<data_dir>/log/epochs``;
    ``last_epoch``; ``epochs.decide(...)`` is the (epoch, seq) truncation rule;
    ``SharedLog.truncate_after(seq)`` / ``store.tail.truncate_after(dir, seq)`` cut

``roles.RoleHooks(broker)``  ``broker.roles`` when replication is configured
    ``await start_as_active(epoch)``, ``await start_as_standby(active_replication_addr,
    epoch)``, ``await promote(epoch=None) -> epoch``, ``await demote_and_follow(
    active_addr, epoch)``, ``await fence()``, ``status() -> dict`` (what
    ``GET /api/replication`` shows); ``role`` is "starting" | "active" | "standby" |
    "fenced"; ``source`` / ``follower`` are the running halves. With ``role = "auto"``
    ``start()`` only opens the HTTP API and leaves the role to the election, which calls
    ``await take_over(epoch)``, ``await follow(active_addr, epoch)``, ``log_end()``,
    ``await open_door()`` / ``close_door()`` (amqpd/coord/warren.py: cluster code, which
    reaches the broker only through these hooks and ``amqpd.broker.api``).

Why a byte-for-byte copy: positions, sequence numbers and checkpoints then mean the
same on every node, so promotion is plain recovery (nothing replication-specific can
be forgotten), and mirrored queues can later ship ranges of the same log.
"""
