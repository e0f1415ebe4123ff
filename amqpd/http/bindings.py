"""/api/bindings: list, create (POST, 201 + relative Location) and delete by properties key.

A binding is named in URLs by its ``properties_key``: the routing key, form-encoded as
RabbitMQ 3.10 does (``a.%23`` for ``a.#``, see quote_key), when there are no arguments
(``~`` for an empty key), else ``<encoded routing key>~<hash of the arguments>``.
"""

from __future__ import annotations

import base64
import hashlib
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus

from aiohttp import web

from amqpd.broker.api import AccessRefused, NotFound, args_key
from amqpd.http.core import (
    Ctx,
    HttpError,
    Router,
    as_dict,
    as_str,
    json_response,
    no_content,
    not_found,
    select_columns,
)

if TYPE_CHECKING:
    from amqpd.broker.api import Binding


def quote_key(routing_key: str) -> str:
    """The routing key as RabbitMQ 3.10 writes it in a properties key: form-encoded
    (UTF-8, space as ``+``) with only letters, digits and ``-_.`` left as they are, so
    ``a.#`` is ``a.%23`` and ``~`` (the key's separator) ``%7E``."""
    return quote_plus(routing_key, safe="").replace("~", "%7E")


def properties_key(routing_key: str, arguments: dict[str, Any], *,
                   quoted: bool = True) -> str:
    """``quoted=False`` gives the form amqpd used before issue 33 (the routing key as
    it is), still accepted to name a binding in a URL."""
    key = quote_key(routing_key) if quoted else routing_key
    if not arguments:
        return key or "~"
    digest = hashlib.md5(args_key(arguments).encode(), usedforsecurity=False).digest()
    return f"{key}~{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"


def binding_view(b: Binding, vhost: str) -> dict[str, Any]:
    return {
        "source": b.source.name,
        "vhost": vhost,
        "destination": b.destination.name,
        "destination_type": b.destination_type,
        "routing_key": b.routing_key,
        "arguments": b.arguments,
        "properties_key": properties_key(b.routing_key, b.arguments),
    }


def _kind(letter: str) -> str:
    if letter == "q":
        return "queue"
    if letter == "e":
        return "exchange"
    raise not_found()


def _between(ctx: Ctx) -> tuple[Any, str, list[Binding]]:
    vh = ctx.vhost()
    kind = _kind(ctx.params["kind"])
    source = ctx.params["source"]
    source = "" if source == "amq.default" else source
    dest = ctx.params["destination"]
    api = ctx.api
    src = api.find_exchange(vh.name, source)
    if src is None:
        raise not_found()
    if (kind == "queue" and api.find_queue(vh.name, dest) is None) or (
            kind == "exchange" and api.find_exchange(vh.name, dest) is None):
        raise not_found()
    found = [b for b in src.bindings.values()
             if b.destination_type == kind and b.destination.name == dest]
    return vh, kind, found


async def list_bindings(ctx: Ctx) -> Any:
    vhosts = [ctx.vhost()] if "vhost" in ctx.params else ctx.visible_vhosts()
    items = [binding_view(b, vh.name) for vh in vhosts for b in ctx.api.bindings(vh)]
    return json_response(select_columns(items, ctx))


async def list_between(ctx: Ctx) -> Any:
    vh, _, found = _between(ctx)
    return json_response([binding_view(b, vh.name) for b in found])


async def create_binding(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True)
    kind = _kind(ctx.params["kind"])
    body = await ctx.json_object()
    routing_key = as_str(body.get("routing_key"), "routing_key", "")
    arguments = as_dict(body.get("arguments"), "arguments")
    source, dest = ctx.params["source"], ctx.params["destination"]
    ctx.check(vh.name, "write", kind, dest)
    ctx.check(vh.name, "read", "exchange", source)  # permissions name it amq.default
    try:
        ctx.api.bind(vh, kind, dest, "" if source == "amq.default" else source, routing_key,
                     arguments, username=ctx.username)
    except NotFound as exc:  # RabbitMQ names an AMQP-side 404 "not_found" here
        raise HttpError(404, "not_found", exc.text) from None
    except AccessRefused:
        raise _refused() from None
    # 201 with no body and the new binding's URL relative to the request's, as RabbitMQ
    # answers (clients such as AMQPStorm's management API read no JSON from it)
    location = f"{quote(dest, safe='')}/{quote(properties_key(routing_key, arguments), safe='')}"
    return web.Response(status=201, headers={"Location": location})


def _find(ctx: Ctx) -> tuple[Any, str, Binding]:
    vh, kind, found = _between(ctx)
    wanted = ctx.params["props"]
    for b in found:
        if properties_key(b.routing_key, b.arguments) == wanted:
            return vh, kind, b
    for b in found:  # the unquoted form of earlier amqpd versions (a.# for a.%23)
        if properties_key(b.routing_key, b.arguments, quoted=False) == wanted:
            return vh, kind, b
    raise not_found()


async def get_binding(ctx: Ctx) -> Any:
    vh, _, b = _find(ctx)
    return json_response(binding_view(b, vh.name))


async def delete_binding(ctx: Ctx) -> Any:
    vh, kind, b = _find(ctx)
    ctx.check(vh.name, "write", kind, b.destination.name)
    ctx.check(vh.name, "read", "exchange", b.source.name)
    try:
        ctx.api.unbind(vh, kind, b.destination.name, b.source.name, b.routing_key,
                       b.arguments, username=ctx.username)
    except AccessRefused:
        raise _refused() from None
    return no_content()


def _refused() -> HttpError:
    """A binding the broker refuses (topic read permission on the key, the default
    exchange): RabbitMQ 3.10.8 answers 401 ``not_authorised`` "Access refused." for
    both, create and delete alike, not the AMQP 403 text."""
    return HttpError(401, "not_authorised", "Access refused.")


def routes(r: Router) -> None:
    r.get("/api/bindings", list_bindings)
    r.get("/api/bindings/{vhost}", list_bindings)
    r.get("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", list_between)
    r.post("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", create_binding)
    r.get("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", get_binding)
    r.delete("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", delete_binding)
