"""What a link forwarded lately, so that a message it forwards again can be flagged.

A source that fails over (hq's warren promoting its standby) can hand a link again a
message whose ack it lost, and with ``redelivered`` unset: the new active never knew it
was delivered. The link itself saw it go by, though. :class:`Seen` keeps a fingerprint
(a 12-byte BLAKE2b of the raw properties and the body, as the source sent them) of the
last :data:`SIZE` messages a link forwarded, across the link's reconnects, so that a
second pass of the same message is flagged for consumers (``x-shovel-redelivered`` for
a shovel, ``redelivered`` in ``x-received-from`` for a federation link). A different
message with the same body and properties within that window is flagged too: the flag
says "maybe a duplicate", and an id in the message (``message_id``) tells for sure.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

SIZE = 10_000  # fingerprints kept per link (~0.5 MB): far more than a prefetch window


def fingerprint(properties: bytes, body: bytes) -> bytes:
    h = hashlib.blake2b(len(properties).to_bytes(4, "big"), digest_size=12)
    h.update(properties)
    h.update(body)
    return h.digest()


class Seen:
    """The last ``size`` fingerprints a link forwarded (oldest forgotten first)."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._fps: OrderedDict[bytes, None] = OrderedDict()

    def check_and_add(self, properties: bytes, body: bytes) -> bool:
        """Was this message forwarded within the window? It counts as forwarded now."""
        return self.check_and_add_fp(fingerprint(properties, body))

    def check_and_add_fp(self, fp: bytes) -> bool:
        """:meth:`check_and_add` for a :func:`fingerprint` computed already (a link
        that also keeps :class:`~plugins.common.taken.Taken` records by it)."""
        fps = self._fps
        if fp in fps:
            fps.move_to_end(fp)
            return True
        fps[fp] = None
        if len(fps) > self.size:
            fps.popitem(last=False)
        return False
