"""Coordination through etcd: the client (``etcd``), leader election and fencing
(``election``), and the warren glue that runs the election beside a broker (``warren``).

etcd is the only place a decision about who leads is made: amqpd never votes by itself.
A single node without a ``[replication]`` section imports none of this.
"""
