"""The web UI's login sessions: tokens, expiry, the file that keeps them."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from amqpd.http.sessions import SessionStore, seal, unseal


def test_a_token_stands_for_its_user_and_the_file_reveals_nothing(tmp_path: Path) -> None:
    path = tmp_path / "http-sessions.json"
    store = SessionStore(path)
    token = store.create("alice", "s3cret-pässword")
    assert store.lookup(token) == ("alice", "s3cret-pässword")
    assert store.lookup(token + "x") is None
    saved = path.read_text()
    assert token not in saved and "s3cret" not in saved
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_password_opens_only_with_its_token() -> None:
    sealed = seal("token-a", "pw")
    assert unseal("token-a", sealed) == "pw"
    assert unseal("token-b", sealed) != "pw"
    assert unseal("token-a", "not base64!") is None


def test_sessions_survive_a_restart_and_logout_revokes(tmp_path: Path) -> None:
    path = tmp_path / "http-sessions.json"
    token = SessionStore(path).create("alice", "pw")
    again = SessionStore(path)  # the broker restarted
    assert again.lookup(token) == ("alice", "pw")
    assert again.drop(token)
    assert not again.drop(token)
    assert SessionStore(path).lookup(token) is None


def test_expired_sessions_end(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s.json", ttl=-1.0)
    token = store.create("alice", "h")
    assert store.lookup(token) is None
    assert store.sessions == {}


def test_a_damaged_file_costs_a_login_not_the_start(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text("{not json")
    assert SessionStore(path).sessions == {}
    path.write_text(json.dumps({"abc": {"user": "x"}}))  # a record missing fields
    assert SessionStore(path).sessions == {}


def test_processes_sharing_the_file_share_the_sessions(tmp_path: Path) -> None:
    """The workers of a node share one file (docs/workers.md): a login through one
    opens the others, each keeps the others' logins when it writes, and a logout
    through one ends the session everywhere."""
    path = tmp_path / "workers" / "http-sessions.json"
    one, two = SessionStore(path), SessionStore(path)  # two processes' stores
    alice = one.create("alice", "pw-a")
    assert two.lookup(alice) == ("alice", "pw-a")
    bob = two.create("bob", "pw-b")  # written from the file as it is, alice kept
    assert one.lookup(bob) == ("bob", "pw-b")
    assert SessionStore(path).lookup(alice) == ("alice", "pw-a")
    assert two.drop(alice)
    assert one.lookup(alice) is None
    assert one.lookup(bob) == ("bob", "pw-b")
    assert not one.drop(alice)  # already gone: nothing written
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
