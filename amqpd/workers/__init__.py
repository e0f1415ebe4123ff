"""Several worker processes behind one node (issue 35, docs/workers.md).

* ``supervisor.py``: the ``amqpd`` process when ``workers`` > 1: owns the node's AMQP
  and HTTP ports, starts and restarts the workers, hands them connections;
* ``handoff.py``: accepted sockets passed over a unix socket pair (``SCM_RIGHTS``);
* ``worker.py``: one worker: ``server.serve()`` over worker settings, adopting the
  connections the supervisor hands it;
* ``kvstate.py`` / ``localkv.py``: the node-local coordination store the workers'
  cluster layer uses in place of etcd.

Nothing here is imported with ``workers = 1``.
"""
