"""Server-side paging that stays fast with many objects (the web UI's queue list).

:func:`~amqpd.http.core.select_columns` works on finished JSON views: with 10,000 queues
it would build 10,000 views to show 100 of them. Here the broker's objects themselves
are filtered by name and sorted by a key read straight from the object, the page is cut,
and views are built for that page only. A sort on anything not in ``sort_keys`` (say
``message_stats.publish_details.rate``) falls back to building every view: correct,
just slower. Unpaged requests keep RabbitMQ's plain list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from amqpd.http.core import (
    Ctx,
    _project,
    _sort_key,
    filter_by_name,
    page_body,
    page_params,
    page_slice,
    select_columns,
)

T = TypeVar("T")


def paged_list(ctx: Ctx, objects: list[T], view: Callable[[T], dict[str, Any]],
               name_of: Callable[[T], str],
               sort_keys: dict[str, Callable[[T], Any]]) -> Any:
    """The JSON body for a list request over ``objects`` (already in default order)."""
    q = ctx.query
    sort = q.get("sort") or ""
    if "page" not in q or (sort and sort not in sort_keys):
        return select_columns([view(o) for o in objects], ctx)
    total = len(objects)
    page, size = page_params(q)
    chosen = filter_by_name(objects, q, name_of)
    if sort:
        chosen = _sorted(chosen, sort_keys[sort], q.get("sort_reverse") == "true")
    filtered = len(chosen)
    items = [view(o) for o in page_slice(chosen, page, size)]
    columns = q.get("columns")
    if columns:
        cols = [c for c in columns.split(",") if c]
        items = [_project(i, cols) for i in items]
    return page_body(items, page, size, filtered, total)


def _sorted(objects: list[T], key: Callable[[T], Any], reverse: bool) -> list[T]:
    """Stable sort on one key per object, read once; the same order select_columns gives
    (numbers before strings), without wrapping every comparison when the keys are all
    strings or all numbers, which they are for every key in practice."""
    keys = [key(o) for o in objects]
    if not (all(type(k) is str for k in keys)
            or all(type(k) is int or type(k) is float for k in keys)):
        keys = [_sort_key(k) for k in keys]
    order = sorted(range(len(objects)), key=keys.__getitem__, reverse=reverse)
    return [objects[i] for i in order]
