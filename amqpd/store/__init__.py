"""Persistence: one node-wide shared log; every durable queue is an index over it.

Module map (each file has one job; read them in this order):

    api.py          the contract the broker codes against (MessageStore Protocol)
    format.py       byte layout of records and segment headers; pure encode/decode
    segment.py      one <base:020d>.log file: append / read / truncate / fsync
    index.py        what is live: per-queue arrays, per-segment refcounts, relocations
    writer.py       the writer thread: group commit (one fsync per batch of commits)
    checkpoint.py   snapshot of the index, so restart replays only a bounded tail
    recovery.py     checkpoint + CRC-checked replay; torn tails truncated
    log.py          SharedLog: ties the above together (the file MessageStore)
    defs.py         DefinitionState: durable topology as applied from DEFINITION records
    memory.py       MemoryStore: same contract, nothing on disk
    definitions.py  DefinitionsStore: the definitions.json of old data dirs (migration)
"""
