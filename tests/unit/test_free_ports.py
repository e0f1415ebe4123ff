"""devtools.rabbitmq.free_ports: ports a stopped-and-restarted server can bind again.

A RabbitMQ node keeps its ports across ``rabbitmqctl stop_app`` / ``start_app`` (the
conformance suite's restart); a port from the kernel's ephemeral range can meanwhile be
handed to someone else's bind(0) or outgoing connection, and CI once saw the node's
management listener fail to start that way. free_ports() therefore picks below that
range."""

from __future__ import annotations

import itertools
import random
import socket

import pytest

from devtools import rabbitmq as rmq


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, _high = rmq._ephemeral_range()
    ports = rmq.free_ports(20)
    assert len(set(ports)) == 20
    if low - rmq._STABLE_LOW >= 1000:
        assert all(rmq._STABLE_LOW <= p < low for p in ports), ports
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first candidates drawn are a port with a listener on it: it is passed over."""
    low, _high = rmq._ephemeral_range()
    if low - rmq._STABLE_LOW < 1000:
        pytest.skip("the ephemeral range leaves no room below it: kernel-chosen ports")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", rmq.free_ports(1)[0]))
        listener.listen(1)
        taken = listener.getsockname()[1]
        draws = [taken, taken]

        class TakenFirst(random.Random):
            def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
                return draws.pop() if draws else super().randrange(start, stop, step)

        monkeypatch.setattr(rmq.secrets, "SystemRandom", TakenFirst)
        (port,) = rmq.free_ports(1)
        assert port != taken
        assert not draws  # both draws of the taken port were made and refused
    finally:
        listener.close()


def test_udp_ports_for_heartbeats() -> None:
    low, _high = rmq._ephemeral_range()
    ports = rmq.free_ports(3, socket.SOCK_DGRAM)
    assert len(set(ports)) == 3
    if low - rmq._STABLE_LOW >= 1000:
        assert all(rmq._STABLE_LOW <= p < low for p in ports), ports
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", port))


def test_xdist_workers_pick_from_slices_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers never choose the same port: a node killed by one worker's test keeps
    its port free for its restart whatever the other workers pick meanwhile."""
    low, _high = rmq._ephemeral_range()
    if low - rmq._STABLE_LOW < 1000:
        pytest.skip("the ephemeral range leaves no room below it: kernel-chosen ports")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for index in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        first, end = rmq._own_slice(rmq._STABLE_LOW, low)
        ports = rmq.free_ports(30)
        assert all(first <= p < end for p in ports), (index, first, end, ports)
        slices.append(range(first, end))
    for a, b in itertools.pairwise(slices):
        assert a.stop <= b.start  # disjoint, in order
    assert slices[0].start == rmq._STABLE_LOW and slices[-1].stop <= low
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert rmq._own_slice(rmq._STABLE_LOW, low) == (rmq._STABLE_LOW, low)
