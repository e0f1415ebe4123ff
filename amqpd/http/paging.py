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
        key = sort_keys[sort]
        chosen = sorted(chosen, key=lambda o: _sort_key(key(o)),
                        reverse=q.get("sort_reverse") == "true")
    filtered = len(chosen)
    items = [view(o) for o in page_slice(chosen, page, size)]
    columns = q.get("columns")
    if columns:
        cols = [c for c in columns.split(",") if c]
        items = [_project(i, cols) for i in items]
    return page_body(items, page, size, filtered, total)
