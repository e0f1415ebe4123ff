"""The warren over HTTP: ``GET /api/replication`` (role, epoch, standbys and their lag)
and ``POST /api/replication/promote`` (``amqpctl promote``: a static standby becomes
active by hand; the only failover there is without etcd). Both go through the public
broker API (``api.replication_status``, ``api.promote``)."""

from __future__ import annotations

from typing import Any

from amqpd.http.core import Ctx, HttpError, Router, json_response


async def get_replication(ctx: Ctx) -> Any:
    ctx.require_monitor()
    found = ctx.api.replication_status()
    if found is None:
        raise HttpError(404, "not_found", "replication is not configured on this node")
    return json_response(found)


async def promote(ctx: Ctx) -> Any:
    ctx.require_admin()
    api = ctx.api
    if api.replication_status() is None:
        raise HttpError(400, "bad_request", "replication is not configured on this node")
    # a role that cannot change now (already active): 405 RESOURCE_LOCKED -> 409
    epoch = await api.promote()
    status = api.replication_status() or {}
    return json_response({"role": status.get("role"), "epoch": epoch,
                          "listeners": [{"protocol": p, "ip_address": h, "port": port}
                                        for p, h, port in api.listeners()]})


def routes(r: Router) -> None:
    r.get("/api/replication", get_replication)
    r.post("/api/replication/promote", promote)
