"""The management HTTP API: RabbitMQ's paths and JSON shapes, health checks, metrics.

:class:`amqpd.http.listener.HttpServer` is started and stopped by the broker: it binds
the port at start and imports aiohttp and the API's modules (:mod:`amqpd.http.app`, one
module per resource) when the first connection arrives. This package's own import pulls
in nothing, so a broker nobody asks over HTTP does not carry them (~15 MB of resident
memory: bench/RESULTS.md, "Broker memory at start").
"""
