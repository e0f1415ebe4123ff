"""Stream replicas over HTTP (amqpd's own paths; RabbitMQ does these with
``rabbitmq-streams add_replica`` / ``delete_replica``, amqpd with ``amqpctl``):
``PUT`` / ``DELETE /api/stream-queues/{vhost}/{name}/replicas/{node}``.

RabbitMQ 3.10.8's refusals come first: an unknown queue 404 ``not_found``; a classic
or quorum queue 400 "Cannot add replicas to a classic queue" (or "delete replicas
from"); a node that is not a running member of the cluster 400 ``node_not_running``.
In a cluster the edit is a transaction on the stream's group record in etcd, which its
leader adopts (:mod:`amqpd.cluster.stream_group`): a new member copies the log from
the leader's first offset, a removed one deletes its copy. Adding a member or removing
a node that is none changes nothing; removing the last member ("Cannot delete the last
member of a stream") or the leader is refused (400). A node with no cluster is the
stream's only member: adding it is a no-op, deleting it is refused.
"""

from __future__ import annotations

import logging
from typing import Any

from amqpd.broker.api import MembershipError
from amqpd.http.core import Ctx, HttpError, Router, bad_request, json_response, not_found

log = logging.getLogger("amqpd.http")


async def _edit(ctx: Ctx, add: bool) -> Any:
    ctx.require_admin()
    vhost, name, node = ctx.params["vhost"], ctx.params["name"], ctx.params["node"]
    try:
        groups = getattr(ctx.api.cluster(), "stream_groups", None)
        if groups is None:
            return _answer(ctx, add, vhost, name, node)
        _check(ctx, add, vhost, name, node)
        try:
            members = await groups.edit_members(vhost, name, add=node if add else None,
                                                remove=None if add else node)
        except LookupError:
            raise not_found("not_found") from None
        except MembershipError as exc:
            raise bad_request(str(exc)) from None
        return json_response({"vhost": vhost, "name": name, "members": members})
    except HttpError as exc:
        log.info("%s replica of queue '%s' in vhost '%s' on node %s refused: %s",
                 "adding a" if add else "deleting the", name, vhost, node, exc.reason)
        raise


def _check(ctx: Ctx, add: bool, vhost: str, name: str, node: str) -> None:
    """RabbitMQ's refusals before any edit: no such queue, not a stream, a node that
    is not a running member of the cluster."""
    q = ctx.api.find_queue(vhost, name)
    if q is None:
        raise not_found("not_found")
    kind = q.listed_type()
    if kind != "stream":
        raise bad_request(f"Cannot add replicas to a {kind} queue" if add
                          else f"Cannot delete replicas from a {kind} queue")
    cluster = ctx.api.cluster()
    if node != ctx.api.node_name() and (cluster is None or not cluster.is_running(node)):
        raise bad_request("node_not_running")


def _answer(ctx: Ctx, add: bool, vhost: str, name: str, node: str) -> Any:
    """A node with no cluster: the stream's only member is this node."""
    _check(ctx, add, vhost, name, node)
    here = ctx.api.node_name()
    if not add:
        raise bad_request("Cannot delete the last member of a stream")
    return json_response({"vhost": vhost, "name": name, "members": [here]})


async def add_replica(ctx: Ctx) -> Any:
    return await _edit(ctx, True)


async def delete_replica(ctx: Ctx) -> Any:
    return await _edit(ctx, False)


def routes(r: Router) -> None:
    r.put("/api/stream-queues/{vhost}/{name}/replicas/{node}", add_replica)
    r.delete("/api/stream-queues/{vhost}/{name}/replicas/{node}", delete_replica)
