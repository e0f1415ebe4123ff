"""What the shovel's and federation's HTTP handlers share."""

from __future__ import annotations

import logging
from typing import Any

from amqpd.http.core import Ctx, HttpError

log = logging.getLogger("amqpd.http")


async def ask(ctx: Ctx, node: str, kind: str, args: dict[str, Any]) -> Any:
    """``ctx.api.ask_node`` for a management call that another node of the cluster must
    carry out (restart the link it runs): no answer in time is a 503 with the reason; a
    node that is not running, or that answered 404, comes back as 404 (an AMQP error the
    HTTP layer maps)."""
    try:
        return await ctx.api.ask_node(node, kind, args)
    except TimeoutError as exc:
        log.warning("%s %s: %s", ctx.request.method, ctx.request.path, exc)
        raise HttpError(503, "service_unavailable", str(exc)) from None
