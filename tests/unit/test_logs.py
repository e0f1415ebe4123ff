"""amqpd/logs.py renders every record exactly as structlog's pipeline does, without
importing structlog.

The broker renders records itself (structlog's path cost a quarter of the broker's CPU
under connection churn, and importing structlog imports rich and pygments where they are
installed: ~7 MB of resident memory); these tests render each record both ways, through
:class:`amqpd.logs._Formatter` and through structlog's ``ProcessorFormatter`` with the
same chain (:func:`amqpd.logs.structlog_formatter`), and compare everything but the
timestamp (structlog stamps the time of formatting, amqpd the time of the record).
"""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

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
    return fast.format(record), logs.structlog_formatter(fast.fmt).format(record)


def _without_stamp(line: str) -> object:
    if line.startswith("{"):
        event = json.loads(line)
        assert STAMP.match(event.pop("timestamp"))
        return event
    assert STAMP.match(line), line
    return STAMP.sub("", line)


def _same(h: logging.Handler, record: logging.LogRecord) -> str:
    fast, slow = _both(h, record)
    assert _without_stamp(fast) == _without_stamp(slow)
    if fast.startswith("{"):  # and the same key order
        assert list(json.loads(fast)) == list(json.loads(slow))
    return fast


def _record(msg: object, *args: object, level: int = logging.INFO,
            name: str = "amqpd.session", exc_info: Any = None,
            extra: dict[str, object] | None = None,
            stack: str | None = None) -> logging.LogRecord:
    return logging.getLogger(name).makeRecord(name, level, __file__, 1, msg, args,
                                              exc_info, extra=extra, sinfo=stack)


CASES = [
    ("connection opened: user=%s vhost=%s peer=%s", ("guest", "/", ("127.0.0.1", 5000))),
    ("plain %d", (1,)),
    ("two\nlines and a 'quote'", ()),
    ("%s", ({"a": 1},)),
    ("", ()),
]


@pytest.mark.parametrize(("msg", "args"), CASES)
@pytest.mark.parametrize("bound", [None, ("127.0.0.1:1 -> 127.0.0.1:2", "guest", "/"),
                                   ("a:1 -> b:2", None, None), ("x=y", "o'neil", "v h")])
@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.WARNING,
                                   logging.ERROR, logging.CRITICAL, 5])
def test_plain_records_match_structlog(handler: logging.Handler, msg: str, args: tuple,
                                       bound: tuple[str, str | None, str | None] | None,
                                       level: int) -> None:
    logs.clear_context()
    if bound is not None:
        logs.bind_connection(*bound)
        logs.bind_channel(3)
    fast = _same(handler, _record(msg, *args, level=level))
    assert "\n" not in fast


def _raised() -> tuple[type[BaseException], BaseException, object]:
    try:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise ValueError("boom\nsecond line") from exc
    except ValueError:
        info = sys.exc_info()
        assert info[0] is not None
        return info  # type: ignore[return-value]


@pytest.mark.parametrize("extra", [
    None,
    {"http_user": "guest"},
    {"n": 5, "spaced": "a b", "blob": b"\x00", "obj": ValueError("x")},
    # extras named like structlog's own keys take their place (ExtraAdder overwrites)
    {"event": "replaced", "logger": "other", "logger_name": "ln", "zz": None},
    {"stack": "a stack\ntwo lines"},
    {"exception": "given text"},
])
@pytest.mark.parametrize("exc", ["none", "raised", "outside"])
@pytest.mark.parametrize("stack", [None, "Stack (most recent call last):\n  frame"])
def test_other_records_match_structlog(handler: logging.Handler,
                                       extra: dict[str, object] | None, exc: str,
                                       stack: str | None) -> None:
    logs.bind_connection("c", "u", "v")
    # "outside": log.exception with no exception being handled
    exc_info = {"none": None, "raised": _raised(), "outside": (None, None, None)}[exc]
    rec = _record("failed %s", "x", level=logging.ERROR, exc_info=exc_info, extra=extra,
                  stack=stack)
    fast = _same(handler, rec)
    assert "connection" in fast
    if exc == "raised":
        assert "ValueError: boom" in fast and "KeyError" in fast


def test_a_non_string_message(handler: logging.Handler) -> None:
    _same(handler, _record({"not": "a string"}))
    _same(handler, _record(ValueError("as message %s"), "arg"))


def test_http_request_context(handler: logging.Handler) -> None:
    """The HTTP layer binds its request (logs.bind_request, in the request's task);
    structlog's own context variables are merged too, before it, if anything binds them."""
    import contextvars

    import structlog

    def run() -> None:
        logs.bind_connection("c", "u", "v")
        logs.bind_request(http_method="DELETE", http_path="/api/x", http_user=None)
        logs.bind_request(http_method="GET", connection="from http")
        structlog.contextvars.bind_contextvars(other="from structlog")
        fast = _same(handler, _record("closing"))
        assert "http_method" in fast and "from http" in fast and "from structlog" in fast
        assert "GET" in fast and "DELETE" not in fast

    contextvars.copy_context().run(run)  # as a request's task: its bindings end with it
    fast, _ = _both(handler, _record("after"))
    assert "http_method" not in fast and "from structlog" not in fast


def test_clear_context_drops_the_connection(handler: logging.Handler) -> None:
    logs.bind_connection("127.0.0.1:1 -> 127.0.0.1:2", "guest", "/")
    logs.clear_context()
    fast, _ = _both(handler, _record("after"))
    assert "connection" not in fast and "127.0.0.1:1" not in fast


def test_structlog_loggers_still_log(handler: logging.Handler) -> None:
    """logs.get_logger (structlog's own logger) renders through the same handler."""
    stream = handler.stream  # type: ignore[attr-defined]
    logs.bind_connection("c", "u", "v")
    logs.get_logger("amqpd.test").info("from structlog", key="value")
    line = stream.getvalue().splitlines()[-1]
    assert "from structlog" in line and "value" in line and "amqpd.test" in line
    assert "connection" in line


def test_the_broker_imports_neither_structlog_nor_rich() -> None:
    """Starting and logging (plain records, an exception, ``extra=`` fields, the HTTP
    request context) imports no structlog, so none of what structlog's development
    renderer pulls in where it is installed (rich, pygments): ~7 MB of RSS."""
    code = textwrap.dedent("""
        import io, logging, sys
        import amqpd.cli, amqpd.server, amqpd.transport, amqpd.session
        from amqpd import logs
        for fmt in ("console", "json"):
            logs.configure("debug", fmt, io.StringIO())
            logs.bind_connection("c", "u", "v")
            logs.bind_request(http_method="GET")
            log = logging.getLogger("amqpd.test")
            log.info("plain %s", 1)
            log.warning("with extra", extra={"k": "v"}, stack_info=True)
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("failed")
        loaded = sorted(m for m in sys.modules
                        if m.split(".")[0] in ("structlog", "rich", "pygments"))
        print(",".join(loaded))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == ""
