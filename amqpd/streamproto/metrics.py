"""``amqpd_stream_protocol_*``: the stream protocol's connections, publishers and
consumers in the Prometheus exposition (/metrics), from the same views as the
management API (:mod:`amqpd.streamproto.http`).

Node totals (connections, publishers, consumers) always appear, zero with nobody
connected; then one series per publisher (published, confirmed and errored counts,
its last publishing id) and per consumer (next offset, lag, credit, records delivered,
whether it is its group's active member), labelled with vhost, stream, connection and
id, as amqpd's per-stream series are (streams and their clients are few; RabbitMQ's
plugin keeps per-object series behind its per-object endpoint).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.streamproto.http import consumer_view, open_connections, publisher_view

if TYPE_CHECKING:
    from amqpd.streamproto.transport import StreamListener

P = "amqpd_stream_protocol_"


def add_metrics(listener: StreamListener, e: Any) -> None:
    """Add the families to ``e`` (an amqpd.http.metrics.Exposition)."""
    conns = open_connections(listener)
    publishers = [publisher_view(c, p) for c in conns for p in c.publishers.values()]
    consumers = [consumer_view(c, s) for c in conns for s in c.subscriptions.values()]
    e.add(P + "connections", "gauge", "Stream protocol connections open", len(conns))
    e.add(P + "publishers", "gauge", "Stream protocol publishers declared", len(publishers))
    e.add(P + "consumers", "gauge", "Stream protocol subscriptions", len(consumers))
    e.add(P + "consumers_active", "gauge",
          "Stream protocol subscriptions that read (not a waiting group member)",
          sum(1 for c in consumers if c["active"]))
    for name, kind, help_, key in (
            ("publisher_published_total", "counter",
             "Publishing ids a publisher sent (a sub-entry batch once)", "published"),
            ("publisher_confirmed_total", "counter", "Publishing ids confirmed to a publisher",
             "confirmed"),
            ("publisher_errored_total", "counter",
             "Publishing ids answered with publish-error", "errored"),
            ("publisher_last_publishing_id", "gauge",
             "Highest publishing id a publisher sent (-1: none yet)", "last_publishing_id")):
        for pub in publishers:
            value = pub[key]
            e.add(P + name, kind, help_, -1 if value is None else value, {
                "vhost": pub["queue"]["vhost"], "stream": pub["queue"]["name"],
                "connection": pub["connection_details"]["name"],
                "publisher_id": str(pub["publisher_id"]), "reference": pub["reference"]})
    for name, kind, help_, key in (
            ("consumer_offset", "gauge", "Next offset a subscription reads", "offset"),
            ("consumer_offset_lag", "gauge", "Records written that a subscription has not "
                                             "read yet", "offset_lag"),
            ("consumer_credits", "gauge", "Chunks a subscription may still be sent",
             "credits"),
            ("consumer_consumed_total", "counter", "Records delivered to a subscription",
             "consumed"),
            ("consumer_active", "gauge", "1 if the subscription reads (0: a waiting member "
                                         "of a single active consumer group)", "active")):
        for sub in consumers:
            e.add(P + name, kind, help_, int(sub[key]), {
                "vhost": sub["queue"]["vhost"], "stream": sub["queue"]["name"],
                "connection": sub["connection_details"]["name"],
                "subscription_id": str(sub["subscription_id"]),
                "group": sub["group"] or ""})


__all__ = ["add_metrics"]
