"""The RabbitMQ Stream protocol (port 5552): codec (frames, sans-IO), connection (the
command state machine over the broker's stream queues), tracking (stored offsets and
publisher sequences), amqp10 (the message format both protocols share), transport
(asyncio glue). See docs/streams.md."""
