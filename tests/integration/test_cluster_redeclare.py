"""Delete a queue on one node and declare it again at once on another (issue 28).

Each try declares a queue (classic, quorum, or classic under an ``ha-mode: all``
policy) on one node and binds it, deletes it on a second node and, right after the
delete-ok, declares and binds it again on a third: the declaring node's view may not
have seen the delete yet. Before the fix the re-declare answered ``404 home node ...
is down`` (the node still held the deleted remote queue), or declare-ok for a queue
the delete then removed from every node, leaving the new binding in etcd to a missing
queue. After 100 tries every node's ``/api/queues`` and ``/api/bindings`` must agree:
each queue exists once, with exactly the binding of its last declare.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from bench.loadgen import Conn
from tests.integration.cluster_support import ClusterNode, diagnose, wait_for
from tests.support import etcdproc

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(600),
]

TRIES = 100
KINDS = ("classic", "quorum", "mirrored")
EXCHANGE = "redeclare.x"


def _arguments(kind: str) -> dict[str, Any]:
    return {"x-queue-type": "quorum"} if kind == "quorum" else {}


def _view(node: ClusterNode, prefix: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The queues named ``prefix*`` and their bindings from EXCHANGE, as ``node`` lists
    them."""
    queues = sorted(q["name"] for q in node.api.get("/api/queues/%2F").json()
                    if q["name"].startswith(prefix))
    bindings = sorted((b["source"], b["destination"], b["routing_key"])
                      for b in node.api.get("/api/bindings/%2F").json()
                      if b["destination"].startswith(prefix) and b["source"] == EXCHANGE)
    return queues, bindings


def _wait_agreed(nodes: list[ClusterNode], prefix: str,
                 expected: tuple[list[str], list[tuple[str, str, str]]]) -> None:
    """Every node lists the queues ``prefix*`` and their bindings as ``expected``."""
    views: dict[str, Any] = {}

    def agree() -> bool:
        for n in nodes:
            views[n.name] = _view(n, prefix)
        return all(v == expected for v in views.values())

    wait_for(agree, 30, "every node lists each queue once with its last binding",
             lambda: f"expected {expected}\nviews {views}\n{diagnose(nodes)}")


def test_delete_and_redeclare_from_another_node(nodes: list[ClusterNode]) -> None:
    rng = random.Random(28)
    r = nodes[0].api.put("/api/policies/%2F/ha-all", {
        "pattern": "^redeclare\\.mirrored\\.", "apply-to": "queues",
        "definition": {"ha-mode": "all"}})
    assert r.status in (201, 204), r.text
    conns = {n.name: Conn(n.url) for n in nodes}
    chans = {name: c.open_channel(1) for name, c in conns.items()}
    first = conns[nodes[0].name]
    first.declare_exchange(chans[nodes[0].name], EXCHANGE, "direct", durable=True)
    wait_for(lambda: all(n.api.get(f"/api/exchanges/%2F/{EXCHANGE}").status == 200
                         for n in nodes), 15, "the exchange on every node")
    expected_queues: list[str] = []
    expected_bindings: list[tuple[str, str, str]] = []
    names = [f"redeclare.{kind}.{i}" for kind in KINDS for i in range(2)]
    declared: dict[str, int] = {}  # a queue's name -> the node index that declared it last
    try:
        for i, name in enumerate(names):
            declared[name] = i % 3
            node = nodes[i % 3]
            conn = conns[node.name]
            conn.declare_queue(chans[node.name], name, durable=True,
                               arguments=_arguments(name.split(".")[1]))
            conn.bind(chans[node.name], name, EXCHANGE, f"k.{name}.0")
        # the first declares reach every node before the tries start
        wait_for(lambda: all(len(_view(n, "redeclare.")[0]) == len(names) for n in nodes),
                 30, "the queues on every node", lambda: diagnose(nodes))
        for attempt in range(1, TRIES + 1):
            name = names[attempt % len(names)]
            deleter, redeclarer = rng.sample(range(3), 2)
            d, rd = nodes[deleter], nodes[redeclarer]
            conns[d.name].delete_queue(chans[d.name], name)
            try:
                conns[rd.name].declare_queue(chans[rd.name], name, durable=True,
                                             arguments=_arguments(name.split(".")[1]))
                conns[rd.name].bind(chans[rd.name], name, EXCHANGE, f"k.{name}.{attempt}")
            except Exception as exc:
                raise AssertionError(
                    f"try {attempt}: {name} deleted on {d.name}, declared again on "
                    f"{rd.name}: {exc}\n{diagnose(nodes)}") from exc
            declared[name] = redeclarer
            expected_bindings = [b for b in expected_bindings if b[1] != name]
            expected_bindings.append((EXCHANGE, name, f"k.{name}.{attempt}"))
        expected_queues = sorted(names)
        last_binding = {b[1]: b for b in expected_bindings}
        for name in names:
            if name not in last_binding:  # not tried again: its first binding
                expected_bindings.append((EXCHANGE, name, f"k.{name}.0"))
        _wait_agreed(nodes, "redeclare.", (expected_queues, sorted(expected_bindings)))
    finally:
        for c in conns.values():
            c.close()


HTTP_TRIES = 30


def test_delete_and_redeclare_through_the_http_api(nodes: list[ClusterNode]) -> None:
    """The same through the management API: ``DELETE /api/queues/...`` on one node, then
    at once ``PUT`` and a binding on another. A queue led by a third node is deleted by
    its leader; the 204 must wait until the delete is recorded cluster-wide, as
    delete-ok does (before, the 204 came at once and a re-declare elsewhere could be
    taken for the old queue and then vanish with it)."""
    rng = random.Random(2828)
    r = nodes[0].api.put("/api/policies/%2F/ha-all-http", {
        "pattern": "^hredeclare\\.mirrored\\.", "apply-to": "queues",
        "definition": {"ha-mode": "all"}})
    assert r.status in (201, 204), r.text
    r = nodes[0].api.put(f"/api/exchanges/%2F/{EXCHANGE}", {"type": "direct", "durable": True})
    assert r.status in (201, 204), r.text
    wait_for(lambda: all(n.api.get(f"/api/exchanges/%2F/{EXCHANGE}").status == 200
                         for n in nodes), 15, "the exchange on every node")
    names = [f"hredeclare.{kind}.{i}" for kind in KINDS for i in range(2)]

    def declare_and_bind(node: ClusterNode, name: str, key: str) -> None:
        r = node.api.put(f"/api/queues/%2F/{name}",
                         {"durable": True, "arguments": _arguments(name.split(".")[1])})
        assert r.status in (201, 204), f"PUT {name} on {node.name}: {r.status} {r.text}"
        r = node.api.post(f"/api/bindings/%2F/e/{EXCHANGE}/q/{name}", {"routing_key": key})
        assert r.status == 201, f"bind {name} on {node.name}: {r.status} {r.text}"

    for i, name in enumerate(names):
        declare_and_bind(nodes[i % 3], name, f"k.{name}.0")
    wait_for(lambda: all(len(_view(n, "hredeclare.")[0]) == len(names) for n in nodes),
             30, "the queues on every node", lambda: diagnose(nodes))
    last_key = {name: f"k.{name}.0" for name in names}
    for attempt in range(1, HTTP_TRIES + 1):
        name = names[attempt % len(names)]
        deleter, redeclarer = rng.sample(range(3), 2)
        d, rd = nodes[deleter], nodes[redeclarer]
        r = d.api.delete(f"/api/queues/%2F/{name}")
        assert r.status == 204, f"try {attempt}: DELETE {name} on {d.name}: {r.status} {r.text}"
        declare_and_bind(rd, name, f"k.{name}.{attempt}")
        last_key[name] = f"k.{name}.{attempt}"
    _wait_agreed(nodes, "hredeclare.",
                 (sorted(names), sorted((EXCHANGE, n, k) for n, k in last_key.items())))
