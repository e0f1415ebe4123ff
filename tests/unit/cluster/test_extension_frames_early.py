"""Extension frames (mirrored and quorum queues' and streams' replication, forwarded
stream publishes) reaching a node before it started its extensions (issue 35): a copy's
MSTART or SSTART is refused and a forwarded publisher's SPUB answered lost, not dropped
(the other side would wait: 10 s for a copy, for ever for a publisher's confirms)."""

from __future__ import annotations

from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster import stream_wire as S
from amqpd.cluster.cluster_queues import extension_frame_too_early


class _Link:
    """What the function uses of a link: ``send``."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)


def test_mstart_before_the_extensions_started_is_refused() -> None:
    link = _Link()
    extension_frame_too_early(link, M.MSTART, 70001)  # type: ignore[arg-type]
    assert link.sent == [W.encode(M.MREFUSE, 70001, "this node is starting: not ready to copy")]


def test_a_stream_copy_and_a_forwarded_publisher_are_answered() -> None:
    link = _Link()
    extension_frame_too_early(link, S.SSTART, 7)  # type: ignore[arg-type]
    extension_frame_too_early(link, W.SPUB, 8)  # type: ignore[arg-type]
    assert link.sent == [W.encode(S.SREFUSE, 7, "this node is starting: not ready to copy"),
                         W.encode(W.SPUBLOST, 8, "the stream's leader node is starting")]


def test_other_extension_frames_before_start_are_dropped() -> None:
    link = _Link()
    for kind in (M.MENQ, M.MBACKLOG, M.QTERM, M.MSETTLE, S.SREC, S.SACK, W.SPUBEND):
        extension_frame_too_early(link, kind, 70001)  # type: ignore[arg-type]
    assert link.sent == []
