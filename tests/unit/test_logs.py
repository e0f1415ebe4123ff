"""The fast log formatter renders a record exactly as structlog's pipeline does.

amqpd/logs.py renders common records itself (structlog's path cost a quarter of the
broker's CPU under connection churn); these tests render each record both ways and
compare everything but the timestamp (structlog stamps the time of formatting, the fast
path the time of the record).
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from amqpd import logs

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


@pytest.fixture(params=["console", "json"])
def handler(request: pytest.FixtureRequest) -> Iterator[logging.Handler]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    logs.configure("debug", request.param, io.StringIO())
    try:
        yield root.handlers[0]
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        logs.clear_context()


def _both(h: logging.Handler, record: logging.LogRecord) -> tuple[str, str]:
    fast = h.formatter
    assert isinstance(fast, logs._Formatter)
    return fast.format(record), fast.slow.format(record)


def _without_stamp(line: str) -> object:
    if line.startswith("{"):
        event = json.loads(line)
        assert STAMP.match(event.pop("timestamp"))
        return event
    assert STAMP.match(line), line
    return STAMP.sub("", line)


def _record(msg: str, *args: object, level: int = logging.INFO,
            name: str = "amqpd.session") -> logging.LogRecord:
    return logging.getLogger(name).makeRecord(name, level, __file__, 1, msg, args, None)


CASES = [
    ("connection opened: user=%s vhost=%s peer=%s", ("guest", "/", ("127.0.0.1", 5000))),
    ("plain %d", (1,)),
    ("two\nlines and a 'quote'", ()),
    ("%s", ({"a": 1},)),
]


@pytest.mark.parametrize(("msg", "args"), CASES)
@pytest.mark.parametrize("bound", [None, ("127.0.0.1:1 -> 127.0.0.1:2", "guest", "/"),
                                   ("a:1 -> b:2", None, None), ("x=y", "o'neil", "v h")])
@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.WARNING,
                                   logging.ERROR, logging.CRITICAL])
def test_fast_path_matches_structlog(handler: logging.Handler, msg: str, args: tuple,
                                     bound: tuple[str, str | None, str | None] | None,
                                     level: int) -> None:
    logs.clear_context()
    if bound is not None:
        logs.bind_connection(*bound)
        logs.bind_channel(3)
    fast, slow = _both(handler, _record(msg, *args, level=level))
    assert "\n" not in fast
    assert _without_stamp(fast) == _without_stamp(slow)


def test_records_the_fast_path_leaves_to_structlog(handler: logging.Handler) -> None:
    logs.bind_connection("c", "u", "v")
    rec = _record("with extra")
    rec.__dict__["http_user"] = "guest"  # what logging's extra= does
    fast, slow = _both(handler, rec)
    assert _without_stamp(fast) == _without_stamp(slow)
    assert "http_user" in fast and "connection" in fast
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.getLogger("x").makeRecord("x", logging.ERROR, __file__, 1, "failed",
                                                (), __import__("sys").exc_info())
    fast, slow = _both(handler, rec)
    assert "ValueError" in fast and "connection" in fast
    assert _without_stamp(fast) == _without_stamp(slow)


def test_structlog_context_is_merged_too(handler: logging.Handler) -> None:
    """The HTTP layer binds its request through structlog's context variables."""
    import structlog

    logs.bind_connection("c", "u", "v")
    structlog.contextvars.bind_contextvars(http_method="DELETE", connection="from http")
    try:
        fast, slow = _both(handler, _record("closing"))
    finally:
        structlog.contextvars.clear_contextvars()
    assert _without_stamp(fast) == _without_stamp(slow)
    assert "http_method" in fast and "from http" in fast


def test_clear_context_drops_the_connection(handler: logging.Handler) -> None:
    logs.bind_connection("127.0.0.1:1 -> 127.0.0.1:2", "guest", "/")
    logs.clear_context()
    fast, _ = _both(handler, _record("after"))
    assert "connection" not in fast and "127.0.0.1:1" not in fast
