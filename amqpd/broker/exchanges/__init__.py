"""Built-in exchange types; importing this package registers them."""

from amqpd.broker.exchanges import direct, fanout, headers, topic

__all__ = ["direct", "fanout", "headers", "topic"]
