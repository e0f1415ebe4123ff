"""A link's local republish (``ack-mode: on-confirm``): per destination queue, retried
with backoff, never a hot loop and never twice into a queue that has the message.

Before issue 29 a refused local publish (a quorum queue on the route electing a leader)
nacked the delivery upstream, which sent it straight back, over and over: tens of
thousands of tries a second, and every try put one more copy into the healthy queues of
the same route. Now:

- A message whose route has several queues is published once per queue (the publish
  pipeline's ``only``), so the link learns which queues confirmed it. One queue (the
  common case) or none: one publish, as before.
- A refused message stays here, unacked upstream: it is published again (marked as a
  possible repeat, ``x-received-from[0].redelivered``: a refusal does not prove the
  queue lacks it, e.g. a quorum queue whose leader was lost after replicating it), after a
  :class:`~plugins.shovel.backoff.Backoff` delay, only into the queues of its route that
  did not confirm it (a queue that left the route meanwhile is dropped from that list;
  one whose node is down is unroutable, and the message is done, as in RabbitMQ).
- While anything waits for a retry, later deliveries wait behind it in arrival order
  (the upstream's prefetch bounds them), so a queue's order breaks only for what was
  already in flight when the failure came back.
- After :data:`MAX_ATTEMPTS` failed tries of one message the link gives up: it reports
  why and starts over (its own reconnect backoff), and the upstream redelivers what was
  not acked, with ``redelivered`` set (``x-received-from``'s ``redelivered`` then says
  so to consumers; see docs/federation.md).

The link's status is ``error`` with the reason while retrying, ``running`` again after.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from amqpd.broker.api import Message
from plugins.federation.headers import first_hop_redelivered
from plugins.shovel.backoff import Backoff

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from plugins.federation.acker import Acker

log = logging.getLogger("amqpd.federation")

RETRY_FIRST = 0.05  # seconds before the first retry of a refused publish
RETRY_CAP = 5.0  # the longest wait between two retries
MAX_ATTEMPTS = 25  # tries of one message before the link gives up and starts over (~1.5 min)


@dataclass(eq=False)
class Held:
    """One upstream delivery on its way into the local broker."""

    tag: int
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    missing: set[str] | None = None  # queues yet to confirm it (None: not tried yet)
    parts: int = 0  # publishes of the current try still unanswered
    error: BaseException | None = None  # the current try's first refusal
    attempts: int = 0
    retry: bool = False  # the current try is a retry
    marked: bool = False  # properties already say "maybe a repeat"


class LocalPublisher:
    """The on-confirm republish of one link's channel (a new channel: a new one)."""

    def __init__(self, api: BrokerAPI, vhost: str, key: str, acker: Acker,
                 on_status: Callable[[str | None], None],
                 on_give_up: Callable[[str], None]) -> None:
        self.api = api
        self.vhost = vhost
        self.key = key
        self.acker = acker
        self.on_status = on_status  # the reason a retry waits, or None: all is well again
        self.on_give_up = on_give_up
        self.backoff = Backoff(RETRY_CAP, first=RETRY_FIRST)
        self.retrying: list[Held] = []  # refused, waiting for the timer, in order
        self.waiting: collections.deque[Held] = collections.deque()  # behind the retries
        self.retries_in_flight = 0
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.failures = 0  # refused tries over this publisher's life (status, tests)

    # ------------------------------------------------------------------ entry points
    def submit(self, held: Held) -> None:
        """A delivery arrived (in delivery order, already tracked by the acker).
        Raises what the publish raises (404: the exchange is gone)."""
        if self.blocked:
            self.waiting.append(held)
            return
        self._send(held)

    def close(self) -> None:
        """The channel is gone: late confirms and the timer do nothing any more."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.retrying.clear()
        self.waiting.clear()

    @property
    def blocked(self) -> bool:
        return bool(self.retrying) or self.timer is not None or self.retries_in_flight > 0

    # ------------------------------------------------------------------ publishing
    def _send(self, held: Held) -> None:
        message = Message(held.exchange, held.routing_key, held.properties, held.body)
        names = self.api.route_names(self.vhost, held.exchange, message)
        if held.missing is None:
            held.missing = set(names)
            targets: list[str | None] = [None] if len(names) <= 1 else [*sorted(names)]
        else:
            held.missing &= set(names)  # a queue no longer on the route is not waited for
            if not held.missing:
                self._finish(held)
                return
            targets = [*sorted(held.missing)]
            if not held.marked:
                held.marked = True
                held.properties = first_hop_redelivered(held.properties)
        held.error = None
        held.parts = len(targets)
        for name in targets:
            only = None if name is None else frozenset((name,))
            # a fresh Message each time: the pipeline writes its store position into it
            self.api.publish(self.vhost, held.exchange,
                             Message(held.exchange, held.routing_key, held.properties,
                                     held.body),
                             None, on_confirm=functools.partial(self._part, held, name),
                             only=only)

    def _part(self, held: Held, name: str | None, error: BaseException | None) -> None:
        if self.closed:
            return
        assert held.missing is not None
        if error is None:
            if name is None:
                held.missing.clear()
            else:
                held.missing.discard(name)
        elif held.error is None:
            held.error = error
        held.parts -= 1
        if held.parts > 0:
            return
        if held.error is not None and held.missing:
            self._refused(held)
        else:
            self._finish(held)

    def _finish(self, held: Held) -> None:
        self.acker.settle(held.tag, True)
        if held.retry:
            held.retry = False
            self.retries_in_flight -= 1
            self._maybe_resume()

    def _refused(self, held: Held) -> None:
        self.failures += 1
        if held.retry:
            held.retry = False
            self.retries_in_flight -= 1
        held.attempts += 1
        queues = ", ".join(f"'{q}'" for q in sorted(held.missing or ())) or "its route"
        reason = f"local publish to {queues} failed {held.attempts} time(s): {held.error}"
        if held.attempts >= MAX_ATTEMPTS:
            self.close()
            log.warning("federation %s: %s; giving up, the link starts over", self.key,
                        reason)
            self.on_give_up(f"{reason}; gave up after {held.attempts} tries")
            return
        self.retrying.append(held)
        if self.timer is None:
            delay = self.backoff.next()
            # one line per retry round, not per message: never a storm of warnings
            log.warning("federation %s: %s; retrying in %.2fs", self.key, reason, delay)
            self.on_status(f"{reason}; retrying in {delay:.2f}s")
            self.timer = asyncio.get_running_loop().call_later(delay, self._retry)

    def _retry(self) -> None:
        self.timer = None
        batch, self.retrying = self.retrying, []
        for held in batch:  # all counted first: none of them resumes the rest early
            held.retry = True
        self.retries_in_flight += len(batch)
        for held in batch:
            try:
                self._send(held)
            except Exception as exc:  # the exchange went meanwhile: start over
                self.close()
                self.on_give_up(f"local publish failed: {exc}")
                return
        self._maybe_resume()

    def _maybe_resume(self) -> None:
        """Every retry went through: back to normal, and the deliveries that waited go
        out in their order (stopping again if one of them is refused)."""
        if self.closed or self.blocked:
            return
        self.backoff.reset()
        self.on_status(None)
        while self.waiting and not self.blocked and not self.closed:
            held = self.waiting.popleft()
            try:
                self._send(held)
            except Exception as exc:
                self.close()
                self.on_give_up(f"local publish failed: {exc}")
                return
