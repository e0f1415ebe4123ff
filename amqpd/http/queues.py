"""/api/queues[/{vhost}[/{name}]], contents (purge), bindings, and getting messages."""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amqpd.http.bindings import binding_view
from amqpd.http.core import (
    Ctx,
    HttpError,
    Router,
    as_bool,
    as_dict,
    as_int,
    as_str,
    bad_request,
    created,
    json_response,
    no_content,
    not_found,
    select_columns,
    vhost_not_found,
)
from amqpd.http.messages import decode_json_properties, encode_payload
from amqpd.http.paging import paged_list
from amqpd.http.query_windows import windows

if TYPE_CHECKING:
    from amqpd.broker.api import Fetched, QueueType, VHost

log = logging.getLogger("amqpd.http")

ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
            "reject_requeue_false")


def queue_view(ctx: Ctx, q: QueueType) -> dict[str, Any]:
    operator_name, effective = ctx.api.effective_policy(q)
    info = dict(q.info())
    sampler = ctx.request.app["sampler"]
    info.update({
        "node": ctx.api.node_name(),
        "type": q.type_name,
        "state": "running",
        "message_bytes": q.ready_bytes,
        "message_bytes_ready": q.ready_bytes,
        "messages_details": {"rate": 0.0},
        "messages_ready_details": {"rate": 0.0},
        "messages_unacknowledged_details": {"rate": 0.0},
        "consumer_utilisation": None,
        "exclusive_consumer_tag": None,
        "message_stats": sampler.message_stats(q),
        "policy": q.policy_name,
        "operator_policy": operator_name,
        "effective_policy_definition": effective,
    })
    sampler.add_samples(q, info, *windows(ctx))  # ?msg_rates_age=60&lengths_age=60...
    info.update(ctx.api.queue_type_info(q))  # a quorum queue's leader and members
    cluster = ctx.api.cluster()
    if cluster is not None and q.durable and not q.forwards_publish \
            and not cluster.leadership_confirmed():
        # this node may have been replaced as its leader while it could not hear it
        # (starting, stalled, paused): no claim until etcd's record is read again
        info["state"] = "down"
    owner = q.exclusive_owner
    if owner is not None and hasattr(owner, "name"):
        info["owner_pid_details"] = {"name": owner.name}
    return info


def _get(ctx: Ctx, write: bool = False) -> tuple[VHost, QueueType]:
    vh = ctx.vhost(write=write)
    q = ctx.api.find_queue(vh.name, ctx.params["name"])
    if q is None:
        raise not_found()
    return vh, q


by_name = operator.attrgetter("name")

# sort keys the paged list reads from the queue itself (see amqpd.http.paging)
QUEUE_SORT_KEYS: dict[str, Callable[[Any], Any]] = {  # each takes a QueueType
    "name": by_name,
    "vhost": lambda q: q.vhost.name,
    "messages": lambda q: q.message_count + q.unacked_count,
    "messages_ready": lambda q: q.message_count,
    "messages_unacknowledged": lambda q: q.unacked_count,
    "consumers": lambda q: len(q.consumers),
    "durable": lambda q: q.durable,
    "auto_delete": lambda q: q.auto_delete,
    "exclusive": lambda q: q.exclusive,
}


async def list_queues(ctx: Ctx) -> Any:
    vhosts = [ctx.vhost()] if "vhost" in ctx.params else ctx.visible_vhosts()
    objects = [q for vh in vhosts for q in ctx.api.queues(vh)]
    return json_response(paged_list(ctx, objects, lambda q: queue_view(ctx, q),
                                    lambda q: q.name, QUEUE_SORT_KEYS))


async def get_queue(ctx: Ctx) -> Any:
    _, q = _get(ctx)
    return json_response(queue_view(ctx, q))


async def put_queue(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True, unknown=vhost_not_found())
    name = ctx.params["name"]
    body = await ctx.json_object()
    if not name:
        raise bad_request("queue name must not be empty")
    arguments = as_dict(body.get("arguments"), "arguments")
    ctx.check(vh.name, "configure", "queue", name)
    if isinstance(arguments.get("x-dead-letter-exchange"), str):
        ctx.check(vh.name, "read", "queue", name)
        ctx.check(vh.name, "write", "exchange", arguments["x-dead-letter-exchange"])
    existing = ctx.api.find_queue(vh.name, name)
    if existing is not None:
        await _view_current(existing)
        existing = ctx.api.find_queue(vh.name, name)
    existed = existing is not None
    ctx.api.declare_queue(vh, name, durable=as_bool(body.get("durable"), "durable", True),
                          auto_delete=as_bool(body.get("auto_delete"), "auto_delete"),
                          arguments=arguments)
    return no_content() if existed else created()


async def delete_queue(ctx: Ctx) -> Any:
    vh, q = _get(ctx, write=True)
    ctx.check(vh.name, "configure", "queue", q.name)
    ctx.api.delete_queue(vh, q.name, if_unused="if-unused" in ctx.query,
                         if_empty="if-empty" in ctx.query, owner=q.exclusive_owner)
    await _delete_recorded(q)
    return no_content()


async def _view_current(queue: QueueType) -> None:
    """A queue led by another node may be stale in this node's view (a delete made
    elsewhere not seen yet): a PUT goes on once its record has been read again, as
    queue.declare does (issue 28: a PUT right after a DELETE on another node answered
    404 "home node ... is down" for the deleted queue)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def refreshed() -> None:
        if not done.done():
            done.set_result(None)

    if queue.refreshes_view(refreshed):
        await done


async def _delete_recorded(queue: QueueType) -> None:
    """A queue led by another node is deleted by its leader, which writes the delete
    to etcd: the 204 waits until this node has seen it, as delete-ok does; 500 with the
    cluster's reason after ``definition_timeout``. A local queue's delete is durable
    once the dispatcher's ``wait_durable`` returns."""
    done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def answered(error: BaseException | None) -> None:
        if not done.done():
            done.set_result(error)

    if not queue.confirms_delete(answered):
        return
    error = await done
    if error is not None:
        log.warning("HTTP API: delete of queue '%s' in vhost '%s' not confirmed by the "
                    "cluster: %s", queue.name, queue.vhost.name, error)
        raise HttpError(500, "internal_error",
                        f"queue delete not confirmed by the cluster: {error}")


async def purge(ctx: Ctx) -> Any:
    vh, q = _get(ctx, write=True)
    ctx.check(vh.name, "read", "queue", q.name)
    ctx.api.purge_queue(vh, q.name, owner=q.exclusive_owner)
    return no_content()


async def queue_bindings(ctx: Ctx) -> Any:
    vh, q = _get(ctx)
    items = [binding_view(b, vh.name) for b in ctx.api.bindings(vh) if b.destination is q]
    return json_response(select_columns(items, ctx))


async def queue_actions(ctx: Ctx) -> Any:
    """``sync`` / ``cancel_sync`` of a mirrored queue's unsynchronised mirrors (the
    copy runs in the background on the queue's leader: the queue keeps serving); a
    queue that is not mirrored has nothing to do, as in RabbitMQ."""
    vh, q = _get(ctx, write=True)
    body = await ctx.json_object()
    action = body.get("action")
    if action not in ("sync", "cancel_sync"):
        raise bad_request("action must be 'sync' or 'cancel_sync'")
    cluster = ctx.api.cluster()
    if cluster is not None:
        cluster.request_mirror_sync(vh.name, q.name, str(action))
    return no_content()


async def get_messages(ctx: Ctx) -> Any:
    vh, q = _get(ctx, write=True)
    body = await ctx.json_object()
    count = as_int(body.get("count"), "count", 1)
    if count < 1:
        raise bad_request("count must be a positive integer")
    ackmode = as_str(body.get("ackmode"), "ackmode", "ack_requeue_true")
    if ackmode not in ACKMODES:
        raise bad_request(f"ackmode must be one of {', '.join(ACKMODES)}")
    encoding = as_str(body.get("encoding"), "encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding must be 'auto' or 'base64'")
    truncate = body.get("truncate")
    truncate_n = as_int(truncate, "truncate") if truncate not in (None, "") else None
    ctx.check(vh.name, "read", "queue", q.name)
    taken: list[Fetched] = []
    out = []
    for _ in range(count):
        got = ctx.api.get(vh, q.name, owner=q.exclusive_owner)
        if got is None:
            break
        taken.append(got)
        msg = got.message
        payload, enc = encode_payload(got.body, encoding, truncate_n)
        out.append({
            "payload_bytes": len(got.body),
            "redelivered": got.redelivered,
            "exchange": msg.exchange,
            "routing_key": msg.routing_key,
            "message_count": got.message_count,
            "properties": decode_json_properties(msg.properties),
            "payload": payload,
            "payload_encoding": enc,
        })
    if ackmode.endswith("requeue_true"):
        ctx.api.reject(taken, requeue=True)
    elif ackmode == "reject_requeue_false":
        ctx.api.reject(taken, requeue=False)
    else:
        ctx.api.ack(taken)
    return json_response(out)


def routes(r: Router) -> None:
    r.get("/api/queues", list_queues)
    r.get("/api/queues/{vhost}", list_queues)
    r.get("/api/queues/{vhost}/{name}", get_queue)
    r.put("/api/queues/{vhost}/{name}", put_queue)
    r.delete("/api/queues/{vhost}/{name}", delete_queue)
    r.delete("/api/queues/{vhost}/{name}/contents", purge)
    r.get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.post("/api/queues/{vhost}/{name}/actions", queue_actions)
    r.post("/api/queues/{vhost}/{name}/get", get_messages)
