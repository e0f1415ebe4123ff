"""The standby's ACK rule with the check beside the fsync (syncer.AckPoint): a record is
acknowledged only once it is both checked and covered by a finished fsync, whichever
comes last, and never one whose bytes were written after that fsync began."""

from __future__ import annotations

from amqpd.replication.syncer import AckPoint


def test_checked_before_the_fsync_ends_waits_for_it() -> None:
    p = AckPoint()
    g1 = p.wrote()
    gen = p.fsync_began()
    p.checked(g1, 10, 1000)
    assert p.ackable() is None  # checked, not yet durable
    p.fsynced(gen)
    assert p.ackable() == (10, 1000)
    assert p.ackable() is None  # each once


def test_fsync_ending_before_the_check_waits_for_the_check() -> None:
    p = AckPoint()
    g1 = p.wrote()
    p.fsynced(p.fsync_began())
    assert p.ackable() is None  # durable, not yet checked
    p.checked(g1, 7, 700)
    assert p.ackable() == (7, 700)


def test_bytes_written_after_the_fsync_began_are_not_covered_by_it() -> None:
    p = AckPoint()
    g1 = p.wrote()
    gen = p.fsync_began()
    g2 = p.wrote()  # arrives while that fsync runs
    p.checked(g1, 10, 1000)
    p.checked(g2, 20, 2000)
    p.fsynced(gen)
    assert p.ackable() == (10, 1000)  # not 20: its bytes may not be on disk
    p.fsynced(p.fsync_began())
    assert p.ackable() == (20, 2000)


def test_several_generations_in_one_round_ack_the_newest() -> None:
    p = AckPoint()
    gens = [p.wrote() for _ in range(3)]
    gen = p.fsync_began()
    for i, g in enumerate(gens):
        p.checked(g, 10 * (i + 1), 100 * (i + 1))
    p.fsynced(gen)
    assert p.ackable() == (30, 300)


def test_an_older_round_ending_late_does_not_move_durability_back() -> None:
    p = AckPoint()
    g1 = p.wrote()
    p.fsynced(p.fsync_began())
    p.fsynced(0)
    p.checked(g1, 5, 50)
    assert p.ackable() == (5, 50)
