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

Cost matters here: the transport binds the context on every socket read, and a broker
under connection churn logs two lines per connection (opened, closed; RabbitMQ logs
three). Through structlog's pipeline a line cost ~250-450 µs on the shared VM, binding
~15 µs: a quarter of the broker's CPU per connection (py-spy, bench/RESULTS-hardening.md;
rendered here, ~140 µs measured in the same minute as 254 µs before). So the
connection context is one plain :class:`~contextvars.ContextVar` holding a tuple, and
:class:`_Formatter` renders the common record (a stdlib record with no exception, stack
or ``extra`` fields) itself, in exactly the shape structlog would; anything else still
goes through structlog (tests/unit/test_logs.py compares the two).
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from collections.abc import MutableMapping
from contextvars import ContextVar
from typing import Any, TextIO

import structlog

FORMATS = ("json", "console")

# (connection name, user, vhost) of the connection whose data is being handled, and the
# channel; set by bind_connection/bind_channel, merged into every record by
# _merge_connection (structlog path) and _Formatter (fast path)
_CONNECTION: ContextVar[tuple[str, str | None, str | None] | None] = ContextVar(
    "amqpd_connection", default=None)
_CHANNEL: ContextVar[int | None] = ContextVar("amqpd_channel", default=None)
# attributes every LogRecord has; any other one came from ``extra=`` (structlog's rule)
_RECORD_KEYS = frozenset(logging.LogRecord("n", 0, "p", 0, "m", (), None).__dict__)
_UTC = datetime.UTC


def _context_items() -> dict[str, Any]:
    """The connection context (what :func:`bind_connection` and :func:`bind_channel`
    set)."""
    out: dict[str, Any] = {}
    bound = _CONNECTION.get()
    if bound is not None:
        name, user, vhost = bound
        out["connection"] = name
        if user:
            out["user"] = user
        if vhost:
            out["vhost"] = vhost
    channel = _CHANNEL.get()
    if channel is not None:
        out["channel"] = channel
    return out


def _all_context() -> dict[str, Any]:
    """What structlog's ``merge_contextvars`` and :func:`_merge_connection` add, in
    their order (the HTTP layer binds its request through structlog)."""
    out = structlog.contextvars.get_contextvars()
    for key, value in _context_items().items():
        out.setdefault(key, value)
    return out


def _merge_connection(_logger: Any, _name: str,
                      event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The connection context into a record that takes structlog's path."""
    for key, value in _context_items().items():
        event.setdefault(key, value)
    return event


def _processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        _merge_connection,
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
    handler.setFormatter(_Formatter(formatter, fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # No rendering shows the caller's file and line, the thread or the process, and
    # finding the caller costs more than rendering the line (structlog's logger class
    # walks the stack for it): logging skips what it is told nobody reads.
    logging._srcfile = None  # type: ignore[attr-defined]  # logging's documented switch
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
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


class _Formatter(logging.Formatter):
    """Renders a plain stdlib record directly, as structlog's renderer would; hands
    every other record (exceptions, stacks, ``extra=`` fields, structlog's own events)
    to structlog's :class:`~structlog.stdlib.ProcessorFormatter`."""

    def __init__(self, structlog_formatter: logging.Formatter, fmt: str) -> None:
        super().__init__()
        self.slow = structlog_formatter
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info \
                or not isinstance(record.msg, str) \
                or not record.__dict__.keys() <= _RECORD_KEYS:
            return self.slow.format(record)
        event = record.getMessage()
        if "\n" in event:
            event = event.replace("\n", "\\n")  # one event per line (_one_line)
        stamp = datetime.datetime.fromtimestamp(record.created, _UTC).isoformat()
        stamp = stamp.replace("+00:00", "Z")
        level = record.levelname.lower()
        context = _all_context()
        if self.json:
            out: dict[str, Any] = {"event": event}
            out.update(context)
            out["level"] = level
            out["logger"] = record.name
            out["timestamp"] = stamp
            return json.dumps(out, default=str)
        line = f"{stamp} [{level:<9}] {event} [{record.name}]"
        if context:
            line += " " + " ".join(f"{k}={_console_repr(context[k])}" for k in sorted(context))
        return line


_QUOTED = frozenset(" \t=\r\n\"'")


def _console_repr(value: Any) -> str:
    """structlog's ConsoleRenderer: a string bare unless it has blanks, = or quotes."""
    if isinstance(value, str) and _QUOTED.isdisjoint(value):
        return value
    return repr(value)


def bind_connection(name: str, user: str | None = None, vhost: str | None = None) -> None:
    _CONNECTION.set((name, user, vhost))


def bind_channel(number: int) -> None:
    _CHANNEL.set(number)


def clear_context() -> None:
    _CONNECTION.set(None)
    _CHANNEL.set(None)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
