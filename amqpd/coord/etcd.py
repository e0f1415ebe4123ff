"""An asyncio etcd v3 client over etcd's JSON gateway (``/v3/...``), on aiohttp.

Why not a PyPI client: the maintained asyncio etcd v3 client (aetcd) speaks gRPC, so it
would bring grpcio and protobuf (large compiled wheels) for the six calls used here;
etcd's own JSON gateway (served on the client port by every etcd since 3.3, Debian's
etcd-server 3.4 included) needs nothing but the aiohttp the HTTP API already uses. The
gateway is a thin mapping of the gRPC messages: keys and values travel base64-encoded,
64-bit integers as decimal strings, and fields that hold their zero value are left out.

Only what leader election and the cluster need is here: leases (grant, keep-alive,
revoke), single-key and prefix reads, puts, deletes, transactions, and prefix watches
(the gateway's streaming ``/v3/watch``: one JSON object per line). Every call has a
deadline (``timeout``, overridable per call): a coordinator that does not answer in time
is the same as one that is gone, and callers (the election's fencing above all) must
learn it promptly.
Several endpoints may be given; a call that cannot reach one tries the next within the
same deadline.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger("amqpd.coord.etcd")

# etcd's gRPC status code for "not found" (an expired or revoked lease)
GRPC_NOT_FOUND = 5


class EtcdError(Exception):
    """An etcd call failed; the message says which and why."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the deadline (network, timeout, server down)."""


class EtcdRequestError(EtcdError):
    """etcd answered with an error (``code`` is the gRPC status code)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(_unb64(kv.get("key")), _unb64(kv.get("value")),
                   int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)),
                   int(kv.get("version", 0)), int(kv.get("lease", 0)))

    def json(self) -> Any:
        """The value decoded as JSON (the election stores its records that way)."""
        return json.loads(self.value)


@dataclass(frozen=True)
class Lease:
    id: int
    ttl: int


# ---------------------------------------------------------------------------- transactions
_RESULTS = {"==": "EQUAL", "!=": "NOT_EQUAL", ">": "GREATER", "<": "LESS"}
_TARGETS = {"create": ("CREATE", "create_revision"), "mod": ("MOD", "mod_revision"),
            "version": ("VERSION", "version"), "lease": ("LEASE", "lease"),
            "value": ("VALUE", "value")}


@dataclass(frozen=True)
class Compare:
    """One guard of a transaction: ``Compare("create", key, "==", 0)`` holds when the
    key does not exist; ``"mod"`` compares the last modification revision, ``"lease"``
    the lease a key is attached to, ``"value"`` its bytes."""

    target: str
    key: bytes | str
    op: str
    operand: int | bytes

    def to_json(self) -> dict[str, Any]:
        target, field_name = _TARGETS[self.target]
        value: Any = (_b64(self.operand) if isinstance(self.operand, bytes)
                      else str(self.operand))
        return {"key": _b64(self.key), "target": target, "result": _RESULTS[self.op],
                field_name: value}


@dataclass(frozen=True)
class Put:
    key: bytes | str
    value: bytes | str
    lease: int = 0

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": _b64(self.key), "value": _b64(self.value)}
        if self.lease:
            body["lease"] = str(self.lease)
        return {"request_put": body}


@dataclass(frozen=True)
class Get:
    key: bytes | str

    def to_json(self) -> dict[str, Any]:
        return {"request_range": {"key": _b64(self.key)}}


@dataclass(frozen=True)
class Delete:
    key: bytes | str

    def to_json(self) -> dict[str, Any]:
        return {"request_delete_range": {"key": _b64(self.key)}}


Op = Put | Get | Delete


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by a watch: ``deleted`` or a put of ``kv`` (whose ``value`` is
    empty for a delete), at ``kv.mod_revision``."""

    deleted: bool
    kv: KeyValue


class WatchCompacted(EtcdError):
    """The watch's start revision was compacted away: read the prefix again, then watch
    from the revision that read answered at."""


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    # one entry per operation of the branch that ran: the key-values of a Get, else []
    responses: list[list[KeyValue]]


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (etcd's range_end)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"


# ---------------------------------------------------------------------------- the client
class EtcdClient:
    def __init__(self, endpoints: Sequence[str], timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("etcd: no endpoint given")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self._current = 0  # the endpoint that answered last: tried first next time
        self._session: aiohttp.ClientSession | None = None
        # called after every successful answer: whoever decides "etcd is reachable"
        # (cluster membership) hears of every call that got through, not only its own
        self.on_answer: Callable[[], None] | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, path: str, body: dict[str, Any],
                   timeout: float | None = None) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` on the first endpoint that answers in time."""
        if self._session is None:
            # no connection reuse across calls to a dead endpoint: a fresh connect is what
            # tells us quickly that it is gone
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=16, force_close=False))
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        errors: list[str] = []
        n = len(self.endpoints)
        for attempt in range(n):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            index = (self._current + attempt) % n
            url = f"{self.endpoints[index]}/v3/{path}"
            # one endpoint may not take the whole deadline while others could answer
            share = left if attempt == n - 1 else max(left / (n - attempt), 0.05)
            try:
                async with self._session.post(
                        url, json=body, timeout=aiohttp.ClientTimeout(total=share)) as resp:
                    text = await resp.text()
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                errors.append(f"{url}: {type(exc).__name__} {exc}".strip())
                continue
            self._current = index
            try:
                answer = json.loads(text) if text else {}
            except ValueError:
                raise EtcdError(f"etcd {path}: not JSON (HTTP {resp.status}): {text[:200]}")
            if "error" in answer or resp.status >= 400:
                message = answer.get("message") or answer.get("error") or text[:200]
                raise EtcdRequestError(f"etcd {path}: {message}", int(answer.get("code", 0)))
            if self.on_answer is not None:
                self.on_answer()
            return answer
        raise EtcdUnavailable(f"etcd {path}: no endpoint answered in time ("
                              + "; ".join(errors or ["deadline passed"]) + ")")

    # ------------------------------------------------------------------ leases
    async def grant(self, ttl: int, timeout: float | None = None) -> Lease:
        answer = await self.call("lease/grant", {"TTL": str(int(ttl))}, timeout)
        return Lease(int(answer["ID"]), int(answer.get("TTL", 0)))

    async def keepalive(self, lease_id: int, timeout: float | None = None) -> int:
        """Renew a lease once; answers its new TTL in seconds, 0 if it no longer exists."""
        answer = await self.call("lease/keepalive", {"ID": str(lease_id)}, timeout)
        result = answer.get("result", answer)
        return int(result.get("TTL", 0))

    async def revoke(self, lease_id: int, timeout: float | None = None) -> bool:
        """Revoke a lease (its keys go at once); False if it had already expired."""
        try:
            await self.call("lease/revoke", {"ID": str(lease_id)}, timeout)
        except EtcdRequestError as exc:
            if exc.code == GRPC_NOT_FOUND:
                return False
            raise
        return True

    # ------------------------------------------------------------------ keys
    async def get(self, key: bytes | str, timeout: float | None = None) -> KeyValue | None:
        answer = await self.call("kv/range", {"key": _b64(key)}, timeout)
        kvs = answer.get("kvs") or []
        return KeyValue.from_json(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: bytes | str,
                         timeout: float | None = None) -> list[KeyValue]:
        raw = prefix.encode() if isinstance(prefix, str) else prefix
        answer = await self.call("kv/range", {"key": _b64(raw),
                                              "range_end": _b64(_prefix_end(raw))}, timeout)
        return [KeyValue.from_json(kv) for kv in answer.get("kvs") or []]

    async def range_prefix(self, prefix: bytes | str,
                           timeout: float | None = None) -> tuple[int, list[KeyValue]]:
        """Every key under ``prefix`` and the store revision the read saw (watch from the
        next one to miss nothing and see nothing twice)."""
        raw = prefix.encode() if isinstance(prefix, str) else prefix
        answer = await self.call("kv/range", {"key": _b64(raw),
                                              "range_end": _b64(_prefix_end(raw))}, timeout)
        revision = int(answer.get("header", {}).get("revision", 0))
        return revision, [KeyValue.from_json(kv) for kv in answer.get("kvs") or []]

    async def watch_prefix(self, prefix: bytes | str, start_revision: int,
                           connect_timeout: float | None = None,
                           ) -> AsyncIterator[list[WatchEvent]]:
        """Changes under ``prefix`` from ``start_revision`` on, one list per etcd
        response (the changes of one revision travel together), until the stream ends
        (raises :class:`EtcdUnavailable`) or the revision was compacted
        (:class:`WatchCompacted`). The caller decides how long it waits for the next
        batch; the stream itself has no deadline (etcd sends progress only on changes).
        """
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=16, force_close=False))
        raw = prefix.encode() if isinstance(prefix, str) else prefix
        body = {"create_request": {"key": _b64(raw), "range_end": _b64(_prefix_end(raw)),
                                   "start_revision": str(start_revision)}}
        url = f"{self.endpoints[self._current]}/v3/watch"
        timeout = self.timeout if connect_timeout is None else connect_timeout
        try:
            async with self._session.post(url, json=body, timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=timeout)) as resp:
                if resp.status >= 400:
                    raise EtcdRequestError(f"etcd watch: HTTP {resp.status}", 0)
                async for line in resp.content:
                    if not line.strip():
                        continue
                    try:
                        answer = json.loads(line)
                    except ValueError as exc:
                        raise EtcdError(f"etcd watch: not JSON: {line[:200]!r}") from exc
                    if "error" in answer:
                        raise EtcdRequestError(f"etcd watch: {answer['error']}",
                                               int(answer["error"].get("grpc_code", 0)))
                    result = answer.get("result") or {}
                    if int(result.get("compact_revision", 0) or 0):
                        raise WatchCompacted(f"etcd watch: revision {start_revision} was "
                                             f"compacted (now {result['compact_revision']})")
                    if result.get("canceled"):
                        raise EtcdUnavailable("etcd watch: canceled by the server: "
                                              + str(result.get("cancel_reason", "")))
                    events = [WatchEvent(e.get("type") == "DELETE",
                                         KeyValue.from_json(e.get("kv") or {}))
                              for e in result.get("events") or []]
                    if events:
                        yield events
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._current = (self._current + 1) % len(self.endpoints)
            raise EtcdUnavailable(f"etcd watch on {url}: {type(exc).__name__} {exc}") from exc
        self._current = (self._current + 1) % len(self.endpoints)
        raise EtcdUnavailable(f"etcd watch on {url}: the stream ended")

    async def put(self, key: bytes | str, value: bytes | str, lease: int = 0,
                  timeout: float | None = None) -> int:
        answer = await self.call("kv/put", Put(key, value, lease).to_json()["request_put"],
                                 timeout)
        return int(answer.get("header", {}).get("revision", 0))

    async def delete(self, key: bytes | str, timeout: float | None = None) -> int:
        answer = await self.call("kv/deleterange", {"key": _b64(key)}, timeout)
        return int(answer.get("deleted", 0))

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = (), timeout: float | None = None) -> TxnResult:
        """All ``compare`` guards hold -> ``success`` runs, else ``failure``; atomically."""
        answer = await self.call("kv/txn", {
            "compare": [c.to_json() for c in compare],
            "success": [op.to_json() for op in success],
            "failure": [op.to_json() for op in failure],
        }, timeout)
        responses: list[list[KeyValue]] = []
        for item in answer.get("responses") or []:
            ranged = item.get("response_range")
            responses.append([KeyValue.from_json(kv) for kv in (ranged or {}).get("kvs") or []])
        return TxnResult(bool(answer.get("succeeded", False)),
                         int(answer.get("header", {}).get("revision", 0)), responses)


__all__ = ["Compare", "Delete", "EtcdClient", "EtcdError", "EtcdRequestError",
           "EtcdUnavailable", "Get", "KeyValue", "Lease", "Put", "TxnResult", "WatchCompacted",
           "WatchEvent"]


async def delete_own(etcd: EtcdClient, key: str, revision: int,
                     still_ours: Callable[[bytes], bool], attempts: int = 5) -> bool:
    """Delete ``key`` if it is still the record this node wrote: guarded by
    ``revision`` (its last write as known here), and when that guard fails (a write of
    ours that was in flight landed after ``revision`` was read, or ``revision`` was not
    known: 0 or less) by the record's current revision, as long as ``still_ours`` says
    its value is ours (not a successor's). True once it is gone; False when it is not
    ours or it kept changing for ``attempts`` reads."""
    for _ in range(attempts):
        if revision > 0:
            result = await etcd.txn([Compare("mod", key, "==", revision)], [Delete(key)])
            if result.succeeded:
                return True
        kv = await etcd.get(key)
        if kv is None:
            return True
        if not still_ours(kv.value):
            return False
        revision = kv.mod_revision
    return False
