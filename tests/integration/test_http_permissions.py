"""AMQP permission checks where RabbitMQ makes them (403 ACCESS_REFUSED), set via the API."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess

Op = Callable[[BlockingChannel, str], object]


@pytest.fixture(scope="module")
def api(broker: BrokerProcess) -> Api:
    api = Api(broker.http_url)
    # objects every case uses, made by the administrator
    api.put("/api/queues/%2F/perm-q", {"durable": False})
    api.put("/api/exchanges/%2F/perm-x", {"type": "direct", "durable": False})
    return api


def connect(api: Api, broker: BrokerProcess, configure: str, write: str,
            read: str) -> pika.BlockingConnection:
    name = "perm-" + uuid.uuid4().hex[:8]
    api.put(f"/api/users/{name}", {"password": "pw", "tags": ""})
    api.put(f"/api/permissions/%2F/{name}", {"configure": configure, "write": write,
                                             "read": read})
    return pika.BlockingConnection(pika.URLParameters(
        f"amqp://{name}:pw@127.0.0.1:{broker.port}/%2F"))


CASES: list[tuple[str, tuple[str, str, str], Op]] = [
    ("queue.declare needs configure", ("^$", ".*", ".*"),
     lambda ch, u: ch.queue_declare("new-" + u)),
    ("queue.declare with a DLX needs write on the DLX", (".*", "^$", ".*"),
     lambda ch, u: ch.queue_declare("dl-" + u, arguments={"x-dead-letter-exchange": "perm-x"})),
    ("queue.declare with a DLX needs read on the queue", (".*", ".*", "^$"),
     lambda ch, u: ch.queue_declare("dl2-" + u,
                                    arguments={"x-dead-letter-exchange": "perm-x"})),
    ("exchange.declare needs configure", ("^$", ".*", ".*"),
     lambda ch, u: ch.exchange_declare("x-" + u, "fanout")),
    ("exchange.declare with an AE needs write on the AE", (".*", "^$", ".*"),
     lambda ch, u: ch.exchange_declare("ae-" + u, "fanout",
                                       arguments={"alternate-exchange": "perm-x"})),
    ("exchange.delete needs configure", ("^$", ".*", ".*"),
     lambda ch, u: ch.exchange_delete("perm-x")),
    ("queue.delete needs configure", ("^$", ".*", ".*"),
     lambda ch, u: ch.queue_delete("perm-q")),
    ("queue.purge needs read", (".*", ".*", "^$"), lambda ch, u: ch.queue_purge("perm-q")),
    ("queue.bind needs write on the queue", (".*", "^$", ".*"),
     lambda ch, u: ch.queue_bind("perm-q", "perm-x", "k")),
    ("queue.bind needs read on the exchange", (".*", ".*", "^$"),
     lambda ch, u: ch.queue_bind("perm-q", "perm-x", "k")),
    ("exchange.bind needs write on the destination", (".*", "^$", ".*"),
     lambda ch, u: ch.exchange_bind("perm-x", "amq.fanout")),
    ("basic.get needs read", (".*", ".*", "^$"), lambda ch, u: ch.basic_get("perm-q")),
    ("basic.consume needs read", (".*", ".*", "^$"),
     lambda ch, u: ch.basic_consume("perm-q", lambda *a: None)),
    ("basic.publish needs write on the exchange", (".*", "^$", ".*"),
     lambda ch, u: (ch.basic_publish("perm-x", "k", b"x"), ch.queue_declare(
         "perm-q", passive=True))),
]


@pytest.mark.parametrize("perms, op", [(p, o) for _, p, o in CASES],
                         ids=[c[0] for c in CASES])
def test_refused_with_403(api: Api, broker: BrokerProcess, perms: tuple[str, str, str],
                          op: Op) -> None:
    conn = connect(api, broker, *perms)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            op(ch, uuid.uuid4().hex[:6])
        assert err.value.reply_code == 403
        assert err.value.reply_text.startswith("ACCESS_REFUSED - ")
    finally:
        conn.close()


def test_full_permissions_allow_everything(api: Api, broker: BrokerProcess) -> None:
    conn = connect(api, broker, ".*", ".*", ".*")
    ch = conn.channel()
    for _, _, op in CASES:
        if op is CASES[5][2] or op is CASES[6][2]:
            continue  # deleting the shared objects would break the other cases
        op(ch, uuid.uuid4().hex[:6])
    conn.close()


def test_http_declares_check_dlx_and_ae_permissions(api: Api) -> None:
    name = "perm-http-" + uuid.uuid4().hex[:6]
    api.put(f"/api/users/{name}", {"password": "pw", "tags": "management"})
    api.put(f"/api/permissions/%2F/{name}", {"configure": ".*", "write": "^$", "read": ".*"})
    user = api.as_user(name, "pw")
    r = user.put(f"/api/queues/%2F/{name}", {"arguments": {"x-dead-letter-exchange": "perm-x"}})
    assert r.status == 403
    r = user.put(f"/api/exchanges/%2F/{name}", {"type": "fanout",
                                                "arguments": {"alternate-exchange": "perm-x"}})
    assert r.status == 403
    assert user.post("/api/exchanges/%2F/perm-x/publish",
                     {"routing_key": "k", "payload": "x"}).status == 403
    assert user.put(f"/api/queues/%2F/{name}", {}).status == 201
