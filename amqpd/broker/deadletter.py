"""Dead-lettering, as RabbitMQ 3.10's ``rabbit_dead_letter`` does it.

A message leaves a queue for its dead-letter exchange when it is rejected or nacked
without requeue (reason ``rejected``), expires (``expired``) or is pushed out by a length
limit (``maxlen``). The copy that is republished:

* is published to the DLX with the queue's dead-letter routing key if it has one (and then
  loses its ``CC`` header), else with the message's original routing keys (the publish key
  plus any ``CC`` keys);
* loses its ``expiration`` property (kept in the x-death entry as ``original-expiration``);
* carries an ``x-death`` array of tables, one per (queue, reason), most recent first. A
  repeat of the same pair increments that entry's ``count`` and moves it to the front
  (its other fields stay as first written); a new pair is prepended with count 1. Fields:
  count, reason, queue, time (timestamp, seconds), exchange, routing-keys
  [, original-expiration];
* gets ``x-first-death-reason/queue/exchange`` on its first dead-lettering only.
  (``x-last-death-*`` appeared in RabbitMQ 3.13; 3.10 does not write them, nor do we.)

Cycles: a queue is skipped as a destination when the message already died there and
every death since then (that one included) was automatic, i.e. none was ``rejected``
(``rabbit_dead_letter:is_cycle``). Dead-lettering is at-most-once and never confirmed.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from amqpd.broker import rawprops
from amqpd.broker.message import LoggedMessage, Message
from amqpd.broker.queue_entry import QuorumEntry

if TYPE_CHECKING:
    from amqpd.broker.queue import QueueEntry
    from amqpd.broker.queue_type import QueueType
    from amqpd.server import Broker

log = logging.getLogger("amqpd.deadletter")


def header_routes(headers: dict[str, Any]) -> list[str]:
    """Routing keys from the ``CC`` and ``BCC`` headers (arrays of strings)."""
    out: list[str] = []
    for key in ("CC", "BCC"):
        value = headers.get(key)
        if isinstance(value, list):
            out.extend(v.decode() if isinstance(v, bytes | bytearray) else v
                       for v in value if isinstance(v, str | bytes | bytearray))
    return out


def make_message(message: Message, reason: str, queue_name: str, dlx: str,
                 dlrk: str | None) -> tuple[Message, list[str]]:
    """The dead-lettered copy of ``message`` and the routing keys to publish it with.

    The properties are edited raw (:mod:`rawprops`): other headers keep their bytes and
    types; x-death values get RabbitMQ's types (count is a long, time a timestamp)."""
    headers = message.headers  # decoded, to read CC and the x-death entries
    routing_keys = [message.routing_key, *header_routes(headers)]
    fields = rawprops.split_properties(message.properties)
    items = rawprops.header_items(fields)
    info: list[rawprops.Item] = [
        ("reason", rawprops.longstr(reason)),
        ("queue", rawprops.longstr(queue_name)),
        ("time", rawprops.timestamp(int(time.time()))),
        ("exchange", rawprops.longstr(message.exchange)),
        ("routing-keys", rawprops.array_value([rawprops.longstr(k) for k in routing_keys])),
    ]
    expiration = fields.pop("expiration", None)
    if expiration is not None:
        info.append(("original-expiration",
                     rawprops.longstr(expiration[1:].decode("utf-8", "replace"))))
    deaths = headers.get("x-death")
    raw_deaths = dict(items).get("x-death")
    if not isinstance(deaths, list) or raw_deaths is None or raw_deaths[:1] != b"A":
        rawprops.set_item(items, "x-first-death-reason", rawprops.longstr(reason))
        rawprops.set_item(items, "x-first-death-queue", rawprops.longstr(queue_name))
        rawprops.set_item(items, "x-first-death-exchange", rawprops.longstr(message.exchange))
        entry = rawprops.table_value([("count", rawprops.long(1)), *info])
        rawprops.set_item(items, "x-death", rawprops.array_value([entry]))
    else:
        raw_entries = rawprops.array_values(raw_deaths[5:])
        match = None
        for i, death in enumerate(deaths):
            if isinstance(death, dict) and death.get("queue") == queue_name \
                    and death.get("reason") == reason and raw_entries[i][:1] == b"F":
                match = i
                break
        if match is None:
            entry = rawprops.table_value(rawprops.sort_items([("count", rawprops.long(1)),
                                                              *info]))
            others = raw_entries
        else:
            count = deaths[match].get("count")
            fields_ = rawprops.table_items(raw_entries[match][5:])
            rawprops.set_item(fields_, "count", rawprops.long(
                (count if isinstance(count, int) else 0) + 1))
            entry = rawprops.table_value(rawprops.sort_items(fields_))
            others = raw_entries[:match] + raw_entries[match + 1:]
        rawprops.set_item(items, "x-death", rawprops.array_value([entry, *others]))
    items = rawprops.sort_items(items)  # rabbit_misc:set_table_value sorts the table
    if dlrk is not None:
        items = [(k, v) for k, v in items if k != "CC"]
        routing_keys = [dlrk]
    fields["headers"] = rawprops.encode_table(items)
    raw = rawprops.join_properties(fields)
    return Message(dlx, routing_keys[0], raw, message.body), routing_keys


def is_cycle(queue_name: str, deaths: list[Any]) -> bool:
    for i, death in enumerate(deaths):
        if isinstance(death, dict) and death.get("queue") == queue_name:
            return all(isinstance(d, dict) and d.get("reason") != "rejected"
                       for d in deaths[: i + 1])
    return False


def dead_letter(broker: Broker, queue: QueueType, entries: list[QueueEntry], reason: str) -> None:
    """Republish ``entries`` (already out of ``queue``) to the queue's DLX, if it has one."""
    ext = queue.ext
    dlx = ext.opts.dead_letter_exchange if ext is not None else None
    if dlx is None or not entries:
        return
    vhost = queue.vhost
    exchange = vhost.exchanges.get(dlx)
    if exchange is None:
        log.warning("dead-letter exchange '%s' for queue '%s' in vhost '%s' does not exist; "
                    "%d message(s) dropped", dlx, queue.name, vhost.name, len(entries))
        return
    from amqpd.broker.extensions import enqueue_routed

    dlrk = ext.opts.dead_letter_routing_key if ext is not None else None
    wrote = False
    for entry in entries:
        # a quorum queue's returned delivery: republish it as published, without the
        # x-delivery-count header RabbitMQ adds only on delivery
        message = entry.base if isinstance(entry, QuorumEntry) else entry.message
        if type(message) is LoggedMessage:
            message = message.load()
        dl, routing_keys = make_message(message, reason, queue.name, dlx, dlrk)
        targets = vhost.route(exchange, dl, routing_keys)
        if targets:
            deaths = dl.headers.get("x-death") or []
            targets = [q for q in targets if not is_cycle(q.name, deaths)]
            wrote |= enqueue_routed(broker, dl, targets)
    if wrote:
        broker.store.commit(lambda _err: None)


__all__ = ["dead_letter", "header_routes", "is_cycle", "make_message"]
