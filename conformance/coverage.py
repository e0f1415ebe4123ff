"""Which cases exercise each method of AMQP 0-9-1 (as RabbitMQ implements it).

``METHODS`` maps every class.method to case-id prefixes; every prefix must match at least
one registered case (checked by ``python -m conformance.coverage`` and by the tests), so
a method can never silently lose its last case.
"""

from __future__ import annotations

import sys

from conformance.framework import Case
from conformance.runner import select

METHODS: dict[str, tuple[str, ...]] = {
    # connection
    "connection.start": ("connection.start/",),
    "connection.start-ok": ("connection.start-ok/",),
    "connection.secure": ("connection.secure/",),
    "connection.secure-ok": ("connection.secure-ok/",),
    "connection.tune": ("connection.tune/",),
    "connection.tune-ok": ("connection.tune-ok/",),
    "connection.open": ("connection.open/",),
    "connection.open-ok": ("connection.start-ok/plain-login-opens",),
    "connection.close": ("connection.close/", "frame/"),
    "connection.close-ok": ("connection.close-ok/", "connection.close/client-close"),
    "connection.blocked": ("connection.blocked/",),
    "connection.unblocked": ("connection.unblocked/",),
    "connection.update-secret": ("connection.update-secret/",),
    "connection.update-secret-ok": ("connection.update-secret/",),
    # channel
    "channel.open": ("channel.open/",),
    "channel.open-ok": ("channel.open/open-ok",),
    "channel.flow": ("channel.flow/",),
    "channel.flow-ok": ("channel.flow-ok/", "channel.flow/active-true"),
    "channel.close": ("channel.close/",),
    "channel.close-ok": ("channel.close-ok/", "channel.close/client-close"),
    # exchange
    "exchange.declare": ("exchange.declare/",),
    "exchange.declare-ok": ("exchange.declare/type-",),
    "exchange.delete": ("exchange.delete/",),
    "exchange.delete-ok": ("exchange.delete/delete-ok",),
    "exchange.bind": ("exchange.bind/",),
    "exchange.bind-ok": ("exchange.bind/bind-ok",),
    "exchange.unbind": ("exchange.unbind/",),
    "exchange.unbind-ok": ("exchange.unbind/unbind-ok",),
    # queue
    "queue.declare": ("queue.declare/",),
    "queue.declare-ok": ("queue.declare/declare-ok",),
    "queue.bind": ("queue.bind/",),
    "queue.bind-ok": ("queue.bind/double-bind",),
    "queue.unbind": ("queue.unbind/",),
    "queue.unbind-ok": ("queue.unbind/unbind-ok",),
    "queue.purge": ("queue.purge/",),
    "queue.purge-ok": ("queue.purge/purge-ok",),
    "queue.delete": ("queue.delete/",),
    "queue.delete-ok": ("queue.delete/delete-ok",),
    # basic
    "basic.qos": ("basic.qos/",),
    "basic.qos-ok": ("basic.qos/qos-ok",),
    "basic.consume": ("basic.consume/",),
    "basic.consume-ok": ("basic.consume/server-generated-consumer-tag",),
    "basic.cancel": ("basic.cancel/", "queue.delete/cancels-consumers"),
    "basic.cancel-ok": ("basic.cancel/cancel-ok", "basic.cancel/unknown-consumer-tag"),
    "basic.publish": ("basic.publish/",),
    "basic.return": ("basic.return/", "basic.publish/mandatory-unroutable"),
    "basic.deliver": ("basic.deliver/", "basic.consume/deliver-fields"),
    "basic.get": ("basic.get/",),
    "basic.get-ok": ("basic.get/get-ok",),
    "basic.get-empty": ("basic.get/empty-queue-get-empty",),
    "basic.ack": ("basic.ack/",),
    "basic.reject": ("basic.reject/",),
    "basic.recover-async": ("basic.recover-async/",),
    "basic.recover": ("basic.recover/",),
    "basic.recover-ok": ("basic.recover/requeue-true",),
    "basic.nack": ("basic.nack/",),
    # tx
    "tx.select": ("tx.select/",),
    "tx.select-ok": ("tx.select/select-ok",),
    "tx.commit": ("tx.commit/",),
    "tx.commit-ok": ("tx.commit/publish-invisible-until-commit",),
    "tx.rollback": ("tx.rollback/",),
    "tx.rollback-ok": ("tx.rollback/discards-publishes",),
    # confirm
    "confirm.select": ("confirm.select/",),
    "confirm.select-ok": ("confirm.select/select-ok",),
}


def cases_for(method: str, cases: list[Case]) -> list[Case]:
    prefixes = METHODS[method]
    return [c for c in cases if c.id.startswith(prefixes)]


def missing(cases: list[Case] | None = None) -> list[str]:
    """Methods none of whose prefixes matches a registered case."""
    cases = select(None) if cases is None else cases
    return [m for m, prefixes in METHODS.items()
            if not all(any(c.id.startswith(p) for c in cases) for p in prefixes)]


def main() -> int:
    cases = select(None)
    for method in METHODS:
        print(f"{method:<30} {len(cases_for(method, cases)):>4} cases")
    gaps = missing(cases)
    if gaps:
        print("methods without a case: " + ", ".join(gaps), file=sys.stderr)
        return 1
    print(f"all {len(METHODS)} methods have at least one case")
    return 0


if __name__ == "__main__":
    sys.exit(main())
