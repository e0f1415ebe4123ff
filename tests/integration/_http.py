"""A tiny synchronous client for amqpd's HTTP API in tests (urllib, no extra deps)."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


def q(name: str) -> str:
    """Quote a path segment the way RabbitMQ clients do (``/`` -> ``%2F``)."""
    return quote(name, safe="")


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Api:
    base: str
    user: str | None = "guest"
    password: str = "guest"
    context: ssl.SSLContext | None = None

    def as_user(self, user: str | None, password: str = "") -> Api:
        return Api(self.base, user, password, self.context)

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                headers: dict[str, str] | None = None) -> Response:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.context) as resp:
                return Response(resp.status, dict(resp.headers), resp.read().decode())
        except urllib.error.HTTPError as exc:
            return Response(exc.code, dict(exc.headers), exc.read().decode())

    def get(self, path: str, **kw: Any) -> Response:
        return self.request("GET", path, **kw)

    def put(self, path: str, body: Any = None, **kw: Any) -> Response:
        return self.request("PUT", path, body if body is not None else {}, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Response:
        return self.request("POST", path, body if body is not None else {}, **kw)

    def delete(self, path: str, **kw: Any) -> Response:
        return self.request("DELETE", path, **kw)
