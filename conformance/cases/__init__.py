"""Importing this package registers every case."""

from conformance.cases import (  # noqa: F401
    access,
    acks,
    basic,
    channel,
    clients,
    confirm_tx,
    connection,
    durability,
    edges,
    exchange,
    extensions,
    extensions2,
    extensions3,
    frames,
    guarantees,
    http_api,
    policies,
    queue,
    routing,
    rules,
)
