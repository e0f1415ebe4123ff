"""amqpd benchmark suite: raw-socket load generator, amqpd vs RabbitMQ side by side."""
