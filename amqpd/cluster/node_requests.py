"""Requests one node makes of another: "restart the shovel you run", through etcd.

RabbitMQ's management API restarts a shovel or a federation link from any node with an
Erlang RPC to the node that runs it. amqpd's nodes already talk through etcd for what
they tell each other (:mod:`amqpd.cluster.node_info`); a request and its answer travel
the same way::

    {etcd_prefix}/{cluster}/requests/{node}/{id}  {"kind", "args", "from"}  asker's lease
    {etcd_prefix}/{cluster}/answers/{id}          {"ok", "value"} or
                                                  {"ok": false, "code", "error"}  answerer's lease

The node named in the key watches its own ``requests/{node}/`` prefix, runs the handler
registered for ``kind`` (:meth:`BrokerAPI.serve_node_requests`; a plugin's, such as the
shovel's ``shovel-restart``), writes the answer and deletes the request. The asker
reads the answer key until it is there or its deadline passes (a management call: a
few reads of 50 ms apart, bounded), then deletes both keys. Both keys hang on a lease,
so a node that dies mid-way leaves nothing behind. A handler's :class:`AMQPError`
travels as its reply code (404: no such link there) and is raised again on the asking
side as the same kind of error; anything else is a 541 with the text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
import uuid
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import (
    AccessRefused,
    AMQPError,
    NodeRequestHandler,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from amqpd.cluster.periodic import cancel_all
from amqpd.cluster.prefix_watch import follow_prefix
from amqpd.coord.etcd import EtcdClient, EtcdError, WatchEvent

if TYPE_CHECKING:
    from amqpd.cluster.node import Cluster

log = logging.getLogger("amqpd.cluster")

POLL = 0.05  # seconds between two reads of the answer key
# an error answer's reply code -> what the asker raises (any other: AMQPError, same code)
_ERRORS: dict[int, type[AMQPError]] = {
    c.reply_code: c for c in (NotFound, AccessRefused, ResourceLocked, PreconditionFailed)}


def error_of(code: Any, text: str) -> AMQPError:
    """The error an answer carries, as the asker raises it (its reply code kept)."""
    code = code if isinstance(code, int) else 541
    cls = _ERRORS.get(code)
    if cls is not None:
        return cls(text)
    exc = AMQPError(text)
    exc.reply_code = code  # 540: the node has no handler for it, 541: the handler failed
    return exc


async def answer_to(handler: NodeRequestHandler | None, kind: str, args: dict[str, Any],
                    node: str, asker: object) -> dict[str, Any]:
    """What this node answers a request ``kind`` (through etcd here, over a link in
    :mod:`amqpd.cluster.peer_ask`): the handler's value, or the error's code and text
    that :func:`error_of` turns back into the error on the asking node."""
    if handler is None:
        return {"ok": False, "code": 540, "error": f"no handler for '{kind}' on node '{node}'"}
    try:
        return {"ok": True, "value": await handler(args)}
    except AMQPError as exc:
        return {"ok": False, "code": exc.reply_code, "error": exc.text}
    except Exception as exc:
        log.exception("cluster: request '%s' from %s failed", kind, asker)
        return {"ok": False, "code": 541, "error": f"{type(exc).__name__}: {exc}"}


class NodeRequests:
    def __init__(self, cluster: Cluster, etcd: EtcdClient, root: str) -> None:
        self.cluster = cluster
        self.etcd = etcd
        self.requests = root + "/requests/"
        self.answers = root + "/answers/"
        self._task: asyncio.Task[None] | None = None
        self._handling: set[asyncio.Task[None]] = set()
        self._in_hand: set[str] = set()  # request ids being answered (a re-read skips them)

    def _mine(self) -> str:
        return self.requests + urllib.parse.quote(self.cluster.node_name, safe="") + "/"

    # ------------------------------------------------------------------ asking
    async def ask(self, node: str, kind: str, args: dict[str, Any], timeout: float) -> Any:
        """``node``'s answer to ``kind`` with ``args``. Raises :class:`NotFound` if
        ``node`` is not another running node of the cluster, the :class:`AMQPError` of
        an error answer, and :class:`TimeoutError` without an answer in ``timeout``
        seconds (the node busy or stuck, or etcd out of reach)."""
        if node == self.cluster.node_name or not self.cluster.is_running(node):
            raise NotFound(f"node '{node}' is not another running node of the cluster")
        rid = uuid.uuid4().hex
        key = self.requests + urllib.parse.quote(node, safe="") + "/" + rid
        answer_key = self.answers + rid
        body = json.dumps({"kind": kind, "args": args, "from": self.cluster.node_name})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await self.etcd.put(key, body, lease=self.cluster.membership.lease_id)
            while True:
                kv = await self.etcd.get(answer_key)
                if kv is not None:
                    answer = kv.json()
                    break
                if loop.time() >= deadline:
                    raise TimeoutError(f"node '{node}' did not answer '{kind}' within "
                                       f"{timeout:g}s")
                await asyncio.sleep(POLL)
        except EtcdError as exc:
            raise TimeoutError(f"'{kind}' not passed to node '{node}': {exc}") from exc
        finally:
            for stale in (key, answer_key):
                with contextlib.suppress(EtcdError):
                    await self.etcd.delete(stale)
        if not isinstance(answer, dict):
            raise AMQPError(f"node '{node}' answered {answer!r}")
        if answer.get("ok"):
            return answer.get("value")
        raise error_of(answer.get("code"), str(answer.get("error", "")))

    # ------------------------------------------------------------------ answering
    def _received(self, key: bytes, value: bytes) -> None:
        rid = key.decode().rsplit("/", 1)[-1]
        if rid in self._in_hand:
            return
        self._in_hand.add(rid)
        task = asyncio.create_task(self._answer(key, rid, value), name="cluster-request")
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)
        task.add_done_callback(lambda _t: self._in_hand.discard(rid))

    async def _answer(self, key: bytes, rid: str, value: bytes) -> None:
        try:
            request = json.loads(value)
            kind = str(request["kind"])
            args = request.get("args") or {}
        except (ValueError, KeyError, TypeError):
            log.warning("cluster: an unreadable request %r, dropped", value[:200])
            with contextlib.suppress(EtcdError):
                await self.etcd.delete(key)
            return
        answer = await answer_to(self.cluster.api.node_request_handler(kind), kind, args,
                                 self.cluster.node_name, request.get("from"))
        log.info("cluster: request '%s' %s from node %s: %s", kind, args,
                 request.get("from"), "done" if answer["ok"] else answer["error"])
        try:
            await self.etcd.put(self.answers + rid, json.dumps(answer, default=str),
                                lease=self.cluster.membership.lease_id)
            await self.etcd.delete(key)
        except EtcdError as exc:
            log.warning("cluster: the answer to request '%s' not written: %s", kind, exc)

    async def _read_all(self) -> int:
        revision, kvs = await self.etcd.range_prefix(self._mine())
        for kv in kvs:  # asked while this node was not watching (yet)
            self._received(kv.key, kv.value)
        return revision

    def _event(self, ev: WatchEvent) -> None:
        if not ev.deleted:
            self._received(ev.kv.key, ev.kv.value)

    async def _watch_loop(self) -> None:
        await follow_prefix(self.etcd, self._mine(), self._read_all, self._event, log,
                            "the requests")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.create_task(self._watch_loop(), name="cluster-requests")

    async def stop(self) -> None:
        await cancel_all([*([self._task] if self._task is not None else []),
                          *self._handling])
        self._task = None


__all__ = ["NodeRequests"]
