"""Questions a node asks the other running nodes over the inter-node links, answered at
once: what lets the management API list the whole cluster's connections, channels and
consumers on any node (docs/clustering.md, "Lists of the whole cluster"), and how one
node asks another (``BrokerAPI.ask_node``: a shovel's restart, a stream's offsets, a
transient queue's binding) whenever the link to it is up.

Why the links and not etcd (:mod:`amqpd.cluster.node_requests`, what a node still
without a link to the other uses): a list is asked on every page load of the web UI and
can be large (thousands of connections); through etcd every answer would be a write and
a delete of a value bounded by etcd's request size (1.5 MiB by default), read back by
polling.
The link between two nodes is already there, authenticated by the cookie, with frames
of any size (``link_wire.MAX_FRAME``): ``ASK request-id kind args`` one way, ``ANSWER
request-id answer`` back, both on stream 0. The handlers are the node's
(:meth:`BrokerAPI.serve_node_requests`), the same registry the etcd requests use.

Nothing waits for ever: :meth:`PeerAsk.ask_every` gives each running node ``timeout``
seconds and answers with the nodes that answered, naming those left out and why (no
link, the link went down, an error, no answer in time: a node stopped with SIGSTOP
keeps its link open and answers nothing).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import AMQPError
from amqpd.cluster import link_wire as W
from amqpd.cluster.node_requests import answer_to, error_of

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.cluster.cluster_queues import ClusterQueues
    from amqpd.cluster.link import Link

log = logging.getLogger("amqpd.cluster")

class PeerAsk:
    """The asking and the answering side, one per node (a link extension)."""

    def __init__(self, api: BrokerAPI, queues: ClusterQueues) -> None:
        self.api = api
        self.queues = queues
        self._next = 0
        self._waiting: dict[Link, dict[int, asyncio.Future[Any]]] = {}
        self._answering: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ asking
    def linked(self, node: str) -> bool:
        """Is the link to ``node`` up, so that :meth:`ask` can send it a question?"""
        link = self.queues.links.link(node)
        return link is not None and link.up and not link.closed

    async def ask(self, node: str, kind: str, args: dict[str, Any], timeout: float) -> Any:
        """``node``'s answer to ``kind``. Raises :class:`ConnectionError` when no link
        to it is up or it goes down first, :class:`TimeoutError` without an answer in
        ``timeout`` seconds, the :class:`AMQPError` of an error answer."""
        link = self.queues.links.link(node)
        if link is None or not link.up or link.closed:  # (as linked() says)
            raise ConnectionError(f"no link to node '{node}'")
        self._next = (self._next + 1) & 0xFFFFFFFF
        rid = self._next
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(link, {})[rid] = future
        try:
            link.send(W.encode(W.ASK, 0, rid, kind, args))
            answer = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TimeoutError(f"no answer within {timeout:g}s") from None
        finally:
            waiting = self._waiting.get(link)
            if waiting is not None:
                waiting.pop(rid, None)
                if not waiting:
                    del self._waiting[link]
        if not isinstance(answer, dict):
            raise AMQPError(f"node '{node}' answered {answer!r}")
        if answer.get("ok"):
            return answer.get("value")
        raise error_of(answer.get("code"), str(answer.get("error", "")))

    async def ask_every(self, nodes: list[str], kind: str, args: dict[str, Any],
                        timeout: float) -> tuple[dict[str, Any], dict[str, str]]:
        """Every one of ``nodes`` asked at once: their answers by node, and the nodes
        left out with why (each logged)."""
        got = await asyncio.gather(*(self.ask(n, kind, args, timeout) for n in nodes),
                                   return_exceptions=True)
        answers: dict[str, Any] = {}
        missing: dict[str, str] = {}
        for node, answer in zip(nodes, got, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                why = answer.text if isinstance(answer, AMQPError) else str(answer)
                missing[node] = why or type(answer).__name__
                log.warning("cluster: node %s left out of '%s': %s", node, kind,
                            missing[node])
            else:
                answers[node] = answer
        return answers, missing

    # ------------------------------------------------------------------ answering
    async def _answer(self, link: Link, rid: int, kind: str, args: Any) -> None:
        answer: dict[str, Any]
        if not isinstance(args, dict):
            answer = {"ok": False, "code": 502, "error": f"arguments {args!r}"}
        else:
            answer = await answer_to(self.api.node_request_handler(kind), kind, args,
                                     self.api.node_name(), link.peer)
        if not link.closed:
            link.send(W.encode(W.ANSWER, 0, rid, answer))

    # ------------------------------------------------------------------ the link's
    def link_up(self, link: Link) -> None:
        pass

    def link_down(self, link: Link) -> None:
        for future in self._waiting.pop(link, {}).values():
            if not future.done():
                future.set_exception(ConnectionError(f"the link to node '{link.peer}' "
                                                     "went down"))

    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        if kind == W.ASK:
            task = asyncio.get_running_loop().create_task(
                self._answer(link, f[0], f[1], f[2]), name="cluster-peer-ask")
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
        elif kind == W.ANSWER:
            future = self._waiting.get(link, {}).get(f[0])
            if future is not None and not future.done():
                future.set_result(f[1])

    def close(self) -> None:
        for task in list(self._answering):
            task.cancel()


def start(api: BrokerAPI, queues: ClusterQueues) -> PeerAsk:
    """Ask and answer on this node's links (``serve`` calls it)."""
    asker = PeerAsk(api, queues)
    queues.extensions.append(asker)
    return asker


__all__ = ["PeerAsk", "start"]
