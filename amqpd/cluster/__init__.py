"""The cluster: several amqpd nodes that clients use as one broker (docs/clustering.md)."""
