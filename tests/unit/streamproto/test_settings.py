"""The stream listener's settings follow the project's convention (config key,
AMQPD_* variable, command-line flag) and are off by default."""

from __future__ import annotations

from pathlib import Path

from amqpd.cli import build_parser
from amqpd.config import load_settings


def test_off_by_default_on_by_environment_or_file(tmp_path: Path) -> None:
    s = load_settings(None, environ={})
    assert (s.stream, s.stream_port) == (False, 5552)
    s = load_settings(None, environ={"AMQPD_STREAM": "1", "AMQPD_STREAM_PORT": "0"})
    assert (s.stream, s.stream_port) == (True, 0)
    cfg = tmp_path / "amqpd.toml"
    cfg.write_text('stream = true\nstream_port = 15552\nstream_advertised_host = "h"\n')
    s = load_settings(cfg, environ={})
    assert (s.stream, s.stream_port, s.stream_advertised_host) == (True, 15552, "h")


def test_stream_port_flag_turns_the_listener_on() -> None:
    args = build_parser().parse_args(["--stream-port", "6000"])
    assert args.stream_port == 6000
    assert build_parser().parse_args([]).stream_port is None
