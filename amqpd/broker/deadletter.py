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

import datetime
import logging
import time
from typing import TYPE_CHECKING, Any

from amqpd.broker.message import LoggedMessage, Message

if TYPE_CHECKING:
    from amqpd.broker.queue import Queue, QueueEntry
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
    """The dead-lettered copy of ``message`` and the routing keys to publish it with."""
    props = dict(message.props)
    headers = dict(props.get("headers") or {})
    routing_keys = [message.routing_key, *header_routes(headers)]
    info: dict[str, Any] = {
        "reason": reason,
        "queue": queue_name,
        "time": datetime.datetime.fromtimestamp(int(time.time()), tz=datetime.UTC),
        "exchange": message.exchange,
        "routing-keys": list(routing_keys),
    }
    expiration = props.pop("expiration", None)
    if expiration is not None:
        info["original-expiration"] = expiration
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = queue_name
        headers["x-first-death-exchange"] = message.exchange
        headers["x-death"] = [{"count": 1, **info}]
    else:
        match: dict[str, Any] | None = None
        others: list[Any] = []
        for death in deaths:
            if match is None and isinstance(death, dict) and death.get("queue") == queue_name \
                    and death.get("reason") == reason:
                match = death
            else:
                others.append(death)
        if match is None:
            entry = {"count": 1, **info}
        else:
            entry = dict(match)
            count = entry.get("count")
            entry["count"] = (count if isinstance(count, int) else 0) + 1
        headers["x-death"] = [dict(sorted(entry.items())), *others]
    if dlrk is not None:
        headers.pop("CC", None)
        routing_keys = [dlrk]
    props["headers"] = headers
    return message.with_properties(props, exchange=dlx, routing_key=routing_keys[0]), routing_keys


def is_cycle(queue_name: str, deaths: list[Any]) -> bool:
    for i, death in enumerate(deaths):
        if isinstance(death, dict) and death.get("queue") == queue_name:
            return all(isinstance(d, dict) and d.get("reason") != "rejected"
                       for d in deaths[: i + 1])
    return False


def dead_letter(broker: Broker, queue: Queue, entries: list[QueueEntry], reason: str) -> None:
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
        message = entry.message
        if type(message) is LoggedMessage:
            message = message.load()
        dl, routing_keys = make_message(message, reason, queue.name, dlx, dlrk)
        targets = vhost.route(exchange, dl, routing_keys)
        if targets:
            deaths = dl.headers.get("x-death") or []
            targets = [q for q in targets if not is_cycle(q.name, deaths)]
            wrote |= enqueue_routed(broker, dl, targets)
    if wrote and broker.store is not None:
        broker.store.commit(lambda _err: None)


__all__ = ["dead_letter", "header_routes", "is_cycle", "make_message"]
