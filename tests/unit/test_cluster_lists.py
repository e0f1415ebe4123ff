"""Lists of the whole cluster (amqpd.http.cluster_lists) with a stand-in broker API:
the parts merge node by node in name order, each item marked with its node where its
view does not name it; a node's error answer leaves that node out; the other nodes are
asked without the list options, which apply to the merged list (paging counts the
whole cluster's items); a node answers with its route handler's own part, run for the
asking user with ``local_only``; one object missing here is the answer of the node
that has it; a single node answers with its own only and asks nobody."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from multidict import MultiDict, MultiDictProxy

from amqpd.broker.api import BrokerAPI
from amqpd.http.cluster_lists import (
    AskedRequest,
    answer_peer,
    elsewhere,
    merge_parts,
    stamp_connection_node,
    stamp_node,
    whole_cluster,
)
from amqpd.http.core import Ctx, HttpError, Router, json_response, list_options, not_found


class FakeApi:
    def __init__(self, answers: dict[str, Any], wide: bool = True) -> None:
        self.answers = answers
        self.wide = wide
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def node_name(self) -> str:
        return "node-b"

    def lists_cluster_wide(self) -> bool:
        return self.wide

    async def ask_every_node(self, kind: str, args: dict[str, Any],
                             ) -> tuple[dict[str, Any], dict[str, str]]:
        self.asked.append((kind, args))
        return self.answers, {"node-d": "no answer within 1s"}

    def user(self, name: str) -> Any:
        return type("U", (), {"name": name, "tags": ["monitoring"]})() if name else None


def ctx_for(api: FakeApi, path: str, query: list[tuple[str, str]],
            method: str = "GET", headers: dict[str, str] | None = None) -> Ctx:
    request = AskedRequest(method, path, MultiDictProxy(MultiDict(query)), {},
                           headers or {})
    user = api.user("watcher")
    return Ctx(cast(BrokerAPI, api), cast(Any, request), user, {})


def test_parts_merge_by_node_name_each_item_stamped() -> None:
    parts = {"node-c": [{"name": "c1"}], "node-a": [{"name": "a1"}, {"name": "a2"}],
             "node-b": {"error": "not_authorized"}}
    merged = merge_parts(parts, stamp_node)
    assert merged == [{"name": "a1", "node": "node-a"}, {"name": "a2", "node": "node-a"},
                      {"name": "c1", "node": "node-c"}]
    # a view that names its node keeps it; a stream publisher's connection_details
    pubs = merge_parts({"n1": [{"node": "n0", "connection_details": {"name": "x"}}]},
                       stamp_connection_node)
    assert pubs == [{"node": "n0", "connection_details": {"name": "x", "node": "n1"}}]


def test_the_others_are_asked_without_list_options_which_apply_to_the_whole() -> None:
    api = FakeApi({"node-a": {"status": 200, "body": [{"name": "a1", "node": "node-a"},
                                                      {"name": "a2", "node": "node-a"}]},
                   "node-c": {"status": 401, "body": {"error": "not_authorized"}},
                   # no such list there (its stream listener off): nothing from it
                   "node-e": {"status": 404, "body": {"error": "Object Not Found"}}})
    query = [("page", "1"), ("page_size", "2"), ("sort", "name"), ("sort_reverse", "true"),
             ("columns", "name"), ("name", "2"), ("msg_rates_age", "60")]
    ctx = ctx_for(api, "/api/connections", query, headers={"X-Reason": "r"})
    mine = [{"name": "b2", "node": "node-b"}, {"name": "b1", "node": "node-b"}]
    merged = asyncio.run(whole_cluster(ctx, mine))
    assert [i["name"] for i in merged] == ["a1", "a2", "b2", "b1"]  # c, e left out
    (kind, args), = api.asked
    assert kind == "http-local-part"
    assert args == {"method": "GET", "path": "/api/connections",
                    "query": [["msg_rates_age", "60"]], "headers": {"X-Reason": "r"},
                    "user": "watcher"}
    page = list_options(merged, ctx.query)
    assert page["total_count"] == 4 and page["filtered_count"] == 2
    assert page["items"] == [{"name": "b2"}, {"name": "a2"}]


def test_a_single_node_and_a_peers_question_ask_nobody() -> None:
    single = FakeApi({}, wide=False)
    mine = [{"name": "x"}]
    assert asyncio.run(whole_cluster(ctx_for(single, "/api/channels", []), mine)) is mine
    peer = FakeApi({"node-a": {"status": 200, "body": [{"name": "y"}]}})
    ctx = ctx_for(peer, "/api/channels", [])
    ctx.local_only = True
    assert asyncio.run(whole_cluster(ctx, mine)) is mine
    assert single.asked == [] and peer.asked == []
    with pytest.raises(HttpError) as exc:
        asyncio.run(elsewhere(ctx_for(single, "/api/connections/x", []), not_found()))
    assert exc.value.status == 404


def test_one_object_elsewhere_is_the_answer_of_the_node_that_has_it() -> None:
    api = FakeApi({"node-a": {"status": 404, "body": {"error": "Object Not Found"}},
                   "node-c": {"status": 204, "body": None}})
    ctx = ctx_for(api, "/api/connections/x", [], method="DELETE")
    assert asyncio.run(elsewhere(ctx, not_found())) == (204, None)
    none = FakeApi({"node-a": {"status": 404, "body": {"error": "Object Not Found"}}})
    with pytest.raises(HttpError) as exc:
        asyncio.run(elsewhere(ctx_for(none, "/api/connections/x", []), not_found()))
    assert exc.value.status == 404


def test_a_node_answers_with_its_route_handlers_own_part() -> None:
    seen: list[Ctx] = []

    async def handler(ctx: Ctx) -> Any:
        seen.append(ctx)
        if ctx.params.get("name") == "gone":
            raise not_found()
        return json_response([{"name": "mine", "age": ctx.query.get("msg_rates_age"),
                               "reason": ctx.request.headers.get("X-Reason")}])

    router = Router()
    router.get("/api/connections", handler)
    router.get("/api/connections/{name}", handler)
    api = FakeApi({})
    args = {"method": "GET", "path": "/api/connections", "query": [["msg_rates_age", "60"]],
            "headers": {"X-Reason": "r"}, "user": "watcher"}
    got = asyncio.run(answer_peer(cast(BrokerAPI, api), router, {}, args))
    assert got == {"status": 200, "body": [{"name": "mine", "age": "60", "reason": "r"}]}
    assert seen[0].local_only and seen[0].username == "watcher"
    gone = asyncio.run(answer_peer(cast(BrokerAPI, api), router, {},
                                   {**args, "path": "/api/connections/gone"}))
    assert gone == {"status": 404, "body": {"error": "Object Not Found",
                                            "reason": "Not Found"}}
    nobody = asyncio.run(answer_peer(cast(BrokerAPI, api), router, {}, {**args, "user": ""}))
    assert nobody["status"] == 401
    assert asyncio.run(answer_peer(cast(BrokerAPI, api), router, {},
                                   {**args, "path": "/api/nothing"}))["status"] == 404
