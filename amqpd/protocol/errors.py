"""AMQP reply codes as exceptions.

Strategy: code anywhere in the broker raises the exception that names the fault where it is
detected; the connection layer translates it exactly once into ``channel.close`` (a
:class:`ChannelError`, a "soft" error that ends only the channel) or ``connection.close``
(a :class:`ConnectionError_`, a "hard" error that ends the connection). The reply code is a
class attribute, as h2 does with its error codes, and the text follows RabbitMQ's
``"NOT_FOUND - no queue 'x' in vhost '/'"`` shape so people can act on it.
"""

from __future__ import annotations


class AMQPError(Exception):
    """A fault with an AMQP reply code. ``class_id``/``method_id`` name the offending method."""

    reply_code: int = 541
    name: str = "INTERNAL_ERROR"
    # False for the few faults RabbitMQ reports with class and method 0 even though a
    # method caused them (the connection layer then leaves the ids at 0)
    names_method: bool = True

    def __init__(self, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(text)
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        return f"{self.name} - {self.text}"[:255]


class ChannelError(AMQPError):
    """Soft error: the channel is closed, the connection and its other channels go on."""


class ConnectionError_(AMQPError):
    """Hard error: the whole connection is closed."""


# -- channel-level (soft) -------------------------------------------------------------
class ContentTooLarge(ChannelError):
    reply_code, name = 311, "CONTENT_TOO_LARGE"


class NoConsumers(ChannelError):
    reply_code, name = 313, "NO_CONSUMERS"


class AccessRefused(ChannelError):
    reply_code, name = 403, "ACCESS_REFUSED"


class NotFound(ChannelError):
    reply_code, name = 404, "NOT_FOUND"


class ResourceLocked(ChannelError):
    reply_code, name = 405, "RESOURCE_LOCKED"


class PreconditionFailed(ChannelError):
    reply_code, name = 406, "PRECONDITION_FAILED"


# -- connection-level (hard) ----------------------------------------------------------
class ConnectionForced(ConnectionError_):
    reply_code, name = 320, "CONNECTION_FORCED"


class InvalidPath(ConnectionError_):
    reply_code, name = 402, "INVALID_PATH"


class ConnectionAccessRefused(ConnectionError_):
    reply_code, name = 403, "ACCESS_REFUSED"


class FrameError(ConnectionError_):
    reply_code, name = 501, "FRAME_ERROR"


class SyntaxError_(ConnectionError_):
    reply_code, name = 502, "SYNTAX_ERROR"


class CommandInvalid(ConnectionError_):
    reply_code, name = 503, "COMMAND_INVALID"


class ChannelErrorCode(ConnectionError_):
    """504 CHANNEL_ERROR: a frame on a channel that is not open (a hard error)."""

    reply_code, name = 504, "CHANNEL_ERROR"


class UnexpectedFrame(ConnectionError_):
    reply_code, name = 505, "UNEXPECTED_FRAME"


class ResourceError(ConnectionError_):
    reply_code, name = 506, "RESOURCE_ERROR"


class NotAllowed(ConnectionError_):
    reply_code, name = 530, "NOT_ALLOWED"


class ChannelMaxReached(NotAllowed):
    """530 for a channel.open past the negotiated channel_max: RabbitMQ 3.10 sends this
    connection.close with class and method 0/0, not 20/10."""

    names_method = False


class NotImplemented_(ConnectionError_):
    reply_code, name = 540, "NOT_IMPLEMENTED"


class InternalError(ConnectionError_):
    reply_code, name = 541, "INTERNAL_ERROR"
