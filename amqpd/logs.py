"""Logging: structlog, one event per line, JSON or console, with connection context.

Every module keeps using ``logging.getLogger(__name__)``; :func:`configure` routes the
standard library's records through structlog's ``ProcessorFormatter``, so third-party and
broker records come out in the same shape::

    {"event": "connection opened: user=guest vhost=/ ...", "level": "info",
     "logger": "amqpd.session", "timestamp": "2026-11-29T08:40:01.123Z",
     "connection": "127.0.0.1:50712 -> 127.0.0.1:5672", "channel": 1}

Connection and channel context are context variables (:func:`bind_connection`,
:func:`bind_channel`); whoever handles a connection's data binds them and every record
logged meanwhile carries them. ``log_format`` is ``json`` or ``console``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

FORMATS = ("json", "console")


def _processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
    ]


def configure(level: str = "info", fmt: str = "console", stream: TextIO | None = None) -> None:
    """Install structlog rendering on the root logger (idempotent)."""
    if fmt not in FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(default=str)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_processors(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _one_line,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    structlog.configure(
        processors=[*_processors(), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def _one_line(_logger: Any, _name: str,
              event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Keep one event per line: tracebacks become an escaped field, not extra lines."""
    for key in ("event", "exception"):
        value = event.get(key)
        if isinstance(value, str) and "\n" in value:
            event[key] = value.replace("\n", "\\n")
    return event


def bind_connection(name: str, user: str | None = None, vhost: str | None = None) -> None:
    values: dict[str, Any] = {"connection": name}
    if user:
        values["user"] = user
    if vhost:
        values["vhost"] = vhost
    structlog.contextvars.bind_contextvars(**values)


def bind_channel(number: int) -> None:
    structlog.contextvars.bind_contextvars(channel=number)


def clear_context() -> None:
    structlog.contextvars.clear_contextvars()


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
