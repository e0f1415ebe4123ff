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
``<data dir>/http-sessions.json`` (mode 0600; ``http_sessions_file`` names another),
rewritten on login and logout only; the file alone reveals neither tokens nor passwords.

Several processes may share one file: the workers of a node (docs/workers.md) each
serve the node's API, and a session made through one must open every other. So the
file, not the process's memory, is the truth: a lookup reads the file again when it
changed since it was last read (one ``stat`` per cookie request), and a login or
logout rewrites it under an exclusive ``flock`` on ``<file>.lock``, from the file as it
is then, so two processes writing at once lose neither's session and a logout through
one worker ends the session on all of them.

A request authenticated by cookie that changes something (any method but GET/HEAD) must
also carry ``X-Requested-With``: a cross-site form cannot set that header, so it cannot
ride on the cookie even where ``SameSite`` is not honoured.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
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
    """Token digests to sessions, kept in a file so they survive a broker restart and
    are shared by every process that uses the same file (module docstring)."""

    def __init__(self, path: Path | None, ttl: float = SESSION_TTL) -> None:
        self.path = path
        self.ttl = ttl
        self.sessions: dict[str, SessionRecord] = {}
        self._seen: tuple[int, int, int] | None = None  # the file as last read
        self._load()

    # ------------------------------------------------------------------ persistence
    def _signature(self) -> tuple[int, int, int] | None:
        """What tells a rewritten file from the one last read (a rewrite replaces it:
        a new inode)."""
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _refresh(self) -> None:
        """Read the file again if another process (or this one) rewrote it."""
        if self.path is not None and self._signature() != self._seen:
            self._load()

    def _load(self) -> None:
        self.sessions.clear()
        self._seen = self._signature()
        if self.path is None or self._seen is None:
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

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Change the sessions as the file has them now, then write them back, with
        every other process that shares the file kept out meanwhile."""
        if self.path is None:
            yield
            return
        lock = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as exc:
            log.warning("web UI sessions file %s not locked: %s", self.path, exc)
        try:
            self._refresh()
            yield
            self._save()
        finally:
            if lock is not None:
                os.close(lock)  # releases the flock

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
            self._seen = self._signature()
        except OSError as exc:
            log.warning("web UI sessions not saved to %s: %s (they end with the process)",
                        self.path, exc)

    # ------------------------------------------------------------------ sessions
    def create(self, user: str, password: str) -> str:
        """A new session for ``user``; returns the token to put in the cookie."""
        token = secrets.token_urlsafe(32)
        with self._changing():
            now = time.time()
            self._expire(now)
            if len(self.sessions) >= MAX_SESSIONS:  # drop the oldest to stay bounded
                oldest = min(self.sessions, key=lambda d: self.sessions[d].expires)
                del self.sessions[oldest]
            self.sessions[_digest(token)] = SessionRecord(user, now + self.ttl,
                                                          seal(token, password))
        return token

    def lookup(self, token: str) -> tuple[str, str] | None:
        """(user, password) of a live session, for the caller to authenticate afresh."""
        digest = _digest(token)
        self._refresh()
        record = self.sessions.get(digest)
        if record is None:
            return None
        if record.expires <= time.time():
            self.drop(token)
            return None
        password = unseal(token, record.sealed)
        return None if password is None else (record.user, password)

    def drop(self, token: str) -> bool:
        """End a session (logout, or its user's password changed) for every process
        that shares the file."""
        digest = _digest(token)
        self._refresh()
        if digest not in self.sessions:  # nothing to write (a stranger's cookie)
            return False
        with self._changing():
            found = self.sessions.pop(digest, None) is not None
        return found

    def _expire(self, now: float) -> None:
        for digest in [d for d, r in self.sessions.items() if r.expires <= now]:
            del self.sessions[digest]
