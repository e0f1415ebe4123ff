"""Login sessions for the web UI: the password is checked once, then a cookie stands for it.

RabbitMQ's UI keeps Basic credentials in the browser; amqpd's does not. ``POST /api/login``
checks the user's password and management tags, then sets an ``HttpOnly``,
``SameSite=Strict`` cookie holding a random 256-bit token. The page's scripts never see the
token, the password is never stored in the page, and ``POST /api/logout`` revokes it.

The server keeps, per session, the SHA-256 of the token, the user name, the expiry time,
and the password *encrypted with a key only the cookie holds* (a keystream from
HMAC-SHA256 keyed by the token, used for this one message). Each request decrypts it
with the presented token and authenticates exactly as HTTP Basic would, so a changed
password or a deleted user ends the session at once, while a broker restart (which may
re-hash configured users' passwords with a new salt) does not. The records live in
``<data dir>/http-sessions.json`` (mode 0600), rewritten on login and logout only; the
file alone reveals neither tokens nor passwords.

A request authenticated by cookie that changes something (any method but GET/HEAD) must
also carry ``X-Requested-With``: a cross-site form cannot set that header, so it cannot
ride on the cookie even where ``SameSite`` is not honoured.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("amqpd.http")

COOKIE = "amqpd_session"
UI_HEADER = "X-Requested-With"
# RabbitMQ's management.login_session_timeout defaults to 8 hours
SESSION_TTL = 8 * 3600.0
MAX_SESSIONS = 10_000  # a bound, so a login loop cannot grow the file without end


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _keystream(token: str, n: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < n:
        out += hmac.new(token.encode(), b"amqpd-session-password/%d" % counter,
                        hashlib.sha256).digest()
        counter += 1
    return out[:n]


def seal(token: str, secret: str) -> str:
    data = secret.encode()
    return base64.b64encode(bytes(a ^ b for a, b in zip(data, _keystream(token, len(data)),
                                                       strict=True))).decode()


def unseal(token: str, sealed: str) -> str | None:
    try:
        data = base64.b64decode(sealed, validate=True)
        return bytes(a ^ b for a, b in zip(data, _keystream(token, len(data)),
                                           strict=True)).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None


@dataclass
class SessionRecord:
    user: str
    expires: float  # wall-clock seconds (sessions outlive the process)
    sealed: str  # the password, encrypted under the token (see the module docstring)


class SessionStore:
    """Token digests to sessions, kept in a file so they survive a broker restart."""

    def __init__(self, path: Path | None, ttl: float = SESSION_TTL) -> None:
        self.path = path
        self.ttl = ttl
        self.sessions: dict[str, SessionRecord] = {}
        self._load()

    # ------------------------------------------------------------------ persistence
    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            raw: Any = json.loads(self.path.read_text())
            now = time.time()
            for digest, rec in dict(raw).items():
                record = SessionRecord(str(rec["user"]), float(rec["expires"]),
                                       str(rec["sealed"]))
                if record.expires > now:
                    self.sessions[str(digest)] = record
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # a damaged file costs everyone a new login, nothing more
            log.warning("web UI sessions not restored from %s: %s", self.path, exc)
            self.sessions.clear()

    def _save(self) -> None:
        if self.path is None:
            return
        data = {d: {"user": r.user, "expires": r.expires, "sealed": r.sealed}
                for d, r in self.sessions.items()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".http-sessions.")
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("web UI sessions not saved to %s: %s (they end with the process)",
                        self.path, exc)

    # ------------------------------------------------------------------ sessions
    def create(self, user: str, password: str) -> str:
        """A new session for ``user``; returns the token to put in the cookie."""
        now = time.time()
        self._expire(now)
        if len(self.sessions) >= MAX_SESSIONS:  # drop the oldest to stay bounded
            oldest = min(self.sessions, key=lambda d: self.sessions[d].expires)
            del self.sessions[oldest]
        token = secrets.token_urlsafe(32)
        self.sessions[_digest(token)] = SessionRecord(user, now + self.ttl,
                                                      seal(token, password))
        self._save()
        return token

    def lookup(self, token: str) -> tuple[str, str] | None:
        """(user, password) of a live session, for the caller to authenticate afresh."""
        digest = _digest(token)
        record = self.sessions.get(digest)
        if record is None:
            return None
        if record.expires <= time.time():
            self.drop(token)
            return None
        password = unseal(token, record.sealed)
        return None if password is None else (record.user, password)

    def drop(self, token: str) -> bool:
        if self.sessions.pop(_digest(token), None) is None:
            return False
        self._save()
        return True

    def _expire(self, now: float) -> None:
        for digest in [d for d, r in self.sessions.items() if r.expires <= now]:
            del self.sessions[digest]
