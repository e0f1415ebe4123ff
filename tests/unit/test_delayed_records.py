"""The delayed exchange's log records (broker/exchanges/delayed.py), no sockets.

A held persistent message is written as the publish pipeline writes one for a durable
queue (ENQUEUE_META, broker/persist.py) with the hold's due time as the record's
expiry; recovery takes the due time from the index (stamps/extra), and from the
exchange field only for a record written before (``"<exchange>\\x00<due_ms>"``).
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import pytest

from amqpd.broker.api import BrokerAPI, Message, codec
from amqpd.broker.exchanges.delayed import DelayedMessageExchange, recover, store_key
from amqpd.config import Settings
from amqpd.server import Broker
from amqpd.store.api import RecoveredQueue, StoredMessage


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    return Broker(Settings(data_dir=str(tmp_path), persistence=False))


def _exchange(api: BrokerAPI, durable: bool = True) -> DelayedMessageExchange:
    ex = api.declare_exchange("/", "d", "x-delayed-message", durable=durable,
                              arguments={"x-delayed-type": "direct"})
    assert isinstance(ex, DelayedMessageExchange)
    return ex


def _publish(api: BrokerAPI, delay: int, **props: Any) -> None:
    props["headers"] = {"x-delay": delay}
    api.publish("/", "d", Message("d", "k", codec.encode_properties(props), b"body"), None)


def test_a_held_persistent_message_is_an_enqueue_meta_record_due_as_its_expiry(
        broker: Broker) -> None:
    api = broker.api
    ex = _exchange(api)
    _publish(api, 5000, delivery_mode=2, expiration="60000", priority=3)
    [(_due, _seq, position, kept)] = ex._heap
    assert kept is None and position >= 0  # the log has it, the heap keeps its position
    record = broker.store.read(position)
    assert record.published > 0
    assert record.expires == record.published + 5000  # the hold's end, not the message's
    assert record.priority == 3 and not record.transient
    assert record.exchange == "d"


# (what is held, is it written?)
NOT_WRITTEN: list[tuple[str, bool, dict[str, Any]]] = [
    ("transient message", True, {}),
    ("non-durable exchange", False, {"delivery_mode": 2}),
]


@pytest.mark.parametrize(("durable", "props"), [(d, p) for _n, d, p in NOT_WRITTEN],
                         ids=[n for n, *_ in NOT_WRITTEN])
def test_what_the_log_does_not_hold(broker: Broker, durable: bool,
                                    props: dict[str, Any]) -> None:
    ex = _exchange(broker.api, durable)
    _publish(broker.api, 5000, **props)
    [(_due, _seq, position, kept)] = ex._heap
    assert position == -1 and kept is not None


# (record as the log holds it: (stamp, extra, stored exchange field), due time recovered)
RECORDS: list[tuple[str, int, int, str, int]] = [
    ("ENQUEUE_META: due from the index", 1_000 << 1, 7_000 << 8 | 4, "d", 7_000),
    ("ENQUEUE_META, transient bit", 1_000 << 1 | 1, 9_000 << 8, "d", 9_000),
    ("record from before: due from the exchange field", 0, 0, "d\x008000", 8_000),
    ("record from before, unreadable due: at once", 0, 0, "d\x00soon", 0),
]


@pytest.mark.parametrize(("stamp", "extra", "field", "due"),
                         [(s, e, f, d) for _n, s, e, f, d in RECORDS],
                         ids=[n for n, *_ in RECORDS])
def test_recovery_reads_the_due_time(broker: Broker, monkeypatch: pytest.MonkeyPatch,
                                     stamp: int, extra: int, field: str, due: int) -> None:
    ex = _exchange(broker.api)
    position = broker.store.append_enqueue(
        [ex.key], StoredMessage(field, "k", codec.encode_properties({}), b"x"))
    restored: list[tuple[int, int]] = []
    monkeypatch.setattr(ex, "restore", lambda p, d: restored.append((p, d)))
    rq = RecoveredQueue(positions=array("q", [position]), sizes=array("q", [1]),
                        stamps=array("q", [stamp]), extra=array("q", [extra]))
    assert recover(broker, store_key("/", "d"), rq)
    assert restored == [(position, due)]


def test_recovery_of_a_key_that_is_not_a_delayed_exchange(broker: Broker) -> None:
    assert not recover(broker, "/\x00some-queue", RecoveredQueue())
