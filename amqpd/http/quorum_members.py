"""Quorum queue membership over HTTP (amqpd's own paths; RabbitMQ does these with
``rabbitmq-queues``, amqpd with ``amqpctl``):

* ``PUT`` / ``DELETE /api/quorum-queues/{vhost}/{name}/members/{node}``
  (``add_member`` / ``delete_member``),
* ``POST /api/quorum-queues/grow`` ``{"node", "strategy": "all"|"even",
  "vhost_pattern", "queue_pattern"}`` and ``POST /api/quorum-queues/shrink``
  ``{"node"}``: one row per queue, ``{"vhost", "name", "size", "result"}`` as
  rabbitmq-queues prints them.

The edit is a transaction on the queue's group record in etcd; the queue's leader
adopts it (:mod:`amqpd.cluster.quorum_group`): a new member copies the backlog in the
background. RabbitMQ's refusals answer 400 with its reason, an unknown queue 404.
"""

from __future__ import annotations

import re
from typing import Any

from amqpd.broker.api import MembershipError, QuorumMembership
from amqpd.http.core import Ctx, HttpError, Router, bad_request, json_response, not_found


def _groups(ctx: Ctx) -> QuorumMembership:
    cluster = ctx.api.cluster()
    groups = cluster.quorum_membership() if cluster is not None else None
    if groups is None:
        raise HttpError(400, "bad_request", "this node is not in a cluster (cluster.name "
                                            "is not set)")
    return groups


async def _edit(ctx: Ctx, add: bool) -> Any:
    ctx.require_admin()
    groups = _groups(ctx)
    vhost, name, node = ctx.params["vhost"], ctx.params["name"], ctx.params["node"]
    try:
        members = await groups.edit_members(vhost, name, add=node if add else None,
                                            remove=None if add else node)
    except LookupError:
        raise not_found() from None
    except MembershipError as exc:
        raise bad_request(str(exc)) from None
    return json_response({"vhost": vhost, "name": name, "members": members})


async def add_member(ctx: Ctx) -> Any:
    return await _edit(ctx, True)


async def delete_member(ctx: Ctx) -> Any:
    return await _edit(ctx, False)


def _pattern(body: dict[str, Any], key: str) -> re.Pattern[str]:
    value = body.get(key, ".*")
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a regular expression")
    try:
        return re.compile(value)
    except re.error as exc:
        raise bad_request(f"{key} is not a regular expression: {exc}") from None


async def _each(ctx: Ctx, targets: list[tuple[str, str]], node: str, add: bool,
                vhost_re: re.Pattern[str], queue_re: re.Pattern[str]) -> Any:
    groups = _groups(ctx)
    rows = []
    for vhost, name in targets:
        if not vhost_re.search(vhost) or not queue_re.search(name):
            continue
        try:
            members = await groups.edit_members(vhost, name, add=node if add else None,
                                                remove=None if add else node)
            rows.append({"vhost": vhost, "name": name, "size": len(members),
                         "result": "ok"})
        except (LookupError, MembershipError) as exc:
            size = groups.group_size(vhost, name)
            rows.append({"vhost": vhost, "name": name, "size": size,
                         "result": f"error: {exc}"})
    return json_response(rows)


async def grow(ctx: Ctx) -> Any:
    ctx.require_admin()
    body = await ctx.json_object()
    node, strategy = body.get("node"), body.get("strategy", "all")
    if not isinstance(node, str) or not node:
        raise bad_request("node must be the name of a cluster member")
    if strategy not in ("all", "even"):
        raise bad_request("strategy must be 'all' or 'even'")
    groups = _groups(ctx)
    if not groups.is_member_node(node):
        raise bad_request(f"{node} is not a member of the cluster")
    return await _each(ctx, groups.grow_targets(node, strategy), node, True,
                       _pattern(body, "vhost_pattern"), _pattern(body, "queue_pattern"))


async def shrink(ctx: Ctx) -> Any:
    ctx.require_admin()
    body = await ctx.json_object()
    node = body.get("node")
    if not isinstance(node, str) or not node:
        raise bad_request("node must be the name of a cluster member")
    groups = _groups(ctx)
    return await _each(ctx, groups.shrink_targets(node), node, False, re.compile(""),
                       re.compile(""))


def routes(r: Router) -> None:
    r.put("/api/quorum-queues/{vhost}/{name}/members/{node}", add_member)
    r.delete("/api/quorum-queues/{vhost}/{name}/members/{node}", delete_member)
    r.post("/api/quorum-queues/grow", grow)
    r.post("/api/quorum-queues/shrink", shrink)
