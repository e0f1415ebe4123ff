"""Lists of the whole cluster: connections, channels and consumers (AMQP 0-9-1 and the
stream protocol) as RabbitMQ 3.10 lists them on any node, each item naming its node.

Why here and so. A node knows only its own clients; RabbitMQ's management plugin asks
every node over Erlang RPC and lists what it reached. amqpd's nodes ask each other over
the inter-node links (:mod:`amqpd.cluster.peer_ask`: the link is there, authenticated,
and carries an answer of any size, where etcd's request limit and polling would not;
docs/clustering.md, "Lists of the whole cluster"). What a node answers is what its own
route handler answers, run for the asking node's user with the query's list options
taken off (:func:`answer_peer`): one code path for a list whichever node builds it, the
user's rights checked by the node that holds the objects (users are the cluster's).

The asking handler builds its own part as before, then :func:`whole_cluster` adds the
others' parts, and the list options (filter, sort, page, columns) apply to the whole.
A node that does not answer within ``cluster.list_timeout`` seconds (stopped, gone, its
link down) is left out, with a log line naming it: the list is what the reachable nodes
gave. One connection (``GET`` / ``DELETE /api/connections/{name}``, its channels, one
channel, one stream connection) is looked for on the other nodes when this node does
not have it (:func:`elsewhere`).

A single node, and a worker of a ``workers = N`` node (``cluster.wide_lists`` false:
the node's HTTP front merges the workers' lists, amqpd/workers/http_front.py), answer
with their own only, exactly as before.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from multidict import MultiDict, MultiDictProxy

from amqpd.broker.api import AMQPError
from amqpd.http.core import (
    LIST_OPTIONS,
    Ctx,
    HttpError,
    Router,
    amqp_error_to_http,
    split_raw_path,
)
from amqpd.http.listener import LOCAL_PART

if TYPE_CHECKING:
    from aiohttp import web

    from amqpd.broker.api import BrokerAPI

log = logging.getLogger("amqpd.http.cluster")

# request headers a handler of these routes reads (DELETE's reason), passed along
PASSED_HEADERS = ("X-Reason",)

Stamp = Callable[[dict[str, Any], str], None]


def wide(ctx: Ctx) -> bool:
    """Is this request's list the whole cluster's (a cluster member asked by a client,
    not by another node)?"""
    return not ctx.local_only and ctx.api.lists_cluster_wide()


def _question(ctx: Ctx) -> dict[str, Any]:
    """What another node is asked: this request, its list options taken off."""
    return {"method": ctx.request.method,
            "path": ctx.request.raw_path.split("?", 1)[0],
            "query": [[k, v] for k, v in ctx.query.items() if k not in LIST_OPTIONS],
            "headers": {h: ctx.request.headers[h] for h in PASSED_HEADERS
                        if h in ctx.request.headers},
            "user": ctx.username}


async def _ask_others(ctx: Ctx) -> dict[str, dict[str, Any]]:
    answers, _missing = await ctx.api.ask_every_node(LOCAL_PART, _question(ctx))
    return {node: a for node, a in answers.items() if isinstance(a, dict)}


def merge_parts(parts: Mapping[str, Any], stamp: Stamp | None = None,
                ) -> list[dict[str, Any]]:
    """The items of every node's part, node by node in name order (each in its node's
    order); ``stamp(item, node)`` marks each with its node where the view does not
    already. A part that is not a list (an error answer) adds nothing."""
    out: list[dict[str, Any]] = []
    for node in sorted(parts):
        items = parts[node]
        if not isinstance(items, list):
            continue
        for item in items:
            if isinstance(item, dict):
                if stamp is not None:
                    stamp(item, node)
                out.append(item)
    return out


async def whole_cluster(ctx: Ctx, mine: list[dict[str, Any]],
                        stamp: Stamp | None = None) -> list[dict[str, Any]]:
    """``mine`` (this node's part of the list) with every other running node's, for
    this request's route; ``mine`` alone unless :func:`wide`."""
    if not wide(ctx):
        return mine
    parts: dict[str, Any] = {ctx.api.node_name(): mine}
    for node, answer in (await _ask_others(ctx)).items():
        status = answer.get("status")
        if status == 200:
            parts[node] = answer.get("body")
        elif status == 404:  # no such list there: its stream listener is off
            log.debug("cluster list %s: node %s has none", ctx.request.path, node)
        else:
            log.warning("cluster list %s: node %s answered %s, left out", ctx.request.path,
                        node, status)
    return merge_parts(parts, stamp)


async def elsewhere(ctx: Ctx, missing: HttpError) -> tuple[int, Any]:
    """The answer (status, JSON body or None) of the other node that has the object
    this node does not (``missing``: this node's 404, raised again when no node has
    it). A ``DELETE`` is asked of every node at once; the one that has it does it."""
    if not wide(ctx) or missing.status != 404:
        raise missing
    answers = await _ask_others(ctx)
    for node in sorted(answers):
        answer = answers[node]
        status = answer.get("status")
        if isinstance(status, int) and 200 <= status < 300:
            return status, answer.get("body")
    raise missing


def stamp_node(item: dict[str, Any], node: str) -> None:
    """A stream connection's view names its node (RabbitMQ's ``node``)."""
    item.setdefault("node", node)


def stamp_connection_node(item: dict[str, Any], node: str) -> None:
    """A stream publisher's or consumer's ``connection_details`` name its node."""
    details = item.get("connection_details")
    if isinstance(details, dict):
        details.setdefault("node", node)


# ------------------------------------------------------------------ the answering node
@dataclass
class AskedRequest:
    """What a route handler reads of its request, for one another node asked for
    (there is no HTTP request here): the method, path, query, the headers passed
    along, and the application (its rate sampler)."""

    method: str
    raw_path: str
    query: MultiDictProxy[str]
    app: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.raw_path


async def answer_peer(api: BrokerAPI, router: Router, app: Any,
                      args: dict[str, Any]) -> dict[str, Any]:
    """This node's own answer to another node's question (:func:`_question`): the
    route's handler run for the asking node's user, this node's part only. Its status
    and JSON body; an error as RabbitMQ's body with its status."""
    method = str(args.get("method") or "GET")
    path = str(args.get("path") or "")
    query = MultiDictProxy(MultiDict([(str(k), str(v)) for k, v in args.get("query") or []]))
    headers = {str(k): str(v) for k, v in (args.get("headers") or {}).items()}
    try:
        route, params = router.resolve(method, split_raw_path(path))
        user = api.user(str(args.get("user") or ""))
        if user is None:
            raise HttpError(401, "not_authorized", "Login failed")
        request = AskedRequest(method, path, query, app, headers)
        ctx = Ctx(api, cast("web.Request", request), user, params, local_only=True)
        response = await route.handler(ctx)
    except HttpError as exc:
        return {"status": exc.status, "body": {"error": exc.error, "reason": exc.reason}}
    except AMQPError as exc:
        err = amqp_error_to_http(exc)
        return {"status": err.status, "body": {"error": err.error, "reason": err.reason}}
    raw = getattr(response, "body", None)
    body = json.loads(bytes(raw)) if isinstance(raw, bytes | bytearray) and raw else None
    return {"status": response.status, "body": body}


__all__ = ["LOCAL_PART", "AskedRequest", "answer_peer", "elsewhere", "merge_parts",
           "stamp_connection_node", "stamp_node", "whole_cluster", "wide"]
