"""EtcdReach: when a node counts as reaching etcd (amqpd.cluster.membership).

The case CI met (test_cluster_mirrored_partition, fresh clone of 3af1cb2): node-c, cut
off from etcd and paused, was healed; answers to other etcd calls came at once, so it
served again while its lease renewal still waited behind a poll hanging on the cut;
0.3 s later the lease window ran out and it paused again ("it cannot reach etcd"),
failing the test's `amqpctl sync_queue`, and 0.3 s after that, renewed, it served
again."""

from __future__ import annotations

from amqpd.cluster.membership import EtcdReach

TTL = 4.0


class Clocks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reachable_while_answers_and_renewals_come() -> None:
    t = Clocks()
    reach = EtcdReach(2.4, t, t)
    assert reach.check(last_ok=99.5, last_renewal=98.0, lease_ttl=TTL)
    assert reach.lost_at is None
    assert reach.check(last_ok=99.5, last_renewal=float("-inf"), lease_ttl=TTL)  # no lease


def test_after_a_loss_answers_alone_do_not_bring_it_back_a_renewal_does() -> None:
    t = Clocks()
    reach = EtcdReach(2.4, t, t)
    renewed = 99.0
    assert reach.check(99.8, renewed, TTL)
    t.now = 102.5  # cut off: no answer for 2.5 s
    assert not reach.check(100.0, renewed, TTL)
    assert reach.lost_at == 102.5
    t.now = 102.7  # healed: other calls answer, the lease is 3.7 s old (not yet 4)
    assert not reach.check(102.7, renewed, TTL)
    renewed = 102.9  # the renewal got through
    t.now = 103.0
    assert reach.check(102.9, renewed, TTL)
    assert reach.lost_at is None
    t.now = 103.5  # and it stays reachable
    assert reach.check(103.4, renewed, TTL)


def test_a_lease_older_than_its_ttl_is_unreachable_whatever_answers() -> None:
    t = Clocks()
    reach = EtcdReach(2.4, t, t)
    assert not reach.check(last_ok=100.0, last_renewal=95.9, lease_ttl=TTL)
