"""Two pamqp adjustments the federation links need to speak to RabbitMQ.

1. Names: RabbitMQ accepts any UTF-8 exchange or queue name, and federation's own names
   carry ``>`` (``federation: X -> C``), which pamqp's 0-9-1 domain patterns refuse when
   a frame is *built* (parsing never checks them): aiormq could not declare or consume
   them. The patterns are process-wide; the broker itself builds no frame with pamqp
   that names a queue or exchange, so it is unaffected. Lengths stay checked.
2. Integer types: pamqp encodes table integers in the smallest type that fits, but
   RabbitMQ's ``x-federation-upstream`` insists that ``x-max-hops`` is a ``long``
   (64-bit, ``l``). A value wrapped in :class:`Long` is always encoded that way.
"""

from __future__ import annotations

import re

from pamqp import constants, encode


class Long(int):
    """An int that goes on the wire as a 64-bit signed table value (``l``)."""


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    anything = re.compile(r"[^\x00]*")
    constants.DOMAIN_REGEX["exchange-name"] = anything
    constants.DOMAIN_REGEX["queue-name"] = anything
    smallest = encode.table_integer

    def table_integer(value: int) -> bytes:
        if isinstance(value, Long):
            return b"l" + encode.long_long_int(int(value))
        return smallest(value)

    encode.table_integer = table_integer
