"""An etcd stand-in holding one group record, for the group set-up tests
(:meth:`QuorumGroups._establish`, :meth:`StreamGroups._establish`): a range answers the
record, a txn whose mod-revision guard holds applies its Put (and counts it)."""

from __future__ import annotations

import json
from typing import Any

from amqpd.coord.etcd import Compare, KeyValue, Put, TxnResult


class RecordEtcd:
    def __init__(self, key: str, rec: dict[str, Any], revision: int) -> None:
        self.key, self.value, self.revision = key, json.dumps(rec).encode(), revision
        self.writes = 0

    async def range_prefix(self, prefix: str) -> tuple[int, list[KeyValue]]:
        return self.revision, [KeyValue(self.key.encode(), self.value, 1, self.revision,
                                        1, 0)]

    async def txn(self, compare: list[Compare], success: list[Put]) -> TxnResult:
        (guard,) = compare
        if guard.target != "mod" or guard.operand != self.revision:
            return TxnResult(False, self.revision, [])
        (put,) = success
        self.value = put.value if isinstance(put.value, bytes) else put.value.encode()
        self.revision += 1
        self.writes += 1
        return TxnResult(True, self.revision, [[]])
