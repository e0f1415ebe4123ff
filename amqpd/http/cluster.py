"""The cluster over HTTP (amqpd's own paths; RabbitMQ does these with rabbitmqctl):
``GET /api/cluster/status`` (``amqpctl cluster_status``), ``POST /api/cluster/join``
(``amqpctl join_cluster``) and ``DELETE /api/cluster/nodes/{node}``
(``amqpctl forget_cluster_node``). ``/api/nodes`` and ``/api/cluster-name`` are in
``overview.py``. Everything goes through the public broker API."""

from __future__ import annotations

from typing import Any

from amqpd.http.core import Ctx, HttpError, Router, bad_request, json_response, no_content


def _not_clustered() -> HttpError:
    return HttpError(400, "bad_request", "this node is not in a cluster (cluster.name is "
                                         "not set)")


async def status(ctx: Ctx) -> Any:
    ctx.require_monitor()
    cluster = ctx.api.cluster()
    if cluster is None:
        # a single node is a cluster of one, as rabbitmqctl cluster_status shows it
        name = ctx.api.node_name()
        return json_response({"cluster_name": ctx.api.cluster_name(), "cluster": None,
                              "node": name, "disk_nodes": [name], "running_nodes": [name],
                              "partitions": {}, "partition_handling": None, "paused": False,
                              "pause_reason": None})
    return json_response(cluster.status())


async def join(ctx: Ctx) -> Any:
    ctx.require_admin()
    body = await ctx.json_object()
    via = body.get("node")
    if not isinstance(via, str) or not via:
        raise bad_request("node must be the name of a cluster member")
    if ctx.api.cluster() is None:
        raise _not_clustered()
    return json_response(await ctx.api.join_cluster(via))


async def forget(ctx: Ctx) -> Any:
    ctx.require_admin()
    if ctx.api.cluster() is None:
        raise _not_clustered()
    await ctx.api.forget_cluster_node(ctx.params["node"])
    return no_content()


def routes(r: Router) -> None:
    r.get("/api/cluster/status", status)
    r.post("/api/cluster/join", join)
    r.delete("/api/cluster/nodes/{node}", forget)
