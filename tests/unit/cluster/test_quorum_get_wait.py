"""A quorum queue's basic.get held for the group to serve (amqpd.cluster.quorum_leading):
answered as soon as the group serves; when GET_WAIT passes first it is answered
get-empty, and that is logged (an operator must see why a get found nothing while the
queue had messages)."""

from __future__ import annotations

import logging

import pytest

from amqpd.cluster.quorum_leading import GET_WAIT, GroupLeading


def _leading() -> GroupLeading:
    """The fields answer_gets reads; the rest of a leader is not needed here."""
    lead = GroupLeading.__new__(GroupLeading)
    lead.ident = ("/", "qq1")
    lead.members = ["w0", "w1"]
    lead.streams = {}
    lead.get_waiters = []
    return lead


def test_gets_are_answered_when_the_group_serves(caplog: pytest.LogCaptureFixture) -> None:
    lead = _leading()
    answered: list[str] = []
    lead.when_serving(lambda: answered.append("a"))
    lead.when_serving(lambda: answered.append("b"))
    lead.answer_gets(0.0, False)  # neither serving nor due: both wait
    assert answered == [] and len(lead.get_waiters) == 2
    with caplog.at_level(logging.WARNING, logger="amqpd.cluster.quorum"):
        lead.answer_gets(0.0, True)
    assert answered == ["a", "b"] and not lead.get_waiters
    assert not caplog.records  # served: nothing to warn of


def test_a_get_that_waited_too_long_is_answered_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    lead = _leading()
    answered: list[str] = []
    lead.when_serving(lambda: answered.append("early"))
    deadline = lead.get_waiters[0][0]
    lead.get_waiters.append((deadline + 5.0, lambda: answered.append("later")))
    with caplog.at_level(logging.WARNING, logger="amqpd.cluster.quorum"):
        lead.answer_gets(deadline, False)
    assert answered == ["early"] and len(lead.get_waiters) == 1
    (record,) = caplog.records
    text = record.getMessage()
    assert "'qq1'" in text and "1 basic.get" in text and f"{GET_WAIT:.0f}s" in text
    assert "['w0', 'w1']" in text and "get-empty" in text
