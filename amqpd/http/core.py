"""Plumbing shared by every resource module: routing, auth, errors, JSON in and out.

Routing is done on the *raw* request path, split on ``/`` and unquoted segment by
segment, because RabbitMQ's paths carry ``%2F`` for the default vhost and names may
contain any character: ``/api/queues/%2F/a%2Fb`` is vhost ``/``, queue ``a/b``.

Authentication is HTTP Basic against the broker's users, or the web UI's login session
cookie (:mod:`amqpd.http.sessions`). What a user may do is decided
by tags, as in RabbitMQ's management plugin:

- ``management``: the API, restricted to vhosts the user has permissions in, and only
  its own connections and channels;
- ``policymaker``: management + policies and parameters in those vhosts;
- ``monitoring``: management + read access to every vhost's objects, connections, nodes;
- ``administrator``: everything, including users, vhosts, permissions and definitions.

Errors leave as JSON, never as tracebacks: :class:`HttpError` carries the status and the
RabbitMQ ``{"error": ..., "reason": ...}`` body; broker exceptions
(:class:`~amqpd.protocol.errors.AMQPError`) are mapped by reply code; anything else is
logged and becomes a bare 500.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

from aiohttp import web

from amqpd import logs
from amqpd.broker.api import AMQPError
from amqpd.http.sessions import COOKIE, UI_HEADER

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, User, VHost

log = logging.getLogger("amqpd.http")

REALM = 'Basic realm="RabbitMQ Management"'
MANAGEMENT_TAGS = frozenset({"management", "monitoring", "policymaker", "administrator"})


class HttpError(Exception):
    def __init__(self, status: int, error: str, reason: str,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.extra = extra or {}


def bad_request(reason: str) -> HttpError:
    return HttpError(400, "bad_request", reason)


def not_found(reason: str = "Not Found") -> HttpError:
    return HttpError(404, "Object Not Found", reason)


def vhost_not_found() -> HttpError:
    """PUT of a queue or exchange in an unknown vhost (RabbitMQ 3.10.8's body)."""
    return HttpError(404, "not_found", "vhost_not_found")


def not_authorised(reason: str = "Not administrator user") -> HttpError:
    return HttpError(401, "not_authorised", reason)


def json_response(data: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(data, default=_json_default), status=status,
                        content_type="application/json", headers=headers)


def no_content() -> web.Response:
    return web.Response(status=204)


def created() -> web.Response:
    return web.Response(status=201)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def error_response(exc: HttpError, challenge: bool = True) -> web.Response:
    """``challenge=False`` leaves out ``WWW-Authenticate``: the web UI asks for it, so a
    401 shows its own login form instead of the browser's Basic-auth dialog."""
    body = {"error": exc.error, "reason": exc.reason, **exc.extra}
    headers = {"WWW-Authenticate": REALM} if exc.status == 401 and challenge else None
    return json_response(body, exc.status, headers)


def amqp_error_to_http(exc: AMQPError) -> HttpError:
    code = exc.reply_code
    if code == 404:
        return not_found(exc.text)
    if code == 403:
        return HttpError(403, "access_refused", exc.text)
    if code == 405:
        return HttpError(409, "resource_locked", exc.text)
    return bad_request(exc.text)


# ---------------------------------------------------------------------------- context
@dataclass
class Ctx:
    """One request: the public broker API (all a handler changes or reads the broker
    through), the authenticated user, path parameters, query."""

    api: BrokerAPI
    request: web.Request
    user: User | None
    params: dict[str, str]
    # True when another node of the cluster asked for this node's part of a list
    # (amqpd.http.cluster_lists): the handler answers with this node's own only
    local_only: bool = False

    @property
    def username(self) -> str:
        return self.user.name if self.user else ""

    @property
    def tags(self) -> set[str]:
        return set(self.user.tags) if self.user else set()

    @property
    def is_admin(self) -> bool:
        return "administrator" in self.tags

    @property
    def is_monitor(self) -> bool:
        return bool(self.tags & {"administrator", "monitoring"})

    @property
    def is_policymaker(self) -> bool:
        return bool(self.tags & {"administrator", "policymaker"})

    @property
    def query(self) -> Any:
        return self.request.query

    @property
    def led_only(self) -> bool:
        """``?amqpd_led_only=true`` (amqpd's own, /metrics and /api/overview): count
        only the queues this node leads, leaving out its copies of queues another node
        leads (which repeat the leader's figures). The workers' HTTP front asks each
        worker so, then sums (docs/workers.md)."""
        return bool(self.request.query.get("amqpd_led_only") == "true")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise not_authorised("Not administrator user")

    def require_monitor(self) -> None:
        if not self.is_monitor:
            raise not_authorised("Not monitor user")

    def require_policymaker(self) -> None:
        if not self.is_policymaker:
            raise not_authorised("Not policymaker user")

    def can_see_vhost(self, name: str) -> bool:
        return self.is_monitor or self.api.can_access_vhost(self.username, name)

    def visible_vhosts(self) -> list[VHost]:
        return [vh for vh in self.api.vhosts() if self.can_see_vhost(vh.name)]

    def vhost(self, name: str | None = None, *, write: bool = False,
              unknown: HttpError | None = None) -> VHost:
        """The vhost named in the path: 404 if unknown (or ``unknown``, where RabbitMQ
        answers otherwise), 401 if the user has no access.

        ``write`` demands real permissions in it (monitoring can read every vhost but
        not change it)."""
        name = self.params["vhost"] if name is None else name
        if not self.api.has_vhost(name):
            raise unknown if unknown is not None else not_found()
        vh = self.api.vhost(name)
        allowed = self.api.can_access_vhost(self.username, name) or (
            not write and self.is_monitor) or (write and self.is_admin)
        if not allowed:
            raise not_authorised("Access refused.")
        return vh

    def check(self, vhost: str, kind: str, resource_type: str, name: str) -> None:
        """AMQP-style resource permission check (configure/write/read regexes)."""
        if self.is_admin and not self.api.can_access_vhost(self.username, vhost):
            return  # administrators manage vhosts they hold no permissions in
        self.api.check_permission(self.username, vhost, kind, resource_type, name)

    async def json(self) -> Any:
        raw = await self.request.read()
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad_request(f"Malformed JSON: {exc}") from None

    async def json_object(self) -> dict[str, Any]:
        body = await self.json()
        if not isinstance(body, dict):
            raise bad_request("Expected a JSON object")
        return body


Handler = Callable[[Ctx], Awaitable[web.StreamResponse]]


@dataclass
class Route:
    method: str
    parts: list[str]  # literal segments, or "{name}" placeholders
    handler: Handler
    auth: bool = True


class Router:
    def __init__(self) -> None:
        self.routes: list[Route] = []
        # what adds series to /metrics beyond the core's (the stream protocol listener,
        # which comes in through the same hook as its routes): each is called with the
        # Exposition being built (amqpd/http/metrics.py)
        self.metric_sources: list[Callable[[Any], None]] = []

    def add(self, method: str, path: str, handler: Handler, auth: bool = True) -> None:
        parts = [p for p in path.split("/") if p != ""]
        self.routes.append(Route(method.upper(), parts, handler, auth))

    def get(self, path: str, handler: Handler, auth: bool = True) -> None:
        self.add("GET", path, handler, auth)

    def put(self, path: str, handler: Handler) -> None:
        self.add("PUT", path, handler)

    def post(self, path: str, handler: Handler) -> None:
        self.add("POST", path, handler)

    def delete(self, path: str, handler: Handler) -> None:
        self.add("DELETE", path, handler)

    def resolve(self, method: str, segments: list[str]) -> tuple[Route, dict[str, str]]:
        """The matching route, 405 if the path exists under another method, else 404."""
        path_matched = False
        for route in self.routes:
            params = _match(route.parts, segments)
            if params is None:
                continue
            if route.method == method or (method == "HEAD" and route.method == "GET"):
                return route, params
            path_matched = True
        if path_matched:
            raise HttpError(405, "method_not_allowed", "Method Not Allowed")
        raise not_found()


def _match(parts: list[str], segments: list[str]) -> dict[str, str] | None:
    if len(parts) != len(segments):
        return None
    params: dict[str, str] = {}
    for part, seg in zip(parts, segments, strict=True):
        if part.startswith("{"):
            params[part[1:-1]] = seg
        elif part != seg:
            return None
    return params


def split_raw_path(raw_path: str) -> list[str]:
    path = raw_path.split("?", 1)[0]
    segments = path.split("/")[1:]
    if segments and segments[-1] == "":
        segments.pop()  # trailing slash
    return [unquote(s) for s in segments]


# the address of the client a multi-worker node's HTTP front (amqpd/workers/http_front.py)
# forwards a request for: the worker sees the front's loopback address
PEER_HEADER = "X-Amqpd-Peer"


def _loopback_address(remote: str) -> bool:
    return remote.startswith(("127.", "::ffff:127.")) or remote in ("::1", "")


def is_loopback(request: web.Request) -> bool:
    """The request comes from this host. A forwarded request (:data:`PEER_HEADER`)
    counts as loopback only if its client was: the header can take the privilege
    away, never grant it (a request from elsewhere is not loopback, whatever it says),
    so a broker honours it whether or not a front stands before it."""
    if not _loopback_address(request.remote or ""):
        return False
    peer = request.headers.get(PEER_HEADER)
    return peer is None or _loopback_address(peer)


def authenticate(api: BrokerAPI, request: web.Request) -> User:
    """HTTP Basic, or else the web UI's session cookie (amqpd.http.sessions)."""
    header = request.headers.get("Authorization", "")
    if not header and COOKIE in request.cookies and "sessions" in request.app:
        return authenticate_session(api, request)
    if not header.lower().startswith("basic "):
        raise HttpError(401, "not_authorized", "Login failed")
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        username, _, password = decoded.partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise HttpError(401, "not_authorized", "Login failed") from None
    user = api.authenticate(username, password, is_loopback(request))
    if user is None:
        log.warning("HTTP API login refused for user %r from %s", username, request.remote)
        raise HttpError(401, "not_authorized", "Login failed")
    if not set(user.tags) & MANAGEMENT_TAGS:
        raise not_authorised("Not management user")
    return user


def authenticate_session(api: BrokerAPI, request: web.Request) -> User:
    """The user behind a live session cookie, authenticated afresh as Basic would be: a
    changed password, a deleted user or changed tags take effect at once."""
    sessions = request.app["sessions"]
    token = request.cookies[COOKIE]
    found = sessions.lookup(token)
    user = api.authenticate(found[0], found[1], is_loopback(request)) if found else None
    if user is None:
        if found is not None:
            sessions.drop(token)  # the password changed or the user is gone
        raise HttpError(401, "not_authorized", "Login session expired or ended")
    if request.method not in ("GET", "HEAD") and UI_HEADER not in request.headers:
        # a cross-site form cannot set this header (see amqpd.http.sessions)
        raise HttpError(403, "access_refused",
                        f"a request authenticated by cookie must carry {UI_HEADER}")
    if not set(user.tags) & MANAGEMENT_TAGS:
        raise not_authorised("Not management user")
    return user


def make_dispatcher(
    api: BrokerAPI, router: Router,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def dispatch(request: web.Request) -> web.StreamResponse:
        try:
            route, params = router.resolve(request.method, split_raw_path(request.raw_path))
            user = authenticate(api, request) if route.auth else None
            warren = api.warren()
            if warren is not None and request.method not in ("GET", "HEAD") \
                    and route.auth and not warren.accepting_publishes() \
                    and not request.path.startswith("/api/replication/"):
                # a standby's definitions come from its active's log: read-only here
                # (but for the replication layer's own operations: amqpctl promote)
                raise HttpError(503, "not_active", warren.refusal()
                                or "this node is not the active one")
            cluster = api.cluster()
            if cluster is not None and request.method not in ("GET", "HEAD") \
                    and route.auth and not cluster.serving() \
                    and not request.path.startswith("/api/cluster/"):
                # a paused cluster node takes no change (it could not reach the others);
                # join_cluster and forget_cluster_node still work
                raise HttpError(503, "paused", cluster.refusal() or "this node is paused")
            # each request runs in its own task, so this context ends with the request
            logs.bind_request(
                http_method=request.method, http_path=request.path,
                http_user=user.name if user else None)
            response = await route.handler(Ctx(api, request, user, params))
            if request.method != "GET":
                # a change is acknowledged only once its definition records are durable
                await api.wait_durable()
            return response
        except HttpError as exc:
            return error_response(exc, UI_HEADER not in request.headers)
        except AMQPError as exc:
            return error_response(amqp_error_to_http(exc))
        except web.HTTPException:
            raise
        except Exception:
            log.exception("HTTP API %s %s failed", request.method, request.path)
            return json_response({"error": "internal_server_error",
                                  "reason": "Internal Server Error"}, 500)

    return dispatch


# ---------------------------------------------------------------------------- input helpers
def as_bool(value: Any, name: str, default: bool = False) -> bool:
    """Accept JSON booleans and the strings rabbitmqadmin sends ("true"/"false")."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad_request(f"{name} must be true or false")


def as_int(value: Any, name: str, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool):
        raise bad_request(f"{name} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise bad_request(f"{name} must be an integer") from None


def as_dict(value: Any, name: str) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{name} must be a JSON object")
    return value


def as_str(value: Any, name: str, default: str | None = None) -> str:
    if value is None:
        if default is None:
            raise bad_request(f"{name} is required")
        return default
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string")
    return value


def select_columns(items: list[dict[str, Any]], ctx: Ctx) -> Any:
    """RabbitMQ's list query options: ``name`` (+ ``use_regex``), ``sort``,
    ``sort_reverse``, ``columns``, and pagination (``page``, ``page_size``).

    As RabbitMQ does: filter, then sort, then cut the page, then project columns; a paged
    answer counts the items before (``total_count``) and after (``filtered_count``) the
    filter."""
    return list_options(items, ctx.query)


def list_options(items: list[dict[str, Any]], q: Any) -> Any:
    """:func:`select_columns` over a query mapping of its own: a worker applies it to
    its list, the workers' HTTP front (amqpd.workers.http_front) to the merged one."""
    total = len(items)
    items = filter_by_name(items, q, lambda i: str(i.get("name", "")))
    sort = q.get("sort")
    if sort:
        items = sorted(items, key=lambda i: _sort_key(_dotted(i, sort)),
                       reverse=q.get("sort_reverse") == "true")
    paged = "page" in q
    if paged:
        page, size = page_params(q)
        filtered = len(items)
        items = page_slice(items, page, size)
    columns = q.get("columns")
    if columns:
        cols = [c for c in columns.split(",") if c]
        items = [_project(i, cols) for i in items]
    if paged:
        return page_body(items, page, size, filtered, total)
    return items


# the query options of a list (RabbitMQ's), applied over a whole list: the workers' HTTP
# front and a cluster-wide list take them off the parts they ask for
LIST_OPTIONS = frozenset({"name", "use_regex", "sort", "sort_reverse", "page", "page_size",
                          "columns", "pagination"})
T = TypeVar("T")
MAX_PAGE_SIZE = 500  # RabbitMQ's limit


def filter_by_name(items: list[T], q: Any, name_of: Callable[[T], str]) -> list[T]:
    """``name=`` keeps items whose name contains the text, ignoring case (a regular
    expression with ``use_regex=true``), as RabbitMQ's UI filter box does."""
    text = q.get("name")
    if not text:
        return items
    pattern = text if q.get("use_regex") == "true" else re.escape(text)
    try:
        rx = re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise bad_request(f"Invalid regex: {exc}") from None
    return [i for i in items if rx.search(name_of(i))]


def page_params(q: Any) -> tuple[int, int]:
    """``page`` and ``page_size``, refused with RabbitMQ 3.10.8's errors (asked of it)."""
    try:
        page, size = int(q.get("page") or 1), int(q.get("page_size") or 100)
    except ValueError:
        raise bad_request("Pagination parameters are invalid") from None
    if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
        raise HttpError(400, "invalid_pagination_parameters",
                        f"Invalid pagination parameters: page number {page}, "
                        f"page size {size}")
    return page, size


def page_slice(items: list[T], page: int, size: int) -> list[T]:
    """The page's items; any page but the first that starts past the end is refused,
    as RabbitMQ 3.10.8 does (the first page of an empty result is an empty page)."""
    start = (page - 1) * size
    if page > 1 and start >= len(items):
        raise HttpError(400, "page_out_of_range",
                        f"Page out of range, page: {page} page size: {size}, "
                        f"len: {len(items)}")
    return items[start:start + size]


def page_body(items: list[Any], page: int, size: int, filtered: int,
              total: int) -> dict[str, Any]:
    return {"filtered_count": filtered, "item_count": len(items), "items": items,
            "page": page, "page_count": (filtered + size - 1) // size, "page_size": size,
            "total_count": total}


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def _dotted(item: dict[str, Any], path: str) -> Any:
    value: Any = item
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _project(item: dict[str, Any], cols: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col in cols:
        value = _dotted(item, col)
        if value is None and col.split(".")[0] not in item:
            continue
        target = out
        parts = col.split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return out
