"""The node's one HTTP port when ``workers`` > 1: the management API of the whole node.

Each worker serves a complete management API on a private loopback port, but sees only
its own connections, channels and statistics, and learns of a queue another worker just
declared a moment later (the definitions reach it through the coordination store). So the
supervisor serves the node's HTTP port itself and answers as one node
(docs/workers.md, "The HTTP port"):

* a request about one queue (its page, ``/get``, ``/contents``, ``/bindings``, DELETE)
  or a binding to a queue goes to the queue's **owner** (the worker whose member name is
  the queue's ``node``), found by asking every worker; so does a publish to the default
  exchange (its routing key names the queue);
* a request about one connection or channel goes to the worker that has it;
* lists of connections and channels are **concatenated** over the workers, then
  filtered, sorted, paged and projected here as one node's list would be;
* a list of queues takes each queue from its owner (the others' copies have no figures);
  exchanges **sum** their ``message_stats`` (each worker counts what its own publishers
  sent); the overview sums every worker's figures of the queues it owns
  (``amqpd_led_only``): ``message_stats``, ``queue_totals`` (rates and samples point by
  point) and the connection, channel, queue and consumer totals; its ``listeners`` are
  the node's (amqp, amqps, http or https), not a worker's private ones;
* the health checks about the node's ports and about quorum answer for the node: its
  AMQP, amqps and HTTP ports, and a single node (phase 1 refuses ``[cluster]``); the alarm
  checks fail if any worker's does; the memory watermark gives each worker its share;
* consumers are listed from every worker (each lists its own connections' consumers);
  ``/api/nodes`` sums or takes the largest of the workers' figures
  (:data:`NODE_SUMMED`, :data:`NODE_MAX`);
* ``/metrics`` (and ``/per-object``, ``/detailed``) merges every worker's Prometheus
  text, each worker counting only the queues it owns: series with the same name and
  labels summed (the largest for :data:`PROMETHEUS_MAX`); ``/metrics/per-worker``
  (amqpd's own) gives every worker's series with a ``worker`` label;
* a plugin's lists of what runs where (``/api/shovels``, ``/api/federation-links``)
  are merged, each shovel or link once, as the worker that runs it reports it (the
  others list what it shared a moment earlier); one shovel's status is that worker's;
* ``GET /api/workers`` lists the workers (pid, private ports, connections handed,
  restarts): per-worker figures are on each worker's private API;
* anything else (definitions, users, vhosts, policies, the UI) goes to the first worker
  that serves (definitions are shared, so any worker makes or reads them), and to the
  next while the answer is a 404 (a worker that has not yet heard of an object);
* in every JSON answer a worker's member name becomes the node's name.

Authentication stays the workers': every request is forwarded with its headers and the
client's address (:data:`PEER_HEADER`), so a loopback-only user stays refused from
elsewhere. A web UI session is the node's: the workers keep their sessions in one file
(``http_sessions_file``, amqpd/http/sessions.py), so the cookie a login through any
worker set opens every worker, wherever the front sends the next request.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, unquote

import aiohttp
from aiohttp import web
from yarl import URL

from amqpd.http.core import LIST_OPTIONS, PEER_HEADER, HttpError, error_response, list_options
from amqpd.http.object_history import sample_block

log = logging.getLogger("amqpd.workers.http")

TIMEOUT: Final = 60.0  # seconds a worker gets to answer (a definitions import is slow)
# hop-by-hop and framing headers: aiohttp sets its own on each side
HOP: Final = frozenset({"host", "connection", "keep-alive", "transfer-encoding",
                        "content-length", "content-encoding", "accept-encoding",
                        "proxy-authorization", "te", "trailer", "upgrade",
                        PEER_HEADER.lower()})


# plugins' lists of what runs where (each worker lists its own; the front merges them)
PLUGIN_LISTS: Final = ("shovels", "federation-links")
# the overview's object_totals summed over the workers (exchanges: every worker has
# every one, so the first worker's count is the node's)
OVERVIEW_SUMMED: Final = ("connections", "channels", "queues", "consumers")
# /api/nodes: figures of one process each, summed over the workers (each worker has its
# own memory, limit share, descriptors, sockets and connections); the largest taken
NODE_SUMMED: Final = ("mem_used", "mem_limit", "fd_used", "fd_total", "sockets_used",
                      "sockets_total", "proc_used", "run_queue")
NODE_MAX: Final = ("uptime",)
NODE_ANY: Final = ("mem_alarm", "disk_free_alarm")  # true if any worker's is
PROMETHEUS_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# gauges merged by the largest worker's value, not the sum: the node's uptime, a 0/1
# alarm, the slowest last fsync
PROMETHEUS_MAX: Final = ("rabbitmq_erlang_uptime_seconds",
                         "rabbitmq_alarms_memory_used_watermark",
                         "rabbitmq_alarms_free_disk_space_watermark",
                         "rabbitmq_alarms_file_descriptor_limit",
                         "amqpd_store_fsync_last_seconds")


@dataclass(frozen=True)
class Backend:
    """One serving worker's private API."""

    index: int
    port: int
    node: str  # its member name: a queue's ``node`` when the worker owns it


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def with_status(self, status: int) -> Answer:
        return Answer(status, self.headers, self.body)

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def sum_stats(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Add ``other``'s figures to ``into``: numbers summed (rates too), nested dicts
    recursively, a sample block (``*_details`` with ``samples``) by
    :func:`sum_sample_blocks`, anything else kept from ``into``."""
    for key, value in other.items():
        mine = into.get(key)
        if mine is None:
            into[key] = copy.deepcopy(value)
        elif isinstance(mine, dict) and isinstance(value, dict):
            if isinstance(mine.get("samples"), list) and isinstance(value.get("samples"), list):
                sum_sample_blocks(mine, value)
            else:
                sum_stats(mine, value)
        elif _number(mine) and _number(value):
            into[key] = mine + value


def sum_sample_blocks(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Two workers' RabbitMQ sample blocks (``{"rate", "samples", "avg", "avg_rate"}``,
    samples newest first) as the node's: the rates summed; each of ``into``'s samples
    plus ``other``'s sample nearest to it in time (the workers sample on the same
    wall-clock ticks, amqpd/http/stats.py, so that is the same moment within
    milliseconds; a worker with a shorter history, just restarted, adds its oldest
    sample to the older points); ``avg`` and ``avg_rate`` computed again over the sums."""
    if _number(into.get("rate")) and _number(other.get("rate")):
        into["rate"] = round(into["rate"] + other["rate"], 1)
    theirs = _points(other["samples"])
    points: list[tuple[int, int]] = []
    for t, v in _points(into["samples"]):
        if theirs:
            v += min(theirs, key=lambda q: abs(q[0] - t))[1]
        points.append((t, v))
    if not into["samples"]:
        points = theirs
    into.update(sample_block(points))


def _points(samples: list[Any]) -> list[tuple[int, int]]:
    """A sample list's (timestamp, sample) pairs, anything malformed left out."""
    return [(p["timestamp"], p["sample"]) for p in samples
            if isinstance(p, dict) and _number(p.get("timestamp"))
            and _number(p.get("sample"))]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _items(body: Any) -> list[dict[str, Any]] | None:
    """A list answer's items, paged (``{"items": [...]}``) or plain."""
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        return list(body["items"])
    if isinstance(body, list):
        return body
    return None


class HttpFront:
    """The aiohttp application of the node's HTTP port; ``backends`` gives the serving
    workers (first = the one that answers what needs no particular worker),
    ``node_ports`` the node's own listening ports, ``workers_info`` the rows of
    ``GET /api/workers`` (the one answer that names the workers), ``node_listeners``
    the node's listeners as (protocol, address, port), which the overview lists
    instead of a worker's private ones."""

    def __init__(self, node_name: str, backends: Callable[[], Sequence[Backend]],
                 node_ports: Callable[[], list[int]],
                 workers_info: Callable[[], list[dict[str, Any]]],
                 node_listeners: Callable[[], list[tuple[str, str, int]]] | None = None,
                 ) -> None:
        self.node_name = node_name
        self.backends = backends
        self.node_ports = node_ports
        self.workers_info = workers_info
        self.node_listeners = node_listeners
        self.session: aiohttp.ClientSession | None = None
        self.app = web.Application(client_max_size=128 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.app.on_cleanup.append(self._close)

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    # ------------------------------------------------------------------ forwarding
    async def _send(self, backend: Backend, request: web.Request, body: bytes,
                    method: str | None = None, path: str | None = None) -> Answer:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT), auto_decompress=False)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
        headers.append((PEER_HEADER, request.remote or ""))
        # the path exactly as the client spelt it (encoded=True: not re-quoted)
        url = URL(f"http://127.0.0.1:{backend.port}{path or request.raw_path}", encoded=True)
        async with self.session.request(method or request.method, url, data=body or None,
                                        headers=headers, allow_redirects=False) as resp:
            data = await resp.read()
            return Answer(resp.status, [(k, v) for k, v in resp.headers.items()
                                        if k.lower() not in HOP], data)

    async def _all(self, request: web.Request, body: bytes, method: str | None = None,
                   path: str | None = None) -> list[tuple[Backend, Answer | None]]:
        backends = list(self.backends())
        got = await asyncio.gather(*(self._send(b, request, body, method, path)
                                     for b in backends), return_exceptions=True)
        out: list[tuple[Backend, Answer | None]] = []
        for b, a in zip(backends, got, strict=True):
            if isinstance(a, BaseException):
                log.warning("worker %d did not answer %s: %r", b.index, path, a)
                out.append((b, None))
            else:
                out.append((b, a))
        return out

    def _respond(self, answer: Answer, body: Any = None) -> web.Response:
        """The worker's answer as the node's: ``body`` (JSON) replacing its body if
        given; the workers' member names in a JSON answer become the node's name."""
        members = {b.node for b in self.backends()}
        if body is None and _is_json(answer.headers) and any(
                m.encode() in answer.body for m in members):
            body = answer.json()
        if body is None:
            return web.Response(status=answer.status, body=answer.body,
                                headers=answer.headers)
        body = as_node(body, members, self.node_name)
        headers = [(k, v) for k, v in answer.headers if k.lower() != "content-type"]
        return web.Response(status=answer.status, body=json.dumps(body).encode(),
                            headers=headers, content_type="application/json")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self.backends():
            return error_response(HttpError(503, "unavailable", "no worker is up"), False)
        body = await request.read()
        raw = request.raw_path.split("?", 1)[0].split("/")[1:]
        segs = [unquote(s) for s in raw]
        try:
            return await self._dispatch(request, body, raw, segs)
        except HttpError as exc:
            return error_response(exc, False)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("HTTP %s %s: no worker answered: %r", request.method,
                        request.raw_path, exc)
            return error_response(HttpError(503, "unavailable", "no worker answered"),
                                  False)

    async def _dispatch(self, request: web.Request, body: bytes, raw: list[str],
                        segs: list[str]) -> web.StreamResponse:
        m, n = request.method, len(segs)
        api = n >= 2 and segs[0] == "api"
        kind = segs[1] if api else ""
        if api and kind == "queues" and n >= 4 and not (m == "PUT" and n == 4):
            return await self._to_owner(request, body, raw[2], raw[3])
        if api and kind == "queues" and n <= 3 and m == "GET":
            return await self._queue_list(request, body)
        if (api and kind == "bindings" and n >= 7 and segs[3] == "e" and segs[5] == "q"):
            return await self._to_owner(request, body, raw[2], raw[6])
        if api and kind == "exchanges" and n == 5 and segs[4] == "publish" and m == "POST":
            return await self._publish(request, body, raw)
        if api and kind == "exchanges" and n <= 3 and m == "GET":
            return await self._exchange_list(request, body)
        if api and kind == "exchanges" and n == 4 and m == "GET":
            return await self._exchange(request, body)
        if api and kind in ("connections", "channels") and n >= 3:
            return await self._to_holder(request, body, kind, raw[2])
        if m == "GET" and api and (kind in ("connections", "channels") or (
                kind == "consumers" and n <= 3) or (
                kind == "vhosts" and n == 4 and segs[3] in ("connections", "channels"))):
            return await self._concatenated(request, body)
        if m == "GET" and api and kind == "overview" and n == 2:
            return await self._overview(request, body)
        if m == "GET" and api and kind == "nodes" and (
                n == 2 or (n == 3 and segs[2] == self.node_name)):
            return await self._nodes(request, body, one=n == 3)
        if m == "GET" and segs[0] == "metrics" and (n == 1 or (
                n == 2 and segs[1] in ("per-object", "detailed", "per-worker"))):
            return await self._metrics(request, body, segs[1] if n == 2 else "")
        if m == "GET" and api and kind == "workers" and n == 2:
            return await self._workers(request, body)
        if m == "GET" and api and kind in PLUGIN_LISTS and n <= 3:
            return await self._merged_list(request, body, self._runners_own)
        if m == "GET" and api and kind == "shovels" and n == 5 and segs[2] == "vhost":
            return await self._runner(request, body)
        if m == "GET" and api and kind == "health" and n >= 4 and segs[2] == "checks":
            if segs[3] == "port-listener" and n == 5:
                return await self._port_listener(request, body, segs[4])
            if segs[3] == "node-is-quorum-critical" and n == 4:
                return await self._quorum_critical(request, body)
            if segs[3] in ("alarms", "local-alarms") and n == 4:
                return await self._alarms(request, body)
        if (m == "PUT" and api and kind == "nodes" and n == 4 and segs[2] == self.node_name
                and segs[3] == "memory-high-watermark"):
            return await self._watermark(request, body, raw)
        return await self._anywhere(request, body, raw)

    async def _anywhere(self, request: web.Request, body: bytes,
                        raw: list[str]) -> web.StreamResponse:
        """What any worker answers (definitions are shared): the first worker's answer,
        unless it is a 404 and another worker's is not (a worker that has not yet
        heard of an object another worker just declared; a 404 changed nothing). The
        node's name in the path (``/api/nodes/{name}``) is the asked worker's member
        name there."""
        named = [unquote(s) == self.node_name for s in raw]
        first: Answer | None = None
        for backend in self.backends():
            path = None
            if any(named):
                path = "/" + "/".join(quote(backend.node, safe="") if is_node else s
                                      for s, is_node in zip(raw, named, strict=True))
                if request.query_string:
                    path += "?" + request.query_string
            answer = await self._send(backend, request, body, path=path)
            if answer.status != 404:
                return self._respond(answer)
            first = first or answer
        assert first is not None  # handle() answers 503 when no worker serves
        return self._respond(first)

    # ------------------------------------------------------------------ one object
    async def _owner(self, request: web.Request, vhost: str, name: str) -> Backend | None:
        """The worker that owns queue ``vhost``/``name`` (raw path segments): the one
        whose page of the queue names it as ``node``; else any that has the queue."""
        answers = await self._all(request, b"", "GET", f"/api/queues/{vhost}/{name}")
        found = [(b, a.json()) for b, a in answers if a is not None and a.status == 200]
        for b, view in found:
            if isinstance(view, dict) and view.get("node") == b.node:
                return b
        return found[0][0] if found else None

    async def _to_owner(self, request: web.Request, body: bytes, vhost: str,
                        name: str) -> web.StreamResponse:
        owner = await self._owner(request, vhost, name)
        if owner is None:  # nobody has it (a 404 to give) or a PUT declaring it
            return await self._anywhere(request, body, request.raw_path.split(
                "?", 1)[0].split("/")[1:])
        return self._respond(await self._send(owner, request, body))

    async def _publish(self, request: web.Request, body: bytes,
                       raw: list[str]) -> web.StreamResponse:
        """A publish to the default exchange goes to the owner of the queue its routing
        key names (the other workers may not know a queue declared a moment ago). Any
        other goes to the first worker, and to the next while the answer is "routed":
        false or a 404 (nothing was enqueued: it has not yet heard of the exchange or a
        binding another worker just made, so trying again cannot duplicate)."""
        targets = list(self.backends())
        if unquote(raw[3]) in ("", "amq.default"):
            try:
                key = json.loads(body).get("routing_key")
            except (ValueError, AttributeError):
                key = None
            if isinstance(key, str) and key:
                owner = await self._owner(request, raw[2], quote(key, safe=""))
                targets = [owner] if owner is not None else targets
        first: Answer | None = None
        for target in targets:
            answer = await self._send(target, request, body)
            first = first or answer
            unrouted = answer.status == 404 or (
                answer.status == 200 and answer.json() == {"routed": False})
            if not unrouted:
                return self._respond(answer)
        assert first is not None
        return self._respond(first)

    async def _to_holder(self, request: web.Request, body: bytes, kind: str,
                         name: str) -> web.StreamResponse:
        """A connection or channel lives in one worker: ask each which has it."""
        answers = await self._all(request, b"", "GET", f"/api/{kind}/{name}")
        holder = next((b for b, a in answers if a is not None and a.status == 200),
                      self.backends()[0])
        return self._respond(await self._send(holder, request, body))

    # ------------------------------------------------------------------ merged answers
    async def _first_ok(self, request: web.Request, body: bytes, path: str | None = None,
                        ) -> tuple[Answer | None, list[tuple[Backend, Answer]]]:
        """Every worker's answer, and those that are 200. An error other than a 404 is
        the same from every worker (authentication, bad paging): the first worker's
        is the answer then. A 404 may only mean that worker has not yet heard of an
        object another just declared: any worker's 200 wins over it."""
        answers = await self._all(request, body, "GET", path)
        oks = [(b, a) for b, a in answers if a is not None and a.status == 200]
        first = answers[0][1]
        if first is None or (first.status != 200 and first.status != 404):
            return first, []
        return first, oks

    async def _merged_list(self, request: web.Request, body: bytes,
                           merge: Callable[[list[tuple[Backend, list[dict[str, Any]]]]],
                                           list[dict[str, Any]]]) -> web.StreamResponse:
        """Every worker's whole list (the list options taken off the query), merged by
        ``merge``, then filtered, sorted, paged and projected here, over the whole."""
        query = {k: v for k, v in request.query.items() if k not in LIST_OPTIONS}
        path = request.raw_path.split("?", 1)[0] + (
            "?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items())
            if query else "")
        first, oks = await self._first_ok(request, body, path)
        if not oks:
            return self._fail(first)
        lists = [(b, _items(a.json()) or []) for b, a in oks]
        return self._respond(oks[0][1], list_options(merge(lists), request.query))

    async def _concatenated(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Connections and channels: each worker's own, one after the other."""
        return await self._merged_list(
            request, body, lambda lists: [i for _b, items in lists for i in items])

    @staticmethod
    def _runners_own(lists: list[tuple[Backend, list[dict[str, Any]]]],
                     ) -> list[dict[str, Any]]:
        """Shovels and federation links: each worker lists its own (its member name as
        ``node``) and what the others shared a moment earlier (a shovel just started
        elsewhere may be missing there, one just stopped still present); each once,
        from the worker that runs it, else the first copy; in a single node's order."""
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        for backend, items in lists:
            for item in items:
                key = (item.get("vhost"), item.get("type"), item.get("name", item.get("id")))
                if key not in out or item.get("node") == backend.node:
                    out[key] = item
        return sorted(out.values(), key=lambda i: (
            str(i.get("vhost", "")),
            str(i.get("name") or i.get("exchange") or i.get("queue") or ""),
            str(i.get("upstream", "")), str(i.get("node", ""))))

    async def _runner(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """One shovel: the answer of the worker that runs it (a static shovel: worker
        0), else what the first worker that knows it says (it runs nowhere now)."""
        answers = await self._all(request, body)
        for backend, answer in answers:
            if answer is not None and answer.status == 200:
                got = answer.json()
                if isinstance(got, dict) and got.get("node") == backend.node:
                    return self._respond(answer)
        return await self._anywhere(request, body, [])

    async def _queue_list(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Every worker lists every queue it has heard of; a queue's figures are its
        owner's (the others' copy of it counts nothing)."""
        return await self._merged_list(request, body, owners_queues)

    async def _exchange_list(self, request: web.Request,
                             body: bytes) -> web.StreamResponse:
        """Every exchange once; ``message_stats`` summed over the workers (each counts
        what its own publishers sent)."""
        def merge(lists: list[tuple[Backend, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
            out: dict[tuple[Any, Any], dict[str, Any]] = {}
            for _b, items in lists:
                for item in items:
                    key = (item.get("vhost"), item.get("name"))
                    if key in out:
                        _add_message_stats(out[key], item)
                    else:
                        out[key] = item
            return list(out.values())

        return await self._merged_list(request, body, merge)

    async def _exchange(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """One exchange, its ``message_stats`` summed over the workers."""
        first, oks = await self._first_ok(request, body)
        if not oks:
            return self._fail(first)
        base = oks[0][1].json()
        for _b, a in oks[1:]:
            _add_message_stats(base, a.json())
        return self._respond(oks[0][1], base)

    async def _overview(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """The first worker's overview (definitions are shared: its exchange count is
        the node's) with every worker's figures added: each worker is asked with
        ``amqpd_led_only`` (only the queues it owns: a copy of another worker's queue
        repeats the owner's figures and counts again what it forwards), so the sums of
        ``message_stats``, ``queue_totals`` (their rates and samples too:
        :func:`sum_stats`) and the connection, channel, queue and consumer totals count
        each message, queue and consumer once."""
        query = [(k, v) for k, v in request.query.items() if k != "amqpd_led_only"]
        query.append(("amqpd_led_only", "true"))
        path = "/api/overview?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query)
        first, oks = await self._first_ok(request, body, path)
        if not oks:
            return self._fail(first)
        base = oks[0][1].json()
        if not isinstance(base, dict):
            return self._respond(oks[0][1])
        totals = base.get("object_totals")
        for _b, a in oks[1:]:
            other = a.json()
            if not isinstance(other, dict):
                continue
            for key in ("message_stats", "queue_totals"):
                mine, theirs = base.get(key), other.get(key)
                if isinstance(mine, dict) and isinstance(theirs, dict):
                    sum_stats(mine, theirs)
                elif isinstance(theirs, dict) and theirs:
                    base[key] = copy.deepcopy(theirs)
            theirs = other.get("object_totals")
            if isinstance(totals, dict) and isinstance(theirs, dict):
                for key in OVERVIEW_SUMMED:
                    if _number(totals.get(key)) and _number(theirs.get(key)):
                        totals[key] += theirs[key]
        if self.node_listeners is not None and "listeners" in base:
            # the node's ports (amqp, amqps, http or https), not the first worker's
            # private loopback ones
            base["listeners"] = [{"node": self.node_name, "protocol": proto,
                                  "ip_address": host, "port": port, "socket_opts": {}}
                                 for proto, host, port in self.node_listeners()]
        return self._respond(oks[0][1], base)

    async def _nodes(self, request: web.Request, body: bytes,
                     one: bool) -> web.StreamResponse:
        """``/api/nodes`` and ``/api/nodes/{node}``: the node's entry made of every
        worker's own (each asked for its member name), figures summed or the largest
        taken as :data:`NODE_SUMMED` and :data:`NODE_MAX` say, alarms if any worker's;
        the rest is the first worker's, the pid the supervisor's. A list keeps the
        first worker's other entries (a warren's peers)."""
        backends = list(self.backends())
        query = "?" + request.query_string if request.query_string else ""
        got = await asyncio.gather(*(
            self._send(b, request, b"", "GET", f"/api/nodes/{quote(b.node, safe='')}{query}")
            for b in backends), return_exceptions=True)
        first = got[0]
        if not isinstance(first, Answer) or first.status != 200:
            # authentication and the like: the first worker's refusal is the node's
            return self._fail(first if isinstance(first, Answer) else None)
        entries = [a.json() for a in got if isinstance(a, Answer) and a.status == 200]
        entry = merge_node_entries([e for e in entries if isinstance(e, dict)])
        entry["os_pid"] = str(os.getpid())  # the supervisor's: the node's process
        if one:
            return self._respond(first, entry)
        listed = await self._send(backends[0], request, body)
        nodes = listed.json() if listed.status == 200 else None
        if not isinstance(nodes, list):
            return self._respond(listed)
        members = {b.node for b in backends}
        others = [n for n in nodes if not (isinstance(n, dict) and n.get("name") in members)]
        return self._respond(listed, [entry, *others])

    async def _metrics(self, request: web.Request, body: bytes,
                       which: str) -> web.StreamResponse:
        """Prometheus text (no credentials, as on one worker). ``/metrics``,
        ``/metrics/per-object`` and ``/metrics/detailed``: every worker's, each asked
        for the queues it owns only (``amqpd_led_only``), merged by
        :func:`merge_prometheus`. ``/metrics/per-worker`` (amqpd's own): every worker's
        ``/metrics`` of its own queues, each sample labelled ``worker="N"``."""
        query = [(k, v) for k, v in request.query.items() if k != "amqpd_led_only"]
        query.append(("amqpd_led_only", "true"))
        path = "/metrics" + (f"/{which}" if which and which != "per-worker" else "") + \
            "?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query)
        answers = await self._all(request, b"", "GET", path)
        texts = [(b, a.body.decode()) for b, a in answers if a is not None and a.status == 200]
        if not texts:
            return self._fail(next((a for _b, a in answers if a is not None), None))
        members = {b.node for b in self.backends()}
        renamed = [(b, rename_labels(t, members, self.node_name)) for b, t in texts]
        if which == "per-worker":
            text = merge_prometheus([], [label_worker(t, b.index) for b, t in renamed])
        else:
            text = merge_prometheus(list(PROMETHEUS_MAX), [t for _b, t in renamed])
        return web.Response(text=text, headers={"Content-Type": PROMETHEUS_TYPE})

    def _fail(self, answer: Answer | None) -> web.StreamResponse:
        if answer is None:
            raise HttpError(503, "unavailable", "no worker answered")
        return self._respond(answer)

    # ------------------------------------------------------------------ the node's own
    async def _workers(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Per-worker figures, for an authenticated user (asked of the first worker)."""
        answer = await self._send(self.backends()[0], request, b"", "GET", "/api/whoami")
        if answer.status != 200:
            return self._respond(answer)
        return web.json_response(self.workers_info())

    async def _port_listener(self, request: web.Request, body: bytes,
                             port: str) -> web.StreamResponse:
        """The node's ports, not the worker's private ones (the worker checks the
        credentials and the port's syntax, as for its own)."""
        answer = await self._send(self.backends()[0], request, body)
        if answer.status not in (200, 503):
            return self._respond(answer)
        ports = self.node_ports()
        if int(port) in ports:
            return self._respond(answer.with_status(200),
                                 {"status": "ok", "port": int(port)})
        return self._respond(answer.with_status(503),
                             {"status": "failed", "reason": "No active listener",
                              "missing": int(port), "ports": ports})

    async def _alarms(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Each worker raises its own memory alarm (on its share of the node's limit):
        the node is in alarm if any worker is, and says so with that worker's answer."""
        answers = await self._all(request, body)
        for _b, a in answers:
            if a is not None and a.status != 200:
                return self._respond(a)
        first = answers[0][1]
        return self._fail(first)

    async def _watermark(self, request: web.Request, body: bytes,
                         raw: list[str]) -> web.StreamResponse:
        """``PUT /api/nodes/{node}/memory-high-watermark`` sets the node's limit: each
        worker gets its share (the limit divided by the workers, as at start,
        docs/workers.md); the answer sums their limits and lists every alarm."""
        try:
            wanted = json.loads(body)
        except ValueError:
            wanted = None
        backends = list(self.backends())
        share: dict[str, Any] | None = None
        if isinstance(wanted, dict):
            fraction: Any = wanted.get("fraction")
            absolute: Any = wanted.get("absolute")
            if _number(absolute) and isinstance(absolute, int) and absolute >= 0:
                # at least a byte: a share of 0 would be "no limit" for the worker
                # (absolute 1, a test's way to raise the alarm, left every worker
                # without one); 0 stays 0, no limit, as on one node
                share = {"absolute": max(absolute // len(backends), min(absolute, 1))}
            elif _number(fraction) and 0 <= fraction <= 1:
                share = {"fraction": fraction / len(backends)}
        if share is None:  # the worker refuses it with its own 400
            return await self._anywhere(request, body, raw)
        sent = json.dumps(share).encode()
        answers = []
        for b in backends:
            path = f"/api/nodes/{quote(b.node, safe='')}/memory-high-watermark"
            answers.append(await self._send(b, request, sent, path=path))
        bad = next((a for a in answers if a.status != 200), None)
        if bad is not None:
            return self._respond(bad)
        limit, alarms = 0, list[Any]()
        for a in answers:
            got = a.json() or {}
            limit += got.get("memory_limit") or 0
            alarms.extend(x for x in got.get("alarms") or [] if x not in alarms)
        return self._respond(answers[0], {"memory_limit": limit, "alarms": alarms})

    async def _quorum_critical(self, request: web.Request,
                               body: bytes) -> web.StreamResponse:
        """A multi-worker node is one node (phase 1 refuses ``[cluster]``): a quorum
        queue's members are all in it, so stopping it is what a single node's stop is,
        and the answer is a single node's. The workers' private cluster would count a
        quorum queue with a member per worker critical."""
        answer = await self._send(self.backends()[0], request, body)
        if answer.status not in (200, 503):
            return self._respond(answer)
        return self._respond(answer.with_status(200),
                             {"status": "ok", "reason": "single node cluster"})


def _is_json(headers: list[tuple[str, str]]) -> bool:
    return any(k.lower() == "content-type" and v.startswith("application/json")
               for k, v in headers)


def as_node(body: Any, members: set[str], node: str) -> Any:
    """``body`` with every string that is a worker's member name replaced by the node's
    name: a single node shows its name as a queue's ``node``, a quorum queue's
    ``leader`` and ``members``, the one entry of ``/api/nodes``. A list that named
    several workers names the node once (dicts by their ``name``)."""
    if isinstance(body, str):
        return node if body in members else body
    if isinstance(body, dict):
        return {k: as_node(v, members, node) for k, v in body.items()}
    if not isinstance(body, list):
        return body
    out: list[Any] = []
    seen: set[str] = set()
    for item in body:
        renamed = as_node(item, members, node)
        key = renamed if isinstance(renamed, str) else (
            renamed.get("name") if isinstance(renamed, dict) else None)
        if key == node and ((isinstance(item, str) and item in members) or (
                isinstance(item, dict) and item.get("name") in members)):
            if node in seen:
                continue
            seen.add(node)
        out.append(renamed)
    return out


def _add_message_stats(into: Any, other: Any) -> None:
    if not isinstance(into, dict) or not isinstance(other, dict):
        return
    theirs = other.get("message_stats")
    if not isinstance(theirs, dict) or not theirs:
        return
    mine = into.get("message_stats")
    if not isinstance(mine, dict) or not mine:
        into["message_stats"] = copy.deepcopy(theirs)
    else:
        sum_stats(mine, theirs)


def owners_queues(lists: list[tuple[Backend, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Every queue once, as its owner lists it (the worker it names as ``node``; the
    first worker that lists it while no owner does)."""
    out: dict[tuple[Any, Any], dict[str, Any]] = {}
    for b, items in lists:
        for item in items:
            key = (item.get("vhost"), item.get("name"))
            if key not in out or item.get("node") == b.node:
                out[key] = item
    return list(out.values())


def merge_node_entries(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``/api/nodes`` entry of the workers' own: :data:`NODE_SUMMED` summed,
    :data:`NODE_MAX` the largest, :data:`NODE_ANY` true if any is, the rest the
    first's (``disk_free`` and its limit: the workers share one data directory's disk)."""
    out = dict(entries[0]) if entries else {}
    for key in NODE_SUMMED:
        values = [e[key] for e in entries if _number(e.get(key))]
        if values:
            out[key] = sum(values)
    for key in NODE_MAX:
        values = [e[key] for e in entries if _number(e.get(key))]
        if values:
            out[key] = max(values)
    for key in NODE_ANY:
        if key in out:
            out[key] = any(bool(e.get(key)) for e in entries)
    return out


def rename_labels(text: str, members: set[str], node: str) -> str:
    """Prometheus text with a worker's member name as a label value (the identity
    series' ``rabbitmq_node``) made the node's name."""
    for member in members:
        text = text.replace(f'="{member}"', f'="{node}"')
    return text


def label_worker(text: str, index: int) -> str:
    """Prometheus text with ``worker="index"`` added to every sample's labels."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            label = f'worker="{index}"'
            series = (series[:-1] + "," + label + "}") if series.endswith("}") else (
                series + "{" + label + "}")
            line = f"{series} {value}"
        out.append(line)
    return "\n".join(out) + "\n"


def merge_prometheus(maxed: list[str], texts: list[str]) -> str:
    """One exposition of several (amqpd/http/metrics.py's format: each family's TYPE
    and HELP, then its samples): a counter's or gauge's samples with the same name
    and labels summed (the largest taken for a family in ``maxed``), an untyped one's
    (build and identity info) kept from the first text; families and samples in
    first-seen order."""
    families: dict[str, tuple[list[str], str, dict[str, int | float]]] = {}
    for text in texts:
        family: tuple[list[str], str, dict[str, int | float]] | None = None
        name = ""
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _t, _k, name, kind = line.split(" ", 3)
                family = families.setdefault(name, ([], kind, {}))
                if not family[0]:
                    family[0].append(line)
                continue
            if line.startswith("# HELP "):
                if family is not None and len(family[0]) == 1:
                    family[0].append(line)
                continue
            if not line or line.startswith("#") or family is None:
                continue
            series, raw = line.rsplit(" ", 1)
            value = _sample_value(raw)
            samples = family[2]
            mine = samples.get(series)
            if mine is None:
                samples[series] = value
            elif family[1] in ("counter", "gauge"):
                samples[series] = max(mine, value) if name in maxed else mine + value
    lines = []
    for header, _kind, samples in families.values():
        lines.extend(header)
        lines.extend(f"{series} {_sample_text(v)}" for series, v in samples.items())
    return "\n".join(lines) + "\n"


def _sample_value(raw: str) -> int | float:
    try:
        return int(raw)
    except ValueError:
        return float(raw)


def _sample_text(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
