"""The node-local coordination store served in the shape of etcd's v3 JSON gateway.

The workers' cluster layer talks to it with :class:`amqpd.coord.etcd.EtcdClient`, as it
would to etcd, so nothing in amqpd/cluster/ knows it is not etcd (docs/workers.md).
Only what that client sends is understood: ``kv/range`` (with ``range_end``,
``count_only``, ``keys_only``, ``limit``, sorted by key or create revision),
``kv/put``, ``kv/deleterange``, ``kv/txn``, ``lease/grant``, ``lease/keepalive``,
``lease/revoke`` and the streaming ``watch`` (one JSON object per line). Anything else
is answered 404 with a log line, so a new call in the cluster layer fails loudly here
instead of silently doing nothing. It listens on loopback only: the workers are
processes of this node, and the cluster cookie still guards their links.

The gateway's encoding: keys and values base64, 64-bit integers as decimal strings,
fields holding their zero value left out (enum zeroes: ``PUT``, ``EQUAL``,
``VERSION``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from amqpd.workers.kvstate import INVALID, Entry, Event, KVError, KVState, in_range

log = logging.getLogger("amqpd.workers.localkv")

EXPIRY_INTERVAL: Final = 0.1  # seconds between lease expiry checks
# seconds between checks that a quiet watch's client is still there (aiohttp does not
# cancel a handler whose client left, and a watch only writes when its keys change)
WATCH_CHECK: Final = 1.0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    return base64.b64decode(text) if text else b""


def _kv_json(key: bytes, e: Entry, keys_only: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"key": _b64(key), "create_revision": str(e.create),
                           "mod_revision": str(e.mod), "version": str(e.version)}
    if e.value and not keys_only:
        out["value"] = _b64(e.value)
    if e.lease:
        out["lease"] = str(e.lease)
    return out


def _compare(c: dict[str, Any]) -> dict[str, Any]:
    target = c.get("target", "VERSION")
    field = {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision",
             "VALUE": "value", "LEASE": "lease"}.get(target)
    if field is None:
        raise KVError(f"unknown compare target {target!r}", INVALID)
    operand: int | bytes = (_unb64(c.get(field)) if target == "VALUE"
                            else int(c.get(field, 0) or 0))
    return {"key": _unb64(c.get("key")), "target": target,
            "result": c.get("result", "EQUAL"), "operand": operand}


def _op(body: dict[str, Any]) -> tuple[str, bytes, bytes, bytes, int]:
    if "request_put" in body:
        p = body["request_put"]
        return ("put", _unb64(p.get("key")), _unb64(p.get("value")), b"",
                int(p.get("lease", 0) or 0))
    if "request_delete_range" in body:
        d = body["request_delete_range"]
        return ("delete", _unb64(d.get("key")), b"", _unb64(d.get("range_end")), 0)
    if "request_range" in body:
        g = body["request_range"]
        return ("get", _unb64(g.get("key")), b"", _unb64(g.get("range_end")), 0)
    raise KVError(f"unknown transaction operation {sorted(body)}", INVALID)


class LocalKV:
    """The HTTP face of a :class:`KVState` on ``host:port`` (0: ephemeral)."""

    def __init__(self, path: Path | None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = KVState(path, time.monotonic)
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._expiry: asyncio.Task[None] | None = None
        self._watches: set[asyncio.Task[Any]] = set()
        app = web.Application()
        for name, handler in (("kv/range", self._range), ("kv/put", self._put),
                              ("kv/deleterange", self._delete), ("kv/txn", self._txn),
                              ("lease/grant", self._grant),
                              ("lease/keepalive", self._keepalive),
                              ("lease/revoke", self._revoke)):
            app.router.add_post(f"/v3/{name}", self._wrap(handler))
        app.router.add_post("/v3/watch", self._watch)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._app = app

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self.state.open()
        self._runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        server: Any = site._server
        self.port = server.sockets[0].getsockname()[1]
        self._expiry = asyncio.create_task(self._expire_loop())
        log.info("node-local coordination store on %s (revision %d)", self.url,
                 self.state.revision)

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for task in list(self._watches):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.state.close()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_INTERVAL)
            if self.state.expire():
                log.debug("leases expired")

    def _header(self) -> dict[str, Any]:
        return {"revision": str(self.state.revision)}

    def _wrap(self, handler: Any) -> Any:
        async def run(request: web.Request) -> web.Response:
            try:
                body = await request.json()
            except ValueError:
                return web.json_response({"error": "not JSON", "message": "not JSON",
                                          "code": INVALID}, status=400)
            try:
                answer = handler(body)
            except KVError as exc:
                log.info("coordination store refused %s: %s", request.path, exc)
                return web.json_response({"error": str(exc), "message": str(exc),
                                          "code": exc.code},
                                         status=404 if exc.code == 5 else 400)
            return web.json_response(answer)
        return run

    async def _unknown(self, request: web.Request) -> web.Response:
        log.warning("coordination store: no such call %s %s", request.method, request.path)
        return web.json_response({"error": "not implemented", "code": 12,
                                  "message": f"{request.path} is not served here"},
                                 status=404)

    # ------------------------------------------------------------------ kv
    def _range(self, body: dict[str, Any]) -> dict[str, Any]:
        found = self.state.range(_unb64(body.get("key")), _unb64(body.get("range_end")))
        answer: dict[str, Any] = {"header": self._header()}
        if found:
            answer["count"] = str(len(found))
        if body.get("count_only"):
            return answer
        if body.get("sort_target") == "CREATE":
            found.sort(key=lambda kv: kv[1].create,
                       reverse=body.get("sort_order") == "DESCEND")
        limit = int(body.get("limit", 0) or 0)
        if limit:
            if len(found) > limit:
                answer["more"] = True
            found = found[:limit]
        keys_only = bool(body.get("keys_only"))
        if found:
            answer["kvs"] = [_kv_json(k, e, keys_only) for k, e in found]
        return answer

    def _put(self, body: dict[str, Any]) -> dict[str, Any]:
        self.state.write([_op({"request_put": body})])
        return {"header": self._header()}

    def _delete(self, body: dict[str, Any]) -> dict[str, Any]:
        (deleted,) = self.state.write([_op({"request_delete_range": body})])
        answer: dict[str, Any] = {"header": self._header()}
        if deleted:
            answer["deleted"] = str(deleted)
        return answer

    def _txn(self, body: dict[str, Any]) -> dict[str, Any]:
        compares = [_compare(c) for c in body.get("compare") or []]
        ok = all(self.state.compare(c) for c in compares)
        ops = [_op(o) for o in body.get("success" if ok else "failure") or []]
        results = self.state.write(ops)
        responses: list[dict[str, Any]] = []
        for (kind, *_rest), result in zip(ops, results, strict=True):
            if kind == "get":
                ranged: dict[str, Any] = {"header": self._header()}
                if result:
                    ranged["kvs"] = [_kv_json(k, e) for k, e in result]
                    ranged["count"] = str(len(result))
                responses.append({"response_range": ranged})
            elif kind == "put":
                responses.append({"response_put": {"header": self._header()}})
            else:
                responses.append({"response_delete_range": {"header": self._header(),
                                                            "deleted": str(result)}})
        answer: dict[str, Any] = {"header": self._header(), "responses": responses}
        if ok:
            answer["succeeded"] = True
        return answer

    # ------------------------------------------------------------------ leases
    def _grant(self, body: dict[str, Any]) -> dict[str, Any]:
        ttl = int(body.get("TTL", 0) or 0)
        if ttl <= 0:
            raise KVError("etcdserver: lease TTL must be positive", INVALID)
        return {"header": self._header(), "ID": str(self.state.grant(ttl)), "TTL": str(ttl)}

    def _keepalive(self, body: dict[str, Any]) -> dict[str, Any]:
        lease = int(body.get("ID", 0) or 0)
        ttl = self.state.keepalive(lease)
        result: dict[str, Any] = {"header": self._header(), "ID": str(lease)}
        if ttl:
            result["TTL"] = str(ttl)
        return {"result": result}

    def _revoke(self, body: dict[str, Any]) -> dict[str, Any]:
        self.state.revoke(int(body.get("ID", 0) or 0))
        return {"header": self._header()}

    # ------------------------------------------------------------------ watch
    async def _watch(self, request: web.Request) -> web.StreamResponse:
        try:
            create = (await request.json())["create_request"]
        except (ValueError, KeyError):
            return web.json_response({"error": "no create_request", "code": INVALID},
                                     status=400)
        start = _unb64(create.get("key"))
        end = _unb64(create.get("range_end"))
        from_rev = int(create.get("start_revision", 0) or 0)
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        queue: asyncio.Queue[list[Event]] = asyncio.Queue()
        past = self.state.since(from_rev) if from_rev else []
        if past is None:
            line = {"result": {"header": self._header(), "created": True,
                               "compact_revision": str(self.state.compacted)}}
            await resp.write(json.dumps(line).encode() + b"\n")
            return resp

        def watcher(events: list[Event]) -> None:
            mine = [e for e in events if in_range(e.key, start, end)]
            if mine:
                queue.put_nowait(mine)

        self.state.watchers.append(watcher)  # no await since ``since``: nothing missed
        task = asyncio.current_task()
        if task is not None:
            self._watches.add(task)
        try:
            await resp.write(json.dumps({"result": {"header": self._header(),
                                                    "created": True}}).encode() + b"\n")
            watcher(past)
            while True:
                try:
                    events = await asyncio.wait_for(queue.get(), WATCH_CHECK)
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break
                    continue
                by_rev: dict[int, list[Event]] = {}
                for e in events:
                    by_rev.setdefault(e.revision, []).append(e)
                for rev, group in sorted(by_rev.items()):
                    out = [{"type": "DELETE", "kv": {"key": _b64(e.key),
                                                     "mod_revision": str(rev)}}
                           if e.deleted else {"kv": _kv_json(e.key, e.entry)}
                           for e in group]
                    line = {"result": {"header": {"revision": str(rev)}, "events": out}}
                    await resp.write(json.dumps(line).encode() + b"\n")
        except ConnectionResetError:
            pass  # the worker went away; its next watch starts over
        finally:
            self.state.watchers.remove(watcher)
            if task is not None:
                self._watches.discard(task)
        return resp


__all__ = ["LocalKV"]
