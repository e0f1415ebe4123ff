"""The warren over HTTP: ``GET /api/replication`` (role, epoch, standbys and their lag)
and ``POST /api/replication/promote`` (``amqpctl promote``: a static standby becomes
active by hand; the only failover there is without etcd)."""

from __future__ import annotations

from typing import Any

from amqpd.http.core import Ctx, HttpError, Router, json_response


def status(broker: Any) -> dict[str, Any] | None:
    """The replication figures of this node, or None on a single node."""
    roles = getattr(broker, "roles", None)
    return roles.status() if roles is not None else None


async def get_replication(ctx: Ctx) -> Any:
    ctx.require_monitor()
    found = status(ctx.broker)
    if found is None:
        raise HttpError(404, "not_found", "replication is not configured on this node")
    return json_response(found)


async def promote(ctx: Ctx) -> Any:
    ctx.require_admin()
    from amqpd.replication.roles import RoleError

    roles = getattr(ctx.broker, "roles", None)
    if roles is None:
        raise HttpError(400, "bad_request", "replication is not configured on this node")
    try:
        epoch = await roles.promote()
    except RoleError as exc:
        raise HttpError(409, "conflict", str(exc)) from None
    b = ctx.broker
    return json_response({"role": roles.role, "epoch": epoch,
                          "listeners": [{"protocol": p, "ip_address": h, "port": port}
                                        for p, h, port in b.listeners]})


def routes(r: Router) -> None:
    r.get("/api/replication", get_replication)
    r.post("/api/replication/promote", promote)
