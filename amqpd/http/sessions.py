"""Login sessions for the web UI: the password is checked once, then a cookie stands for it.

RabbitMQ's UI keeps Basic credentials in the browser; amqpd's does not. ``POST /api/login``
checks the user's password and management tags, then sets an ``HttpOnly``,
``SameSite=Strict`` cookie holding a random token. The page's scripts never see the token,
the password is never stored in the page, and ``POST /api/logout`` revokes it.

Only the SHA-256 of each token is kept, with the user name, the expiry time and a
fingerprint of the user's password hash, in ``<data dir>/http-sessions.json`` (mode 0600):
a page left open across a broker restart keeps its session, while changing or deleting
the user ends every session of theirs (the fingerprint no longer matches). The file is
rewritten on login and logout only, which are rare.

A request authenticated by cookie that changes something (any method but GET/HEAD) must
also carry ``X-Requested-With``: a cross-site form cannot set that header, so it cannot
ride on the cookie even where ``SameSite`` is not honoured.
"""

from __future__ import annotations

import hashlib
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


def password_fingerprint(password_hash: str) -> str:
    """Changes whenever the password does; says nothing useful about it."""
    return hashlib.sha256(("amqpd-session:" + password_hash).encode()).hexdigest()[:32]


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class SessionRecord:
    user: str
    expires: float  # wall-clock seconds (sessions outlive the process)
    fingerprint: str


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
                                       str(rec["fingerprint"]))
                if record.expires > now:
                    self.sessions[str(digest)] = record
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # a damaged file costs everyone a new login, nothing more
            log.warning("web UI sessions not restored from %s: %s", self.path, exc)
            self.sessions.clear()

    def _save(self) -> None:
        if self.path is None:
            return
        data = {d: {"user": r.user, "expires": r.expires, "fingerprint": r.fingerprint}
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
    def create(self, user: str, password_hash: str) -> str:
        """A new session for ``user``; returns the token to put in the cookie."""
        now = time.time()
        self._expire(now)
        if len(self.sessions) >= MAX_SESSIONS:  # drop the oldest to stay bounded
            oldest = min(self.sessions, key=lambda d: self.sessions[d].expires)
            del self.sessions[oldest]
        token = secrets.token_urlsafe(32)
        self.sessions[_digest(token)] = SessionRecord(
            user, now + self.ttl, password_fingerprint(password_hash))
        self._save()
        return token

    def lookup(self, token: str, password_hash_of: Any) -> str | None:
        """The user a live token stands for, or None.

        ``password_hash_of(name)`` gives the user's current password hash (None once the
        user is gone): a session ends when its user's password changes."""
        digest = _digest(token)
        record = self.sessions.get(digest)
        if record is None:
            return None
        current = password_hash_of(record.user)
        if record.expires <= time.time() or current is None or \
                not secrets.compare_digest(password_fingerprint(current), record.fingerprint):
            del self.sessions[digest]
            self._save()
            return None
        return record.user

    def drop(self, token: str) -> bool:
        if self.sessions.pop(_digest(token), None) is None:
            return False
        self._save()
        return True

    def _expire(self, now: float) -> None:
        for digest in [d for d, r in self.sessions.items() if r.expires <= now]:
            del self.sessions[digest]
