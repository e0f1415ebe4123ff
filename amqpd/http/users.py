"""/api/users, /api/permissions, /api/topic-permissions (administrator only)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import HASHING_SHA256, BrokerAPI, hash_password
from amqpd.http.core import (
    Ctx,
    Router,
    as_str,
    bad_request,
    created,
    json_response,
    no_content,
    not_found,
    select_columns,
)

if TYPE_CHECKING:
    from amqpd.broker.api import Permission, User

HASHING_ALGORITHMS = ("rabbit_password_hashing_sha256", "rabbit_password_hashing_sha512",
                      "rabbit_password_hashing_md5")


def parse_tags(value: Any) -> list[str]:
    """Tags come as a list or, from older tools, as a comma-separated string."""
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise bad_request("tags must be a string or a list of strings")


def user_view(user: User, limits: dict[str, int] | None = None) -> dict[str, Any]:
    return {"name": user.name, "password_hash": user.password_hash,
            "hashing_algorithm": user.hashing_algorithm, "tags": list(user.tags),
            "limits": dict(limits or {})}


def permission_view(user: str, vhost: str, p: Permission) -> dict[str, Any]:
    return {"user": user, "vhost": vhost, "configure": p.configure, "write": p.write,
            "read": p.read}


def _user(ctx: Ctx) -> User:
    user = ctx.api.user(ctx.params["name"])
    if user is None:
        raise not_found()
    return user


async def list_users(ctx: Ctx) -> Any:
    ctx.require_admin()
    limits = ctx.api.user_limits()
    return json_response(select_columns([user_view(u, limits.get(u.name))
                                         for u in ctx.api.users()], ctx))


async def users_without_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    with_perms = {u for u, _v, _p in ctx.api.permissions()}
    return json_response([user_view(u) for u in ctx.api.users() if u.name not in with_perms])


async def get_user(ctx: Ctx) -> Any:
    ctx.require_admin()
    user = _user(ctx)
    return json_response(user_view(user, ctx.api.user_limits().get(user.name)))


def apply_user(api: BrokerAPI, name: str, body: dict[str, Any]) -> bool:
    """Create or update a user from management JSON; True if it was created."""
    if not name:
        raise bad_request("user name must not be empty")
    tags = parse_tags(body.get("tags"))
    algorithm = body.get("hashing_algorithm") or HASHING_SHA256
    if algorithm not in HASHING_ALGORITHMS:
        raise bad_request(f"unknown hashing algorithm {algorithm}")
    existing = api.user(name)
    if "password" in body and body["password"] is not None:
        password = as_str(body["password"], "password")
        password_hash = hash_password(password, algorithm)
    elif "password_hash" in body and body["password_hash"] is not None:
        password_hash = as_str(body["password_hash"], "password_hash")
        if password_hash:
            import base64
            import binascii

            try:
                raw = base64.b64decode(password_hash, validate=True)
            except (binascii.Error, ValueError):
                raise bad_request("password_hash is not valid base64") from None
            if len(raw) < 8:
                raise bad_request("password_hash is too short")
    elif existing is not None:
        password_hash, algorithm = existing.password_hash, existing.hashing_algorithm
    else:
        raise bad_request("Must provide password or password_hash")
    return api.put_user(name, tags=tags, password_hash=password_hash, algorithm=algorithm)


async def put_user(ctx: Ctx) -> Any:
    ctx.require_admin()
    body = await ctx.json_object()
    return created() if apply_user(ctx.api, ctx.params["name"], body) else no_content()


async def delete_user(ctx: Ctx) -> Any:
    ctx.require_admin()
    if not ctx.api.delete_user(ctx.params["name"]):
        raise not_found()
    return no_content()


async def bulk_delete_users(ctx: Ctx) -> Any:
    """``POST /api/users/bulk-delete`` with ``{"users": [...]}``: users are deleted in
    order; the first that does not exist stops it with 400 and RabbitMQ's reason
    ``["no_such_user", name]`` (the ones before it stay deleted, as in RabbitMQ)."""
    ctx.require_admin()
    raw = await ctx.request.read()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError):
        raise bad_request("not_json") from None
    if not isinstance(body, dict):
        raise bad_request("not_json")
    if "users" not in body:
        raise bad_request("[{key_missing,users}]")
    names = body["users"]
    if not isinstance(names, list):  # RabbitMQ 3.10.8 crashes here (500)
        raise bad_request("users must be a list of user names")
    for name in names:  # each deletion saves itself (the API's auth store reports it)
        if not isinstance(name, str) or not ctx.api.delete_user(name):
            return json_response({"error": "bad_request", "reason": ["no_such_user", name]},
                                 400)
    return no_content()


async def user_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    user = _user(ctx)
    return json_response([permission_view(u, v, p) for u, v, p in ctx.api.permissions()
                          if u == user.name])


async def list_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    return json_response(select_columns(
        [permission_view(u, v, p) for u, v, p in ctx.api.permissions()],
        ctx))


def _perm_target(ctx: Ctx, *, setting: bool = False) -> tuple[str, str]:
    """The (vhost, user) of a permission path. Unknown ones: 404 to read or delete, but
    400 ``vhost_or_user_not_found`` to set, as RabbitMQ 3.10.8 answered."""
    vhost, user = ctx.params["vhost"], ctx.params["user"]
    if not ctx.api.has_vhost(vhost) or ctx.api.user(user) is None:
        raise bad_request("vhost_or_user_not_found") if setting else not_found()
    return vhost, user


async def get_permission(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost, user = _perm_target(ctx)
    p = ctx.api.permission(user, vhost)
    if p is None:
        raise not_found()
    return json_response(permission_view(user, vhost, p))


async def put_permission(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost, user = _perm_target(ctx, setting=True)
    body = await ctx.json_object()
    perms = [as_str(body.get(k), k) for k in ("configure", "write", "read")]  # API: 406
    new = ctx.api.set_permissions(user, vhost, *perms)
    return created() if new else no_content()


async def delete_permission(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost, user = _perm_target(ctx)
    if not ctx.api.clear_permissions(user, vhost):
        raise not_found()
    return no_content()


async def list_topic_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    return json_response(ctx.api.topic_permissions())


def _topic_entries(ctx: Ctx, user: str | None = None,
                   vhost: str | None = None) -> list[dict[str, Any]]:
    return ctx.api.topic_permissions(user, vhost)


async def get_topic_permission(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost, user = _perm_target(ctx)
    found = _topic_entries(ctx, user, vhost)
    if not found:
        raise not_found()
    return json_response(found)


async def put_topic_permission(ctx: Ctx) -> Any:
    """Set one exchange's topic permission for (user, vhost); enforced at once
    (broker/topic_auth.py)."""
    ctx.require_admin()
    vhost, user = _perm_target(ctx, setting=True)
    body = await ctx.json_object()
    exchange = as_str(body.get("exchange"), "exchange")
    write, read = (as_str(body.get(k, ""), k) for k in ("write", "read"))  # API: 406
    existed = ctx.api.put_topic_permission(user, vhost, exchange, write, read)
    return no_content() if existed else created()


async def delete_topic_permission(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost, user = _perm_target(ctx)
    # one exchange's entry: by path (the web UI) or query; otherwise all of the user's
    exchange = ctx.params.get("exchange") or ctx.request.query.get("exchange")
    if not ctx.api.clear_topic_permissions(user, vhost, exchange):
        raise not_found()
    return no_content()


async def user_topic_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    return json_response(_topic_entries(ctx, user=_user(ctx).name))


def routes(r: Router) -> None:
    r.get("/api/users", list_users)
    r.get("/api/users/without-permissions", users_without_permissions)
    r.post("/api/users/bulk-delete", bulk_delete_users)
    r.get("/api/users/{name}", get_user)
    r.put("/api/users/{name}", put_user)
    r.delete("/api/users/{name}", delete_user)
    r.get("/api/users/{name}/permissions", user_permissions)
    r.get("/api/permissions", list_permissions)
    r.get("/api/permissions/{vhost}/{user}", get_permission)
    r.put("/api/permissions/{vhost}/{user}", put_permission)
    r.delete("/api/permissions/{vhost}/{user}", delete_permission)
    r.get("/api/topic-permissions", list_topic_permissions)
    r.get("/api/topic-permissions/{vhost}/{user}", get_topic_permission)
    r.put("/api/topic-permissions/{vhost}/{user}", put_topic_permission)
    r.delete("/api/topic-permissions/{vhost}/{user}", delete_topic_permission)
    r.delete("/api/topic-permissions/{vhost}/{user}/{exchange}", delete_topic_permission)
    r.get("/api/users/{name}/topic-permissions", user_topic_permissions)
