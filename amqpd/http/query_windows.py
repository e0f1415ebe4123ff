"""The sample windows a management request asks for (``msg_rates_age``/``_incr``,
``lengths_*``, ``data_rates_*``), read from its query string.

Apart from :mod:`amqpd.http.object_history`, which keeps the samples: the rate sampler
runs from the broker's start and imports that, while this needs the request machinery
(and with it aiohttp), loaded only when the API is first used (amqpd/http/listener.py).
"""

from __future__ import annotations

from amqpd.http.core import Ctx, bad_request


def sample_window(ctx: Ctx, age_key: str, incr_key: str) -> tuple[float, float]:
    """RabbitMQ's ``msg_rates_age``/``msg_rates_incr`` (and ``lengths_*``) in seconds."""
    try:
        age = float(ctx.query.get(age_key) or 0)
        incr = float(ctx.query.get(incr_key) or 0)
    except ValueError:
        raise bad_request(f"{age_key} and {incr_key} must be numbers") from None
    return max(age, 0.0), max(incr, 0.0)


Window = tuple[float, float]  # (age, incr) in seconds; age 0: no samples asked for


def windows(ctx: Ctx) -> tuple[Window, Window, Window]:
    """The windows a request asks for, as RabbitMQ names them: message rates, lengths
    (a queue's messages) and data rates (a connection's bytes)."""
    return (sample_window(ctx, "msg_rates_age", "msg_rates_incr"),
            sample_window(ctx, "lengths_age", "lengths_incr"),
            sample_window(ctx, "data_rates_age", "data_rates_incr"))
