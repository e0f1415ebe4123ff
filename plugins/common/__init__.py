"""Pieces the shovel and federation plugins share, kept apart from both (not a plugin).

- :mod:`plugins.common.backoff`: the delays between tries of a link (connect, publish);
- :mod:`plugins.common.republish`: publishing into this node's broker per destination
  queue, with confirms, retries that back off, and a bound on tries (a federation
  link's republish, a shovel whose destination is this node);
- :mod:`plugins.common.http`: asking the node that runs a link to act on it.

Nothing here imports :mod:`plugins.shovel` or :mod:`plugins.federation` (an import
contract in pyproject.toml keeps it so).
"""
