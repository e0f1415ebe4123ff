"""A broker of each kind for tests that must pass on both: amqpd and a private RabbitMQ
3.10 (skipped, with the reason, where rabbitmq-server is not installed).

Import :func:`both_brokers` into a test module; it yields the AMQP port of a broker
started for that module, once per kind.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from devtools.rabbitmq import RabbitInfo, RabbitMQNotInstalled, find_server, running_rabbitmq
from tests.support.brokerproc import BrokerProcess


@pytest.fixture(scope="module", params=["amqpd", "rabbitmq"])
def both_brokers(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    if request.param == "amqpd":
        proc = BrokerProcess(tmp_path_factory.mktemp("amqpd"))
        proc.start()
        try:
            yield proc.port
        finally:
            proc.stop()
        return
    with private_rabbitmq(tmp_path_factory) as info:
        yield info.amqp_port


@contextmanager
def private_rabbitmq(tmp_path_factory: pytest.TempPathFactory,
                     plugins: Sequence[str] = ()) -> Iterator[RabbitInfo]:
    """A private RabbitMQ node with ``plugins`` for a fixture, or the test skipped with
    the reason where rabbitmq-server is not installed."""
    try:
        find_server()
    except RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))
    with running_rabbitmq(tmp_path_factory.mktemp("rabbitmq"), plugins=plugins) as info:
        yield info


__all__ = ["both_brokers", "private_rabbitmq"]
