"""Logging: one event per line, JSON or console, in structlog's shape, with connection context.

Every module keeps using ``logging.getLogger(__name__)``; :func:`configure` puts one
handler on the root logger whose formatter renders every standard-library record, third
party or broker, exactly as structlog's ``ProcessorFormatter`` with amqpd's processor
chain would (the chain is :func:`structlog_formatter`)::

    {"event": "connection opened: user=guest vhost=/ ...", "level": "info",
     "logger": "amqpd.session", "timestamp": "2026-11-29T08:40:01.123Z",
     "connection": "127.0.0.1:50712 -> 127.0.0.1:5672", "channel": 1}

Connection and channel context are context variables (:func:`bind_connection`,
:func:`bind_channel`); whoever handles a connection's data binds them and every record
logged meanwhile carries them. The HTTP layer binds its request the same way
(:func:`bind_request`). ``log_format`` is ``json`` or ``console``.

Why not structlog's own pipeline at run time. Cost: the transport binds the context on
every socket read, and a broker under connection churn logs two lines per connection
(opened, closed; RabbitMQ logs three). Through structlog's pipeline a line cost ~250-450
µs on the shared VM, binding ~15 µs: a quarter of the broker's CPU per connection
(py-spy, bench/RESULTS-hardening.md; rendered here, ~140 µs measured in the same minute
as 254 µs before). So the connection context is one plain
:class:`~contextvars.ContextVar` holding a tuple, and :class:`_Formatter` builds the
event dictionary and renders it itself. Memory: ``import structlog`` imports its
development console renderer and traceback module, which import ``rich`` and
``pygments`` wherever they are installed (any virtualenv with a tool that needs rich):
~7 MB of the broker's resident memory for code it never runs, and ~4 MB more for
structlog itself (bench/RESULTS.md, "Broker memory at start"). So this module does not
import structlog; structlog is imported only when asked for: :func:`get_logger`, and
records that structlog's own loggers made (rendered by :func:`structlog_formatter`).
tests/unit/test_logs.py renders records both ways and compares them, and checks that
configuring and logging imports none of structlog, rich or pygments.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import traceback
from collections.abc import MutableMapping
from contextvars import ContextVar
from io import StringIO
from types import TracebackType
from typing import Any, TextIO

FORMATS = ("json", "console")

# (connection name, user, vhost) of the connection whose data is being handled, and the
# channel; set by bind_connection/bind_channel, merged into every record
_CONNECTION: ContextVar[tuple[str, str | None, str | None] | None] = ContextVar(
    "amqpd_connection", default=None)
_CHANNEL: ContextVar[int | None] = ContextVar("amqpd_channel", default=None)
# the HTTP request being answered (bind_request): (key, value) pairs, in binding order
_REQUEST: ContextVar[tuple[tuple[str, Any], ...]] = ContextVar("amqpd_request", default=())
# attributes every LogRecord has; any other one came from ``extra=`` (structlog's rule)
_RECORD_KEYS = frozenset(logging.LogRecord("n", 0, "p", 0, "m", (), None).__dict__)
_UTC = datetime.UTC
# structlog's console renderer pads the level to its longest level name ("exception")
_LEVEL_WIDTH = 9
# characters that make structlog's console renderer quote a string value
_QUOTED = frozenset(" \t=\r\n\"'")
# structlog's add_log_level: the level names it maps
_LEVEL_NAMES = {"warn": "warning", "exception": "error"}


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
    """Every bound context, in the order it is merged into a record: structlog's context
    variables (only if something imported structlog and bound any), the HTTP request,
    the connection. The first binding of a key wins (structlog's ``setdefault``)."""
    out: dict[str, Any] = {}
    contextvars = sys.modules.get("structlog.contextvars")
    if contextvars is not None:
        out.update(contextvars.get_contextvars())
    for key, value in _REQUEST.get():
        out.setdefault(key, value)
    for key, value in _context_items().items():
        out.setdefault(key, value)
    return out


def _merge_context(_logger: Any, _name: str,
                   event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The request and connection context into a record that takes structlog's path
    (after structlog's own ``merge_contextvars``)."""
    for key, value in _REQUEST.get():
        event.setdefault(key, value)
    for key, value in _context_items().items():
        event.setdefault(key, value)
    return event


def configure(level: str = "info", fmt: str = "console", stream: TextIO | None = None) -> None:
    """Install the renderer on the root logger (idempotent)."""
    if fmt not in FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Formatter(fmt))
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
    if "structlog" in sys.modules:  # already paid for: route its loggers here now
        _configure_structlog()


def _configure_structlog() -> None:
    """structlog's loggers hand their events to the standard library's handlers."""
    import structlog

    structlog.configure(
        processors=[*_pre_chain(), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def _pre_chain() -> list[Any]:
    import structlog

    return [
        structlog.contextvars.merge_contextvars,
        _merge_context,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
    ]


def structlog_formatter(fmt: str) -> logging.Formatter:
    """structlog's ``ProcessorFormatter`` with amqpd's chain: what renders records that
    structlog's own loggers made, and the reference :class:`_Formatter` is held to
    (imports structlog, and with it rich where installed)."""
    import structlog

    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(default=str)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0)
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_pre_chain(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _one_line,
            renderer,
        ],
    )


def _one_line(_logger: Any, _name: str,
              event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Keep one event per line: tracebacks become an escaped field, not extra lines."""
    for key in ("event", "exception"):
        value = event.get(key)
        if isinstance(value, str) and "\n" in value:
            event[key] = value.replace("\n", "\\n")
    return event


def _exc_info(value: Any) -> tuple[type[BaseException], BaseException,
                                   TracebackType | None] | None:
    """An ``exc_info`` tuple from a record's ``exc_info`` (structlog's rules: a valid
    tuple, an exception, or anything true for the exception being handled now)."""
    if isinstance(value, BaseException):
        return (value.__class__, value, value.__traceback__)
    if isinstance(value, tuple) and len(value) == 3 \
            and isinstance(value[0], type) and issubclass(value[0], BaseException) \
            and isinstance(value[1], BaseException) \
            and (value[2] is None or isinstance(value[2], TracebackType)):
        return value
    if value:
        exc_type, exc, tb = sys.exc_info()
        if exc_type is None or exc is None:
            return None
        return (exc_type, exc, tb)
    return None


def _format_exception(exc: tuple[type[BaseException], BaseException,
                                 TracebackType | None]) -> str:
    """The standard library's traceback text without its last newline."""
    sio = StringIO()
    traceback.print_exception(exc[0], exc[1], exc[2], None, sio)
    text = sio.getvalue()
    return text[:-1] if text.endswith("\n") else text


def event_dict(record: logging.LogRecord) -> dict[str, Any]:
    """The event dictionary structlog's ``ProcessorFormatter`` builds from a standard
    library record with amqpd's chain, before rendering: the same keys, values and
    insertion order (the JSON renderer keeps it), the time being the record's."""
    event: dict[str, Any] = {"event": record.getMessage()}
    if record.exc_info:
        event["exc_info"] = record.exc_info
    if record.stack_info:
        event["stack_info"] = record.stack_info
    for key, value in _all_context().items():  # merge_contextvars, _merge_context
        event.setdefault(key, value)
    level = record.levelname.lower()  # add_log_level
    event["level"] = _LEVEL_NAMES.get(level, level)
    event["logger"] = record.name  # add_logger_name
    stamp = datetime.datetime.fromtimestamp(record.created, _UTC).isoformat()
    event["timestamp"] = stamp.replace("+00:00", "Z")  # TimeStamper(fmt="iso", utc=True)
    for key, value in record.__dict__.items():  # ExtraAdder
        if key not in _RECORD_KEYS:
            event[key] = value
    exc = _exc_info(event.pop("exc_info", None))  # format_exc_info
    if exc:
        event["exception"] = _format_exception(exc)
    _one_line(None, "", event)
    return event


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - len(text))


def _console_repr(value: Any) -> str:
    """structlog's ConsoleRenderer: a string bare unless it has blanks, = or quotes."""
    if isinstance(value, str) and _QUOTED.isdisjoint(value):
        return value
    return repr(value)


# structlog's ConsoleRenderer columns without colours: these keys first, in this order
# (rendered with str), then every other key sorted as key=value
_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("timestamp", str),
    ("level", lambda v: f"[{_pad(v, _LEVEL_WIDTH)}]"),
    ("event", str),
    ("logger", lambda v: f"[{v}]"),
    ("logger_name", lambda v: f"[{v}]"),
)


def render_console(event: dict[str, Any]) -> str:
    """structlog's ``ConsoleRenderer(colors=False, pad_event_to=0)`` (consumes
    ``event``)."""
    stack = event.pop("stack", None)
    exc = event.pop("exception", None)
    parts = [render(event.pop(key)) for key, render in _COLUMNS if key in event]
    parts += [f"{key}={_console_repr(event[key])}" for key in sorted(event)]
    line = " ".join(p for p in parts if p).rstrip(" ")
    if stack is not None:
        line += "\n" + stack
        if exc is not None:
            line += "\n\n" + "=" * 79 + "\n"
    if exc is not None:
        line += "\n" + exc
    return line


class _Formatter(logging.Formatter):
    """Renders a standard-library record as structlog's pipeline would
    (:func:`event_dict`, then JSON or :func:`render_console`); records made by
    structlog's own loggers go to :func:`structlog_formatter`."""

    def __init__(self, fmt: str) -> None:
        super().__init__()
        self.fmt = fmt
        self.json = fmt == "json"
        self._structlog: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        if hasattr(record, "_logger") and hasattr(record, "_name"):
            # structlog.stdlib's wrap_for_formatter: an event dict, not a message
            if self._structlog is None:
                self._structlog = structlog_formatter(self.fmt)
            return self._structlog.format(record)
        event = event_dict(record)
        if self.json:
            return json.dumps(event, default=str)
        return render_console(event)


def bind_connection(name: str, user: str | None = None, vhost: str | None = None) -> None:
    _CONNECTION.set((name, user, vhost))


def bind_channel(number: int) -> None:
    _CHANNEL.set(number)


def bind_request(**fields: Any) -> None:
    """The HTTP request being answered, for every record logged in its task (structlog's
    ``bind_contextvars``: a key bound again keeps its place)."""
    merged = dict(_REQUEST.get())
    merged.update(fields)
    _REQUEST.set(tuple(merged.items()))


def clear_context() -> None:
    """Forget the connection context (the request's ends with its task)."""
    _CONNECTION.set(None)
    _CHANNEL.set(None)


def get_logger(name: str) -> Any:
    """A structlog logger whose events come out through :func:`configure`'s handler
    (imports structlog: asked for)."""
    import structlog

    if not structlog.is_configured():
        _configure_structlog()
    return structlog.get_logger(name)
