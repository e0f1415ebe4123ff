"""Plugins are built with the broker, started after the listeners, stopped first."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pika
import pytest

import amqpd.plugins
from amqpd.broker.api import BrokerAPI
from amqpd.config import Settings
from amqpd.plugins import PluginError, load_plugins
from amqpd.server import Broker


class FakePlugin:
    name = "fake"

    def __init__(self, api: BrokerAPI) -> None:
        self.api = api  # plugins are given the public broker API, nothing else
        self.events: list[str] = ["created"]

    def http_routes(self, router: Any) -> None:
        self.events.append("routes")

    async def start(self) -> None:
        self.events.append(f"start listeners={len(self.api.listeners())}")

    async def stop(self) -> None:
        self.events.append("stop")


def test_unknown_plugin_is_a_clear_error() -> None:
    with pytest.raises(PluginError, match="no-such-plugin"):
        load_plugins(None, ["no-such-plugin"])  # type: ignore[arg-type]


def test_lifecycle_and_internal_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amqpd.plugins, "_factory", lambda name: FakePlugin)
    settings = Settings(bind="127.0.0.1", port=0, http_port=0, data_dir=str(tmp_path),
                        plugins=["fake"])

    async def run() -> tuple[list[str], list[str], bool]:
        broker = Broker(settings)
        plugin = broker.plugins["fake"]
        assert isinstance(plugin, FakePlugin)
        await broker.start()
        uri = broker.local_uri("/")

        def connect() -> bool:  # the internal user reaches every vhost, from loopback
            conn = pika.BlockingConnection(pika.URLParameters(uri))
            conn.channel().queue_declare("", exclusive=True)
            conn.close()
            return True

        def ask_http() -> int:  # the API's application, and the routes, come now
            assert broker.http is not None
            url = f"http://127.0.0.1:{broker.http.port}/"  # the web UI: no login
            with urllib.request.urlopen(url, timeout=30) as response:
                return int(response.status)

        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(None, connect)
        before_http = list(plugin.events)
        status = await loop.run_in_executor(None, ask_http)
        await broker.stop()
        return before_http, plugin.events, ok and status == 200

    before_http, events, ok = asyncio.run(run())
    assert ok
    assert before_http == ["created", "start listeners=1"]
    assert events == ["created", "start listeners=1", "routes", "stop"]
