"""The AMQP 0-9-1 numbers amqpd reads and writes itself: one name for each.

Every frame type, method id and content-header property flag that amqpd's own code
compares or builds is named here, once; no other module spells one as a literal.
(pamqp has the same numbers for the methods it decodes; the hot path and the frames
amqpd builds by hand use these.)

Method ids are the 32-bit *method index* that opens every method frame's payload:
``class_id << 16 | method_id``, as pamqp's ``Frame.index``. Packed big-endian as a u32 it
is exactly the two u16s of the wire, so :func:`amqpd.protocol.codec.method_frame` takes
one of these names directly.

Property flags: the content header's 16-bit property-flags word, most significant bit
first (AMQP 0-9-1 basic class). Code that tests a flag straight in the raw property bytes
looks at one byte of that word: ``FLAG_X_HI`` is bit ``FLAG_X`` within the first byte
(``properties[0]``), ``FLAG_X_LO`` within the second (``properties[1]``). They are derived
from the word-wide names below, so each flag still has one definition.

All names are ``Final``: mypyc folds them into the compiled hot path as constants.
"""

from __future__ import annotations

from typing import Final

# --------------------------------------------------------------------------- frames
FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE

# --------------------------------------------------------------------------- classes
CLASS_CONNECTION: Final = 10
CLASS_CHANNEL: Final = 20
CLASS_ACCESS: Final = 30
CLASS_EXCHANGE: Final = 40
CLASS_QUEUE: Final = 50
CLASS_BASIC: Final = 60
CLASS_CONFIRM: Final = 85
CLASS_TX: Final = 90

# --------------------------------------------------------------------------- methods
CONNECTION_OPEN: Final = (10 << 16) | 40
CONNECTION_OPEN_OK: Final = (10 << 16) | 41
CONNECTION_CLOSE: Final = (10 << 16) | 50
CONNECTION_CLOSE_OK: Final = (10 << 16) | 51
CONNECTION_BLOCKED: Final = (10 << 16) | 60
CONNECTION_UNBLOCKED: Final = (10 << 16) | 61

CHANNEL_OPEN: Final = (20 << 16) | 10
CHANNEL_OPEN_OK: Final = (20 << 16) | 11
CHANNEL_CLOSE: Final = (20 << 16) | 40
CHANNEL_CLOSE_OK: Final = (20 << 16) | 41

ACCESS_REQUEST: Final = (30 << 16) | 10
ACCESS_REQUEST_OK: Final = (30 << 16) | 11

EXCHANGE_DECLARE_OK: Final = (40 << 16) | 11
EXCHANGE_DELETE_OK: Final = (40 << 16) | 21
EXCHANGE_BIND_OK: Final = (40 << 16) | 31
EXCHANGE_UNBIND_OK: Final = (40 << 16) | 51

QUEUE_DECLARE_OK: Final = (50 << 16) | 11
QUEUE_BIND_OK: Final = (50 << 16) | 21
QUEUE_PURGE_OK: Final = (50 << 16) | 31
QUEUE_DELETE_OK: Final = (50 << 16) | 41
QUEUE_UNBIND_OK: Final = (50 << 16) | 51

BASIC_CONSUME: Final = (60 << 16) | 20
BASIC_CONSUME_OK: Final = (60 << 16) | 21
BASIC_CANCEL: Final = (60 << 16) | 30
BASIC_CANCEL_OK: Final = (60 << 16) | 31
BASIC_PUBLISH: Final = (60 << 16) | 40
BASIC_RETURN: Final = (60 << 16) | 50
BASIC_DELIVER: Final = (60 << 16) | 60
BASIC_GET_OK: Final = (60 << 16) | 71
BASIC_GET_EMPTY: Final = (60 << 16) | 72
BASIC_ACK: Final = (60 << 16) | 80
BASIC_NACK: Final = (60 << 16) | 120


def class_of(index: int) -> int:
    """The class id of a method index."""
    return index >> 16


def method_of(index: int) -> int:
    """The method id (within its class) of a method index."""
    return index & 0xFFFF


# --------------------------------------------------------------------------- properties
FLAG_CONTENT_TYPE: Final = 1 << 15
FLAG_CONTENT_ENCODING: Final = 1 << 14
FLAG_HEADERS: Final = 1 << 13
FLAG_DELIVERY_MODE: Final = 1 << 12
FLAG_PRIORITY: Final = 1 << 11
FLAG_CORRELATION_ID: Final = 1 << 10
FLAG_REPLY_TO: Final = 1 << 9
FLAG_EXPIRATION: Final = 1 << 8
FLAG_MESSAGE_ID: Final = 1 << 7
FLAG_TIMESTAMP: Final = 1 << 6
FLAG_TYPE: Final = 1 << 5
FLAG_USER_ID: Final = 1 << 4
FLAG_APP_ID: Final = 1 << 3
FLAG_CLUSTER_ID: Final = 1 << 2
FLAG_CONTINUATION: Final = 1  # another flags word follows (never used by 0-9-1 basic)

# the same bits, as they sit in one byte of the raw property bytes
FLAG_HEADERS_HI: Final = FLAG_HEADERS >> 8
FLAG_DELIVERY_MODE_HI: Final = FLAG_DELIVERY_MODE >> 8
FLAG_PRIORITY_HI: Final = FLAG_PRIORITY >> 8
FLAG_REPLY_TO_HI: Final = FLAG_REPLY_TO >> 8
FLAG_EXPIRATION_HI: Final = FLAG_EXPIRATION >> 8
FLAG_USER_ID_LO: Final = FLAG_USER_ID

# delivery-mode values
DELIVERY_TRANSIENT: Final = 1
DELIVERY_PERSISTENT: Final = 2
