"""Quorum queue consumers across a leader's loss (issue 16), three amqpd nodes and etcd.

The scenario of ``test_rabbitmq_cluster_reference.py``'s three-node RabbitMQ 3.10.8 run
(docs/clustering.md, "Quorum queue consumers when the leader's node is killed"), on
amqpd: two quorum queues declared on node-a (which leads them) get 50 confirmed
persistent messages each (``m-00`` ... ``m-49``). Queue FAR is consumed from node-b,
then node-c; queue NEAR from node-a, then node-b; each consumer with prefetch 10 and no
acks, so each holds ten. node-a is killed with kill -9. What RabbitMQ does, and what is
asserted here:

* the consumers on the survivors get nothing in the seconds after the kill (no cancel,
  no redelivery);
* a survivor that acks its ten with the old delivery tags (``multiple``) settles them:
  the next ones follow, never redelivered, without ``x-delivery-count``, and the held
  ones never come again;
* what the lost node's consumer held comes back first: redelivered, with
  ``x-delivery-count`` 1, ahead of every message never delivered;
* in the end every message was consumed exactly once (the lost consumer's ten twice,
  the second time redelivered), none lost, and both queues are empty.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands

from tests.integration._http import q
from tests.integration.cluster_support import ClusterNode, three_nodes, wait_for
from tests.integration.test_rabbitmq_cluster_reference import Raw, collect, qq_consumer
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]

FAR, NEAR = "qco-consumers-elsewhere", "qco-consumer-on-leader"
COUNT = 50  # messages per queue; each consumer holds QQ_PREFETCH (10) of them


@dataclass
class Endpoint:
    """A node as the reference test's raw client reaches it."""

    amqp_port: int


def endpoint(node: ClusterNode) -> Endpoint:
    port = urllib.parse.urlsplit(node.url).port
    assert port is not None
    return Endpoint(port)


@pytest.fixture
def tolerant_nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """Three nodes whose failure detectors a scheduling stall under load does not reach
    (test_cluster_quorum.py's reasons): heartbeats 5 s, leases 10 s."""
    with three_nodes(tmp_path, etcd.url, {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "5"},
                     lease_ttl=10.0) as started:
        yield started


def queue_info(node: ClusterNode, name: str) -> dict[str, Any]:
    r = node.api.get(f"/api/queues/%2F/{q(name)}")
    return r.json() if r.status == 200 else {}


def diagnose(nodes: list[ClusterNode]) -> str:
    out = []
    for n in nodes:
        assert n.proc is not None
        lines = n.proc.log_path.read_text(errors="replace").splitlines()
        out.append(f"--- {n.name}")
        out += [ln for ln in lines if "amqpd.cluster" in ln or "Traceback" in ln
                or "Error" in ln][-40:]
    return "\n".join(out)


def names(first: int, last: int) -> list[str]:
    return [f"m-{i:02d}" for i in range(first, last + 1)]


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e.get("body", e.get("event", "?")) for e in events]


def declare_and_fill(node: ClusterNode) -> None:
    setup = Raw(endpoint(node))
    try:
        ch = setup.channel()
        setup.call(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
        for name in (FAR, NEAR):
            ok = setup.call(ch, commands.Queue.Declare(
                queue=name, durable=True, arguments={"x-queue-type": "quorum"}),
                commands.Queue.DeclareOk)
            assert isinstance(ok, commands.Queue.DeclareOk), ok
            for i in range(COUNT):
                setup.publish(ch, name, b"m-%02d" % i)
                assert setup.confirm_outcome(ch) == ["Basic.Ack"]
    finally:
        setup.close()


def drain(c: Raw, ch: int, last: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ack what came last (multiple) and take what follows, until nothing more does."""
    rest: list[dict[str, Any]] = []
    got = last
    for _ in range(COUNT // 10 + 2):
        if not got or "tag" not in got[-1]:
            break
        c.send(ch, commands.Basic.Ack(delivery_tag=got[-1]["tag"], multiple=True))
        got = collect(c, 2)
        rest += got
    return rest


def test_lost_nodes_deliveries_come_back_first_and_survivors_keep_theirs(
        tolerant_nodes: list[ClusterNode]) -> None:
    nodes = tolerant_nodes
    a, b, c = nodes
    declare_and_fill(a)
    everyone = sorted(n.name for n in nodes)
    wait_for(lambda: all(sorted(queue_info(n, name).get("online", [])) == everyone
                         and queue_info(n, name).get("leader") == a.name
                         for n in nodes for name in (FAR, NEAR)), 30,
             "both groups shown on every node", lambda: diagnose(nodes))
    consumers = {"far_on_b": qq_consumer(endpoint(b), FAR),
                 "far_on_c": qq_consumer(endpoint(c), FAR),
                 "near_on_a": qq_consumer(endpoint(a), NEAR),
                 "near_on_b": qq_consumer(endpoint(b), NEAR)}
    try:
        before = {k: bodies(v[2]) for k, v in consumers.items()}
        assert before == {"far_on_b": names(0, 9), "far_on_c": names(10, 19),
                          "near_on_a": names(0, 9), "near_on_b": names(10, 19)}, before
        a.kill()
        survivors = {k: v for k, v in consumers.items() if k != "near_on_a"}
        wait_for(lambda: all(queue_info(n, name).get("leader") in (b.name, c.name)
                             for n in (b, c) for name in (FAR, NEAR)), 60,
                 "a new leader for both queues, seen by both survivors",
                 lambda: diagnose(nodes))
        after_kill = {k: collect(cl, 2) for k, (cl, _ch, _held) in survivors.items()}
        # nothing at all: no cancel, no redelivery (the held windows are full)
        assert after_kill == {k: [] for k in survivors}, after_kill
        leaders = {name: queue_info(b, name)["leader"] for name in (FAR, NEAR)}
        print(f"elected: {leaders}")

        # the survivors ack their ten by the old tags: settled; the next ones follow
        after_ack = {}
        for k in ("far_on_b", "far_on_c", "near_on_b"):
            cl, ch, held = survivors[k]
            cl.send(ch, commands.Basic.Ack(delivery_tag=held[-1]["tag"], multiple=True))
            after_ack[k] = collect(cl, 3)
        assert bodies(after_ack["far_on_b"]) == names(20, 29), (after_ack, diagnose(nodes))
        assert bodies(after_ack["far_on_c"]) == names(30, 39), after_ack
        for k in ("far_on_b", "far_on_c"):
            assert [e["tag"] for e in after_ack[k]] == list(range(11, 21)), after_ack[k]
            assert not any(e["redelivered"] or e["count"] is not None
                           for e in after_ack[k]), after_ack[k]
        # the lost node's consumer's ten come back first, counted once more
        back = after_ack["near_on_b"]
        assert bodies(back) == names(0, 9), (bodies(back), diagnose(nodes))
        assert all(e["redelivered"] and e["count"] == 1 for e in back), back

        # then everything left, each message once, never one of the held ones again
        rest = {k: drain(cl, ch, after_ack[k]) for k, (cl, ch, _held) in survivors.items()}
        assert sorted(bodies(rest["far_on_b"]) + bodies(rest["far_on_c"])) == names(40, 49), rest
        assert bodies(rest["near_on_b"]) == names(20, 49), rest["near_on_b"]
        for k in survivors:
            assert not any(e.get("redelivered") for e in rest[k]), rest[k]
        check = Raw(endpoint(b))
        try:
            ch = check.channel()
            # empty; the consumers still attached counted (RabbitMQ 3.10.8 also still
            # counted the lost node's: 2 for NEAR, docs/clustering.md)
            for name, consumers_left in ((FAR, 2), (NEAR, 1)):
                ok = check.call(ch, commands.Queue.Declare(queue=name, passive=True),
                                commands.Queue.DeclareOk)
                assert isinstance(ok, commands.Queue.DeclareOk), ok
                assert (ok.message_count, ok.consumer_count) == (0, consumers_left), \
                    (name, ok)
        finally:
            check.close()
    finally:
        for cl, _ch, _held in consumers.values():
            cl.close()
