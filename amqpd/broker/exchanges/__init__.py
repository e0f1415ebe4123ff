"""Built-in exchange types; importing this package registers them."""

from amqpd.broker.exchanges import consistent_hash, dedup, delayed, direct, fanout, headers, topic

__all__ = ["consistent_hash", "dedup", "delayed", "direct", "fanout", "headers", "topic"]
