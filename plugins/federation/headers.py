"""The ``x-received-from`` header: loop detection, hop counting, the tables links prepend.

Every federation hop *prepends* a table to the array header ``x-received-from``
(``rabbit_basic:prepend_table_header``). ``should_forward`` is 3.10.8's
``rabbit_federation_util:should_forward/4``: a message without the header always goes;
otherwise it goes only while fewer than ``max_hops`` hops are recorded and no hop came
from the destination itself (same cluster name *and* vhost). It runs twice per hop: in
the ``x-federation-upstream`` exchange on the upstream, and in the link before it
republishes downstream (the upstream may have fallen back to a plain fanout).
"""

from __future__ import annotations

from typing import Any

ROUTING_HEADER = "x-received-from"
BINDING_HEADER = "x-bound-from"


def received_from(headers: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    value = (headers or {}).get(ROUTING_HEADER)
    if isinstance(value, list):
        return [t for t in value if isinstance(t, dict)]
    return None


def should_forward(headers: dict[str, Any] | None, max_hops: int, cluster_name: str,
                   vhost: str) -> bool:
    hops = received_from(headers)
    if hops is None:
        return True
    if len(hops) >= max_hops:
        return False
    return not any(t.get("cluster-name") == cluster_name and t.get("vhost") == vhost
                   for t in hops)


def prepend(headers: dict[str, Any] | None, key: str, table: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``headers`` with ``table`` in front of the array at ``key``."""
    out = dict(headers or {})
    previous = out.get(key)
    out[key] = [table, *(previous if isinstance(previous, list) else [])]
    return out
