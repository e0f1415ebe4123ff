"""Super streams over HTTP: ``PUT`` / ``GET`` / ``DELETE
/api/stream/super-streams/{vhost}/{name}`` (``amqpctl add_super_stream`` /
``delete_super_stream``; RabbitMQ's ``rabbitmq-streams`` commands of the same names;
RabbitMQ 4.2's management plugin has the same ``PUT``).

A super stream is the layout RabbitMQ 3.11's ``rabbit_stream_manager`` creates, so
stream clients (route, partitions) and AMQP 0-9-1 publishers (through the exchange) use
it alike: a durable direct exchange NAME with the argument ``x-super-stream: true``, one
stream per partition, NAME-0..NAME-(N-1) (``partitions``) or NAME-KEY per key
(``binding-keys``, RabbitMQ's body field, comma-separated), each bound to the exchange
with its routing key ("0".."N-1" or the key) and the binding argument
``x-stream-partition-order`` (0, 1, ...). ``arguments`` are the stream-protocol create
arguments (``max-length-bytes``, ``max-age``, ...) applied to every partition.

Refusals (400, with RabbitMQ's wording where it has one): partitions and binding keys
both or neither, a partition count below 1 or above :data:`MAX_PARTITIONS`, an existing
exchange or queue of one of the names. A failure half way removes what was made (as
RabbitMQ rolls back). Delete removes the exchange and every stream bound to it as a
partition; 404 without the exchange. The layout itself is made and removed by
:mod:`amqpd.streamproto.superstreams`, which the stream protocol's 3.13 commands use too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import AMQPError
from amqpd.http.core import (
    Ctx,
    HttpError,
    Router,
    amqp_error_to_http,
    as_dict,
    bad_request,
    created,
    json_response,
    no_content,
    not_found,
    vhost_not_found,
)
from amqpd.streamproto import superstreams
from amqpd.streamproto.arguments import BadArgument, queue_arguments
from amqpd.streamproto.superstreams import MAX_PARTITIONS, ORDER_ARGUMENT

if TYPE_CHECKING:
    from amqpd.broker.api import Binding, VHost

log = logging.getLogger("amqpd.http")


def layout(name: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(partition stream, routing key) in partition order for a creation body."""
    partitions = body.get("partitions")
    keys_text = body.get("binding-keys")
    if partitions is None and keys_text is None:
        raise bad_request("Must specify partitions or binding keys")
    if partitions is not None and keys_text is not None:
        raise bad_request("Specify partitions or binding keys, not both")
    if partitions is not None:
        if isinstance(partitions, bool) or not isinstance(partitions, int | str):
            raise bad_request("The partitions must be a number")
        try:
            count = int(partitions)
        except ValueError:
            raise bad_request("The partitions must be a number") from None
        if count < 1:
            raise bad_request("The partition number must be greater than 0")
        if count > MAX_PARTITIONS:
            raise bad_request(f"The partition number must not exceed {MAX_PARTITIONS}")
        return [(f"{name}-{i}", str(i)) for i in range(count)]
    if not isinstance(keys_text, str):
        raise bad_request("binding-keys must be a comma-separated string")
    keys = [k.strip() for k in keys_text.split(",") if k.strip()]
    if not keys:
        raise bad_request("The number of binding keys must be greater than 0")
    if len(keys) > MAX_PARTITIONS:
        raise bad_request(f"The number of binding keys must not exceed {MAX_PARTITIONS}")
    if len(set(keys)) != len(keys):
        raise bad_request("The binding keys must be distinct")
    return [(f"{name}-{k}", k) for k in keys]


def partition_bindings(ctx: Ctx, vh: VHost, name: str) -> list[Binding] | None:
    """The super stream's partition bindings in partition order; None without the
    exchange."""
    return superstreams.partition_bindings(ctx.api, vh.name, name)


async def put_super_stream(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True, unknown=vhost_not_found())
    name = ctx.params["name"]
    body = await ctx.json_object()
    try:
        parts = layout(name, body)
        arguments = queue_arguments(as_dict(body.get("arguments"), "arguments"))
    except BadArgument as exc:
        _refused(vh.name, name, str(exc))
        raise bad_request(str(exc)) from None
    except HttpError as exc:
        _refused(vh.name, name, exc.reason)
        raise
    ctx.check(vh.name, "configure", "exchange", name)
    ctx.check(vh.name, "read", "exchange", name)
    for stream, _ in parts:
        ctx.check(vh.name, "configure", "queue", stream)
        ctx.check(vh.name, "write", "queue", stream)
    taken = superstreams.existing(ctx.api, vh.name, name, [stream for stream, _ in parts])
    if taken is not None:
        _refused(vh.name, name, taken)
        raise bad_request(taken)
    try:
        superstreams.create(ctx.api, vh.name, name, parts, arguments)
    except AMQPError as exc:  # nothing half made stays (RabbitMQ's rollback)
        _refused(vh.name, name, exc.text)
        raise amqp_error_to_http(exc) from None
    log.info("super stream '%s' in vhost '%s' created with %d partitions", name, vh.name,
             len(parts))
    return created()


async def get_super_stream(ctx: Ctx) -> Any:
    vh = ctx.vhost()
    name = ctx.params["name"]
    bindings = partition_bindings(ctx, vh, name)
    if bindings is None:
        raise not_found("super_stream_not_found")
    return json_response({"name": name, "vhost": vh.name, "partitions": [
        {"name": b.destination.name, "routing_key": b.routing_key,
         "partition_order": b.arguments.get(ORDER_ARGUMENT)} for b in bindings]})


async def delete_super_stream(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True)
    name = ctx.params["name"]
    bindings = partition_bindings(ctx, vh, name)
    if bindings is None:
        log.info("deleting super stream '%s' in vhost '%s' refused: no such exchange",
                 name, vh.name)
        raise not_found("super_stream_not_found")
    streams = list(dict.fromkeys(b.destination.name for b in bindings))
    ctx.check(vh.name, "configure", "exchange", name)
    for stream in streams:
        ctx.check(vh.name, "configure", "queue", stream)
    superstreams.delete(ctx.api, vh.name, name, streams)
    log.info("super stream '%s' in vhost '%s' deleted with %d partitions", name, vh.name,
             len(streams))
    return no_content()


def _refused(vhost: str, name: str, reason: str) -> None:
    log.info("creating super stream '%s' in vhost '%s' refused: %s", name, vhost, reason)


def routes(r: Router) -> None:
    path = "/api/stream/super-streams/{vhost}/{name}"
    r.put(path, put_super_stream)
    r.get(path, get_super_stream)
    r.delete(path, delete_super_stream)
