"""plugins/common/backoff.py and seen.py: the pieces that keep links from looping hot and
let them flag what they forward twice (issue 29)."""

from __future__ import annotations

from plugins.common.backoff import Backoff
from plugins.shovel.seen import Seen


def test_backoff_grows_is_capped_jittered_and_resets() -> None:
    b = Backoff(4.0, first=0.5)
    delays = [b.next() for _ in range(10)]
    steps = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    for d, step in zip(delays, steps, strict=True):
        assert step / 2 <= d <= step
    assert b.tries == 10
    b.reset()
    assert 0.25 <= b.next() <= 0.5


def test_backoff_never_zero_unless_capped_at_zero() -> None:
    assert Backoff(0.0).next() == 0.0
    assert Backoff(0.05, first=0.5).next() <= 0.05  # the first step never passes the cap
    assert Backoff(0.05, first=0.5).next() >= 0.025


def test_seen_flags_a_second_pass_and_forgets_the_oldest() -> None:
    seen = Seen(size=3)
    assert not seen.check_and_add(b"p", b"one")
    assert seen.check_and_add(b"p", b"one")
    assert not seen.check_and_add(b"q", b"one")  # other properties: another message
    assert not seen.check_and_add(b"", b"pone")  # the length prefix keeps them apart
    assert not seen.check_and_add(b"p", b"two")
    assert not seen.check_and_add(b"p", b"three")  # window of 3: the oldest goes
    assert not seen.check_and_add(b"q", b"one")
