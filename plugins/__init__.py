"""amqpd's plugins (shovel, federation): outside the core, enabled by name in the config."""
