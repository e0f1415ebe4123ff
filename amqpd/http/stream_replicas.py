"""Stream replicas over HTTP (amqpd's own paths; RabbitMQ does these with
``rabbitmq-streams add_replica`` / ``delete_replica``, amqpd with ``amqpctl``):
``PUT`` / ``DELETE /api/stream-queues/{vhost}/{name}/replicas/{node}``.

Streams run on one node for now (the replicated stream waits for the replica core), so
these answer what RabbitMQ 3.10.8 answers where no other member could take part
(asked on a local node, see docs/streams.md): an unknown queue 404 ``not_found``; a
classic or quorum queue 400 "Cannot add replicas to a classic queue" (or "delete
replicas from"); a node that is not a running member of the cluster 400
``node_not_running``; the stream's own node: adding is a no-op (it is a member already)
and deleting is refused, "Cannot delete the last member of a stream". Another running
cluster node answers 501: replicating a stream there is not implemented yet.
"""

from __future__ import annotations

import logging
from typing import Any

from amqpd.http.core import Ctx, HttpError, Router, bad_request, json_response, not_found

log = logging.getLogger("amqpd.http")


async def _edit(ctx: Ctx, add: bool) -> Any:
    ctx.require_admin()
    vhost, name, node = ctx.params["vhost"], ctx.params["name"], ctx.params["node"]
    try:
        return _answer(ctx, add, vhost, name, node)
    except HttpError as exc:
        log.info("%s replica of queue '%s' in vhost '%s' on node %s refused: %s",
                 "adding a" if add else "deleting the", name, vhost, node, exc.reason)
        raise


def _answer(ctx: Ctx, add: bool, vhost: str, name: str, node: str) -> Any:
    q = ctx.api.find_queue(vhost, name)
    if q is None:
        raise not_found("not_found")
    kind = q.listed_type()
    if kind != "stream":
        raise bad_request(f"Cannot add replicas to a {kind} queue" if add
                          else f"Cannot delete replicas from a {kind} queue")
    here = ctx.api.node_name()
    cluster = ctx.api.cluster()
    if node != here and (cluster is None or not cluster.is_running(node)):
        raise bad_request("node_not_running")
    if node != here:
        raise HttpError(501, "not_implemented", "stream replicas on other cluster nodes are "
                                                "not implemented yet: this stream lives on "
                                                f"{here} only")
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
