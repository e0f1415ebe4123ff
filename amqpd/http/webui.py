"""The management web UI: its static files at ``/`` and its login session.

The UI is plain files shipped in the package (``amqpd/http/ui/static/``): ``index.html``,
ES modules of our own, a stylesheet, and uPlot (a charting library from npm, its built
file committed with its licence under ``vendor/uplot/``; see ``VENDOR.md`` there). No build
step runs at install or start, and nothing is fetched from elsewhere: the page talks only
to this API, with RabbitMQ's paths and shapes.

``POST /api/login`` (``{"username", "password"}``) checks the password once and answers
with the user's name and tags and an ``HttpOnly`` session cookie (amqpd.http.sessions);
``POST /api/logout`` ends the session. Files are served with an ``ETag`` and
``Cache-Control: no-cache`` so an upgraded broker never runs yesterday's script, and a
Content-Security-Policy that allows scripts from this origin only.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from amqpd.http.core import (
    MANAGEMENT_TAGS,
    Ctx,
    HttpError,
    Router,
    as_str,
    is_loopback,
    json_response,
    not_authorised,
    not_found,
)
from amqpd.http.sessions import COOKIE

log = logging.getLogger("amqpd.http")

STATIC_DIR = Path(__file__).parent / "ui" / "static"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".png": "image/png",
                 ".svg": "image/svg+xml", ".md": "text/plain; charset=utf-8", "": "text/plain"}
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
       "base-uri 'none'; form-action 'self'")


def _file(parts: list[str]) -> Path:
    """A file under STATIC_DIR named by path segments that cannot climb out of it."""
    if not parts or not all(SAFE_NAME.match(p) for p in parts):
        raise not_found()
    path = STATIC_DIR.joinpath(*parts)
    if not path.is_file():
        raise not_found()
    return path


def serve(request: web.Request, path: Path) -> web.StreamResponse:
    data = path.read_bytes()
    etag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
    headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
               "Content-Security-Policy": CSP, "Referrer-Policy": "same-origin"}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    content_type = CONTENT_TYPES.get(path.suffix, "application/octet-stream")
    return web.Response(body=data, headers={**headers, "Content-Type": content_type})


async def index(ctx: Ctx) -> Any:
    return serve(ctx.request, _file(["index.html"]))


async def static(ctx: Ctx) -> Any:
    parts = [ctx.params[k] for k in ("dir1", "dir2", "dir3", "file") if k in ctx.params]
    return serve(ctx.request, _file(parts))


def _cookie_flags(ctx: Ctx) -> dict[str, Any]:
    return {"httponly": True, "samesite": "Strict", "path": "/",
            "secure": bool(ctx.request.app["listener"].get("tls"))}


async def login(ctx: Ctx) -> Any:
    body = await ctx.json_object()
    username = as_str(body.get("username"), "username")
    password = as_str(body.get("password"), "password")
    user = ctx.api.authenticate(username, password, is_loopback(ctx.request))
    if user is None:
        log.warning("web UI login refused for user %r from %s", username, ctx.request.remote)
        raise HttpError(401, "not_authorized", "Login failed: wrong user name or password"
                        + (" (this user may log in from localhost only)"
                           if ctx.api.is_loopback_only(username) else ""))
    if not set(user.tags) & MANAGEMENT_TAGS:
        raise not_authorised("Not management user: the user needs the management, "
                             "policymaker, monitoring or administrator tag")
    token = ctx.request.app["sessions"].create(user.name, password)
    log.info("web UI login: user %s from %s", user.name, ctx.request.remote)
    response = json_response({"name": user.name, "tags": list(user.tags)})
    response.set_cookie(COOKIE, token, max_age=int(ctx.request.app["sessions"].ttl),
                        **_cookie_flags(ctx))
    return response


async def logout(ctx: Ctx) -> Any:
    token = ctx.request.cookies.get(COOKIE)
    if token:
        ctx.request.app["sessions"].drop(token)
    response = web.Response(status=204)
    response.del_cookie(COOKIE, path="/")
    return response


def routes(r: Router) -> None:
    r.get("/", index, auth=False)
    r.get("/static/{file}", static, auth=False)
    r.get("/static/{dir1}/{file}", static, auth=False)
    r.get("/static/{dir1}/{dir2}/{file}", static, auth=False)
    r.add("POST", "/api/login", login, auth=False)
    r.add("POST", "/api/logout", logout, auth=False)
