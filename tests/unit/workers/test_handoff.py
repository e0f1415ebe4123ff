"""Handing accepted sockets to workers: round robin over the workers that serve, the
socket arriving whole on the other side."""

from __future__ import annotations

import socket
from pathlib import Path

from amqpd.config import load_settings
from amqpd.workers import handoff
from amqpd.workers.supervisor import Supervisor


def _supervisor(tmp_path: Path, n: int) -> tuple[Supervisor, list[socket.socket]]:
    settings = load_settings(None, {"workers": n, "data_dir": str(tmp_path)}, environ={})
    sup = Supervisor(settings, [], None)
    theirs = []
    for w in sup.workers:
        ours, other = handoff.pair()
        other.setblocking(False)
        w.control = ours
        w.ready = {"pid": 0}
        theirs.append(other)
    return sup, theirs


def _received(sock: socket.socket) -> list[tuple[bytes, list[socket.socket]]]:
    return [(kind, socks) for kind, _payload, socks in handoff.receive(sock)]


def test_round_robin_over_serving_workers_and_the_socket_arrives(tmp_path: Path) -> None:
    sup, theirs = _supervisor(tmp_path, 3)
    sup.workers[1].ready = None  # not serving (restarting): skipped
    pairs = [socket.socketpair() for _ in range(4)]
    for _client, server in pairs:
        sup._hand(server, handoff.ACCEPTED_AMQP)
        server.close()  # as the supervisor does once handed over
    got = [_received(s) for s in theirs]
    assert [len(g) for g in got] == [2, 0, 2]
    # the handed socket is the connection itself: bytes reach the client
    kind, (sock,) = got[2][0]
    assert kind == handoff.ACCEPTED_AMQP
    sock.sendall(b"AMQP")
    assert pairs[1][0].recv(4) == b"AMQP"
    for g in got:
        for _kind, socks in g:
            for s in socks:
                s.close()
    for client, _server in pairs:
        client.close()


def test_a_worker_whose_end_is_gone_is_passed_over(tmp_path: Path) -> None:
    sup, theirs = _supervisor(tmp_path, 2)
    theirs[0].close()  # worker 0 died; its death not yet reaped
    client, server = socket.socketpair()
    sup._hand(server, handoff.ACCEPTED_AMQP)
    (kind, (sock,)), = _received(theirs[1])
    assert kind == handoff.ACCEPTED_AMQP and sup.workers[1].handed == 1
    sock.close()
    server.close()
    client.close()


def test_receive_reports_the_other_end_closing() -> None:
    ours, theirs = handoff.pair()
    theirs.setblocking(False)
    handoff.send_ready(ours, {"pid": 7})
    ours.close()
    kinds = [(k, p) for k, p, _s in handoff.receive(theirs)]
    assert kinds == [(handoff.READY, b'{"pid": 7}'), (b"", b"")]
    theirs.close()
