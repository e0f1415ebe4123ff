"""Users, password hashes, tags and per-vhost permissions.

Password hashes use RabbitMQ's ``rabbit_password_hashing_sha256`` format so a RabbitMQ
definitions export imports unchanged: ``base64(salt[4] + sha256(salt[4] + password))``.
Permissions are three regular expressions per (user, vhost): configure, write, read,
matched against the whole resource name, checked where RabbitMQ checks them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from amqpd.protocol.errors import AccessRefused

HASHING_SHA256 = "rabbit_password_hashing_sha256"
HASHING_SHA512 = "rabbit_password_hashing_sha512"
HASHING_MD5 = "rabbit_password_hashing_md5"
_HASHERS = {HASHING_SHA256: hashlib.sha256, HASHING_SHA512: hashlib.sha512,
            HASHING_MD5: hashlib.md5}


def hash_password(password: str, algorithm: str = HASHING_SHA256, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = _HASHERS[algorithm](salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def check_password(password: str, password_hash: str, algorithm: str = HASHING_SHA256) -> bool:
    if not password_hash:
        return False  # a user without a password cannot log in with one
    try:
        raw = base64.b64decode(password_hash)
    except ValueError:
        return False
    salt = raw[:4]
    return hmac.compare_digest(hash_password(password, algorithm, salt), password_hash)


@dataclass(slots=True)
class Permission:
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"
    _compiled: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False)

    def allows(self, kind: str, name: str) -> bool:
        # RabbitMQ matches unanchored (re:run), and '' is a synonym for '^$'.
        pattern = self._compiled.get(kind)
        if pattern is None:
            pattern = re.compile(getattr(self, kind) or "^$")
            self._compiled[kind] = pattern
        return pattern.search(name) is not None


@dataclass(slots=True)
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    hashing_algorithm: str = HASHING_SHA256

    def check(self, password: str) -> bool:
        return check_password(password, self.password_hash, self.hashing_algorithm)


class AuthStore:
    """All users and permissions of a node."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}
        self.loopback_users: set[str] = {"guest"}
        self.internal: tuple[str, str] | None = None
        self.version = 0  # bumped on every permission change: sessions cache checks by it
        # called after every change to users or permissions (the broker saves definitions)
        self.on_change: list[Callable[[], None]] = []

    def add_user(self, name: str, password: str | None = None, tags: list[str] | None = None,
                 password_hash: str | None = None, algorithm: str = HASHING_SHA256) -> User:
        if password_hash is None:
            password_hash = hash_password(password, algorithm) if password is not None else ""
        user = User(name, password_hash, list(tags or []), algorithm)
        self.users[name] = user
        self._changed()
        return user

    def delete_user(self, name: str) -> bool:
        if self.users.pop(name, None) is None:
            return False
        for key in [k for k in self.permissions if k[0] == name]:
            del self.permissions[key]
        self.version += 1
        self._changed()
        return True

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self.permissions[(user, vhost)] = Permission(configure, write, read)
        self.version += 1
        self._changed()

    def clear_permissions(self, user: str, vhost: str) -> None:
        self.permissions.pop((user, vhost), None)
        self.version += 1
        self._changed()

    def clear_vhost(self, vhost: str) -> None:
        """Forget every permission in a deleted vhost."""
        for key in [k for k in self.permissions if k[1] == vhost]:
            del self.permissions[key]
        self.version += 1
        self._changed()

    def clear(self) -> None:
        """Forget every user and permission (saved definitions replace them at boot)."""
        self.users.clear()
        self.permissions.clear()
        self.version += 1
        self._changed()

    def _changed(self) -> None:
        for callback in self.on_change:
            callback()

    def set_internal_user(self, name: str, password: str) -> None:
        """The node's own user for plugins' loopback links: full access to every vhost,
        loopback only, never listed or exported (it is not in ``users``)."""
        self.internal = (name, password)

    def is_internal(self, user: str) -> bool:
        return self.internal is not None and user == self.internal[0]

    def authenticate(self, username: str, password: str, peer_is_loopback: bool) -> User | None:
        if self.internal is not None and username == self.internal[0]:
            if peer_is_loopback and hmac.compare_digest(password, self.internal[1]):
                return User(username, "", ["administrator"])
            return None
        user = self.users.get(username)
        if user is None or not user.check(password):
            return None
        if username in self.loopback_users and not peer_is_loopback:
            return None
        return user

    def can_access_vhost(self, user: str, vhost: str) -> bool:
        return (user, vhost) in self.permissions or self.is_internal(user)

    def check(self, user: str, vhost: str, kind: str, resource_type: str, name: str) -> None:
        """Raise 403 unless ``user`` has ``kind`` (configure/write/read) on the resource."""
        perm = self.permissions.get((user, vhost))
        if (perm is None or not perm.allows(kind, name)) and not self.is_internal(user):
            raise AccessRefused(
                f"{kind} access to {resource_type} '{name}' in vhost '{vhost}' refused for "
                f"user '{user}'"
            )
