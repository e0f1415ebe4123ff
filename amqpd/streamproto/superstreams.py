"""Super streams: the layout, made and removed in one place for ``amqpctl
add_super_stream`` (HTTP, :mod:`amqpd.http.super_streams`) and the stream protocol's
create-super-stream / delete-super-stream commands (RabbitMQ 3.13+, keys 0x1d / 0x1e;
:mod:`amqpd.streamproto.connection`).

The layout is RabbitMQ's (``rabbit_stream_manager:create_super_stream``): a durable
direct exchange NAME with the argument ``x-super-stream: true``, one stream per
partition, each bound to the exchange by its binding key with the binding argument
``x-stream-partition-order`` (0, 1, ...), so stream clients (route, partitions) and
AMQP 0-9-1 publishers (through the exchange) use it alike. A failure half way removes
what was made, as RabbitMQ rolls back. Partitions are the stream queues bound to the
exchange, in that order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import AMQPError

if TYPE_CHECKING:
    from amqpd.broker.api import Binding, BrokerAPI

MAX_PARTITIONS: Final = 1000  # a bound on what one request creates
SUPER_STREAM_ARGUMENT: Final = "x-super-stream"
ORDER_ARGUMENT: Final = "x-stream-partition-order"


def correct_name(name: str) -> bool:
    """RabbitMQ's ``enforce_correct_name``: not empty (line breaks aside), not
    ``amq.``-prefixed."""
    stripped = name.replace("\n", "").replace("\r", "")
    return bool(stripped) and not stripped.startswith("amq.")


def layout_problem(name: str, partitions: list[str], keys: list[str]) -> str | None:
    """Why a create-super-stream request's layout is refused (RabbitMQ 3.13's
    validation, its texts), or None."""
    if not correct_name(name):
        return f"{name} is not a correct name for a super stream"
    if len(partitions) != len(keys):
        return "There must be the same number of partitions and binding keys"
    if not partitions:
        return "The partition number must be greater than 0"
    if len(set(partitions)) != len(partitions):
        return f"Duplicate partition names found {partitions}"
    bad = [p for p in partitions if not correct_name(p)]
    if bad:
        return f"{bad} is not a correct partition names"
    if len(partitions) > MAX_PARTITIONS:
        return f"The partition number must not exceed {MAX_PARTITIONS}"
    return None


def existing(api: BrokerAPI, vhost: str, name: str, streams: list[str]) -> str | None:
    """What already holds one of the layout's names (RabbitMQ's texts), or None."""
    if api.find_exchange(vhost, name) is not None:
        return f"there is already an exchange named {name}"
    for stream in streams:
        if api.find_queue(vhost, stream) is not None:
            return f"there is already a queue named {stream}"
    return None


def create(api: BrokerAPI, vhost: str, name: str, parts: list[tuple[str, str]],
           arguments: dict[str, Any]) -> None:
    """Make the layout for ``parts`` ((stream, binding key) in partition order), each
    stream with ``arguments`` (queue arguments); on an :class:`AMQPError` what was made
    goes again and the error is raised."""
    made: list[str] = []
    try:
        api.declare_exchange(vhost, name, "direct", durable=True,
                             arguments={SUPER_STREAM_ARGUMENT: True})
        for order, (stream, key) in enumerate(parts):
            api.declare_queue(vhost, stream, durable=True, arguments=dict(arguments))
            made.append(stream)
            api.bind(vhost, "queue", stream, name, key, {ORDER_ARGUMENT: order})
    except AMQPError:
        for stream in made:
            api.delete_queue(vhost, stream)
        api.delete_exchange(vhost, name)
        raise


def partition_bindings(api: BrokerAPI, vhost: str, name: str) -> list[Binding] | None:
    """The super stream's partition bindings in partition order; None without the
    exchange (partitions are the stream queues bound to it, as RabbitMQ lists them)."""
    ex = api.find_exchange(vhost, name)
    if ex is None:
        return None
    bindings = [b for b in ex.bindings.values() if b.destination_type == "queue"
                and getattr(b.destination, "type_name", "") == "stream"]

    def order(item: tuple[int, Binding]) -> tuple[int, int]:
        value = item[1].arguments.get(ORDER_ARGUMENT)
        return (value if isinstance(value, int) else 1 << 62, item[0])

    return [b for _, b in sorted(enumerate(bindings), key=order)]


def delete(api: BrokerAPI, vhost: str, name: str, streams: list[str]) -> None:
    """Remove the exchange and its partition streams."""
    api.delete_exchange(vhost, name)
    for stream in streams:
        api.delete_queue(vhost, stream)


__all__ = ["MAX_PARTITIONS", "ORDER_ARGUMENT", "SUPER_STREAM_ARGUMENT", "correct_name",
           "create", "delete", "existing", "layout_problem", "partition_bindings"]
