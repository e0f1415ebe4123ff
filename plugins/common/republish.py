"""Publishing into this node's broker per destination queue, with confirms and retries
that back off: never a hot loop, never twice into a queue that has the message.

Used where a link's destination is the node it runs on: a federation link's local
republish (``ack-mode: on-confirm``) and a shovel whose ``dest-uri`` is ``amqp://``
(no host). Before issue 29 a refused local publish (a quorum queue on the route electing
a leader, a queue at its length limit with ``reject-publish``) went straight back and
was tried again at once, over and over: tens of thousands of tries a second, and every
try put one more copy into the healthy queues of the same route. Now:

- A message whose route has several queues is published once per queue (the publish
  pipeline's ``only``), so the publisher learns which queues confirmed it. One queue
  (the common case) or none: one publish, as before.
- A message that came back (its source redelivered it after a failure: ``redelivered``) with a
  :class:`~plugins.common.taken.Record` of an earlier pass is published only into the
  queues of its route that did not confirm it then; when every one did, it is settled
  without a publish (issue 29: each failure between the local publish and the
  source keeping the ack added a copy to every queue of the route).
- A refused message stays here, unsettled at its source: it is published again (its
  properties changed by the owner's ``mark_retry`` to say it may be a repeat: a refusal
  does not prove the queue lacks it, e.g. a quorum queue whose leader was lost after
  replicating it), after a :class:`~plugins.common.backoff.Backoff` delay, only into
  the queues of its route that
  did not confirm it (a queue that left the route meanwhile is dropped from that list;
  one whose node is down is unroutable, and the message is done, as in RabbitMQ).
- While anything waits for a retry, later messages wait behind it in arrival order
  (the source's prefetch bounds them), so a queue's order breaks only for what was
  already in flight when the failure came back.
- After :data:`MAX_ATTEMPTS` failed tries of one message the publisher gives up: the
  owner is told why (``on_give_up``) and starts over; its source redelivers what was
  not settled, with ``redelivered`` set.

``on_status`` hears the reason while a retry waits, and None once all went in.
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
from plugins.common.backoff import Backoff
from plugins.common.taken import Record

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI

# the longest a redelivered message waits for the answers to its earlier pass's
# publishes (a queue's confirm or refusal comes within the cluster's confirm deadline)
PENDING_WAIT = 30.0
SKIP_LOG_PERIOD = 1.0  # seconds between two log lines counting repeats kept out
RETRY_FIRST = 0.05  # seconds before the first retry of a refused publish
RETRY_CAP = 5.0  # the longest wait between two retries
MAX_ATTEMPTS = 25  # tries of one message before the owner gives up and starts over (~1.5 min)


@dataclass(eq=False)
class Held:
    """One message on its way into the local broker (``tag``: the owner's id for it)."""

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
    # what an earlier pass left in the queues, filled as the queues confirm this pass;
    # None: not tracked (a message without a message_id)
    record: Record | None = None
    # the source says it delivered this before (redelivered): only then is the record
    # of an earlier pass used (a publisher may send a message alike again on purpose)
    redelivered: bool = False
    waited: bool = False  # it waited for its earlier pass's answers (at most once)


class LocalPublisher:
    """The confirmed local publishes of one link's attempt (a new attempt: a new one).

    ``settle(tag, True)`` is called once per message, when every queue of its route
    took it (the publisher never settles a message as refused: it retries, or gives
    up on the whole attempt). ``mark_retry(properties, try number)`` returns the raw
    properties a retry goes out with (the owner's "maybe a repeat" flag). ``label``
    names the owner in ``log``'s warnings."""

    def __init__(self, api: BrokerAPI, vhost: str, label: str,
                 settle: Callable[[int, bool], None],
                 mark_retry: Callable[[bytes, int], bytes],
                 on_status: Callable[[str | None], None],
                 on_give_up: Callable[[str], None], log: logging.Logger) -> None:
        self.api = api
        self.vhost = vhost
        self.label = label
        self.settle = settle
        self.mark_retry = mark_retry
        self.log = log
        self.on_status = on_status  # the reason a retry waits, or None: all is well again
        self.on_give_up = on_give_up
        self.backoff = Backoff(RETRY_CAP, first=RETRY_FIRST)
        self.retrying: list[Held] = []  # refused, waiting for the timer, in order
        self.waiting: collections.deque[Held] = collections.deque()  # behind the retries
        self.retries_in_flight = 0
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.failures = 0  # refused tries over this publisher's life (status, tests)
        self.skipped = 0  # repeats every queue of the route had: settled, not published
        self._skips_logged = 0
        self._skip_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ entry points
    def submit(self, held: Held) -> None:
        """A message to publish (in the source's delivery order). Raises what the
        publish raises (404: the exchange or vhost is gone)."""
        if self.blocked:
            self.waiting.append(held)
            return
        self._send(held)

    def close(self) -> None:
        """The attempt is over: late confirms and the timer do nothing any more."""
        self.closed = True
        if self._skip_timer is not None:
            self._skip_timer.cancel()
            self._log_skips()
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
            record = held.record if held.redelivered else None
            if record is not None and not held.waited and record.unanswered(names):
                # an earlier pass's publish is still out there (its attempt ended before
                # the answer came): whether that queue has it is not known yet
                self._defer(held, record)
                return
            held.missing = set(names)
            had = record.queues if record is not None else None
            if had and names and had.intersection(names):
                # a repeat: only the queues its earlier pass did not reach get it
                held.missing.difference_update(had)
                if not held.missing:
                    self._skipped_one()
                    self._finish(held)
                    return
                targets: list[str | None] = [*sorted(held.missing)]
            else:
                targets = [None] if len(names) <= 1 else [*sorted(names)]
        else:
            held.missing &= set(names)  # a queue no longer on the route is not waited for
            if not held.missing:
                self._finish(held)
                return
            targets = [*sorted(held.missing)]
            # tries so far + 1: the number of the try about to go out (2, 3, ...)
            held.properties = self.mark_retry(held.properties, held.attempts + 1)
        held.error = None
        held.parts = len(targets)
        for name in targets:
            only = None if name is None else frozenset((name,))
            sent = frozenset(held.missing) if only is None else only
            if held.record is not None:
                held.record.sending(sent)
            # a fresh Message each time: the pipeline writes its store position into it
            self.api.publish(self.vhost, held.exchange,
                             Message(held.exchange, held.routing_key, held.properties,
                                     held.body),
                             None, on_confirm=functools.partial(self._part, held, name, sent),
                             only=only)

    def _defer(self, held: Held, record: Record) -> None:
        """Hold ``held`` (and, behind it, what comes later) until the publishes of an
        earlier pass of the same message are answered, or :data:`PENDING_WAIT`: then
        it goes only where no pass put it (issue 29: a redelivery that overtook the
        confirm of the retry before it made a third copy)."""
        if not held.retry:  # counted as a retry in flight: later messages wait behind
            held.retry = True
            self.retries_in_flight += 1
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def wake() -> None:
            if held.waited:
                return
            held.waited = True
            if timer is not None:
                timer.cancel()
            if not self.closed and self._send_or_give_up(held):
                self._maybe_resume()

        timer = loop.call_later(PENDING_WAIT, wake)

        def answered() -> None:  # called inside another publish's confirm: wake later
            loop.call_soon(wake)

        record.wait(answered)

    def _skipped_one(self) -> None:
        """A repeat kept out of every queue: counted, and logged at most once a
        :data:`SKIP_LOG_PERIOD` (after a failover hundreds may come at once)."""
        self.skipped += 1
        if self._skip_timer is None and not self.closed:
            self._skip_timer = asyncio.get_running_loop().call_later(SKIP_LOG_PERIOD,
                                                                     self._log_skips)

    def _log_skips(self) -> None:
        self._skip_timer = None
        count, self._skips_logged = self.skipped - self._skips_logged, self.skipped
        if count:
            self.log.info("%s: %d redelivered message(s) already in every queue of their "
                          "route: acked without a publish", self.label, count)

    def _part(self, held: Held, name: str | None, sent: frozenset[str],
              error: BaseException | None) -> None:
        assert held.missing is not None
        if held.record is not None:
            # a fact about the queues even after the attempt ended: a later pass of the
            # message skips those that confirmed it (and waits for this answer)
            held.record.answered(sent, error is None)
        if self.closed:
            return
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
        self.settle(held.tag, True)
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
            self.log.warning("%s: %s; giving up, starting over", self.label, reason)
            self.on_give_up(f"{reason}; gave up after {held.attempts} tries")
            return
        self.retrying.append(held)
        if self.timer is None:
            delay = self.backoff.next()
            # one line per retry round, not per message: never a storm of warnings
            self.log.warning("%s: %s; retrying in %.2fs", self.label, reason, delay)
            self.on_status(f"{reason}; retrying in {delay:.2f}s")
            self.timer = asyncio.get_running_loop().call_later(delay, self._retry)

    def _retry(self) -> None:
        self.timer = None
        batch, self.retrying = self.retrying, []
        for held in batch:  # all counted first: none of them resumes the rest early
            held.retry = True
        self.retries_in_flight += len(batch)
        for held in batch:
            if not self._send_or_give_up(held):
                return
        self._maybe_resume()

    def _send_or_give_up(self, held: Held) -> bool:
        """:meth:`_send` a message that waited; False when the publish raised (the
        exchange or vhost went meanwhile): the attempt is over, the owner starts over."""
        try:
            self._send(held)
        except Exception as exc:
            self.close()
            self.on_give_up(f"local publish failed: {exc}")
            return False
        return True

    def _maybe_resume(self) -> None:
        """Every retry went through: back to normal, and the deliveries that waited go
        out in their order (stopping again if one of them is refused)."""
        if self.closed or self.blocked:
            return
        self.backoff.reset()
        self.on_status(None)
        while self.waiting and not self.blocked and not self.closed:
            if not self._send_or_give_up(self.waiting.popleft()):
                return
