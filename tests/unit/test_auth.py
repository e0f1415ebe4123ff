"""Password hashes in RabbitMQ's format, permission regex semantics, HTTP auth rules."""

from __future__ import annotations

import base64
import hashlib

import pytest

from amqpd.broker.auth import (
    HASHING_MD5,
    HASHING_SHA256,
    HASHING_SHA512,
    AuthStore,
    check_password,
    hash_password,
)
from amqpd.protocol.errors import AccessRefused


def rabbit_sha256(password: str, salt: bytes) -> str:
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def test_hash_is_rabbitmq_format() -> None:
    salt = b"\x01\x02\x03\x04"
    assert hash_password("secret", HASHING_SHA256, salt) == rabbit_sha256("secret", salt)
    raw = base64.b64decode(hash_password("secret"))
    assert len(raw) == 4 + 32


def test_hashes_are_salted() -> None:
    assert hash_password("same") != hash_password("same")


@pytest.mark.parametrize("algorithm", [HASHING_SHA256, HASHING_SHA512, HASHING_MD5])
def test_check_password(algorithm: str) -> None:
    h = hash_password("pw", algorithm)
    assert check_password("pw", h, algorithm)
    assert not check_password("other", h, algorithm)


def test_imported_rabbitmq_hash_authenticates() -> None:
    store = AuthStore()
    store.add_user("alice", password_hash=rabbit_sha256("pw", b"\xaa\xbb\xcc\xdd"),
                   tags=["management"])
    assert store.authenticate("alice", "pw", peer_is_loopback=False) is not None
    assert store.authenticate("alice", "nope", peer_is_loopback=False) is None


def test_passwordless_user_cannot_log_in() -> None:
    store = AuthStore()
    store.add_user("nopass", password_hash="")
    assert store.authenticate("nopass", "", peer_is_loopback=True) is None


def test_garbage_hash_is_refused_not_an_exception() -> None:
    assert not check_password("pw", "!!!not base64")


def test_loopback_only_users() -> None:
    store = AuthStore()
    store.add_user("guest", "guest")
    assert store.authenticate("guest", "guest", peer_is_loopback=True) is not None
    assert store.authenticate("guest", "guest", peer_is_loopback=False) is None


def test_permissions_are_unanchored_and_empty_means_nothing() -> None:
    store = AuthStore()
    store.add_user("u", "p")
    store.set_permissions("u", "/", "^app\\.", "", "orders")
    store.check("u", "/", "configure", "queue", "app.q1")
    with pytest.raises(AccessRefused) as err:
        store.check("u", "/", "configure", "queue", "other")
    assert err.value.reply_code == 403
    assert "configure access to queue 'other' in vhost '/' refused for user 'u'" in str(err.value)
    with pytest.raises(AccessRefused):
        store.check("u", "/", "write", "exchange", "anything")
    store.check("u", "/", "read", "queue", "my-orders-queue")  # unanchored match
    with pytest.raises(AccessRefused):
        store.check("u", "other-vhost", "read", "queue", "orders")


def test_delete_user_drops_permissions() -> None:
    store = AuthStore()
    store.add_user("u", "p")
    store.set_permissions("u", "/", ".*", ".*", ".*")
    assert store.delete_user("u")
    assert not store.can_access_vhost("u", "/")
    assert not store.delete_user("u")


def test_http_api_tag_rules() -> None:
    from amqpd.http.core import MANAGEMENT_TAGS

    assert {"management", "monitoring", "policymaker", "administrator"} == MANAGEMENT_TAGS
