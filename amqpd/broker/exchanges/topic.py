"""topic: dot-separated words, ``*`` matches one word, ``#`` zero or more.

Bindings are compiled into a trie of words; a lookup walks it once per routing key and
the result is cached per routing key until the bindings change (publishers tend to reuse
a handful of keys, so the cache hit rate is high).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from amqpd.broker.exchange import Binding, Destination, Exchange, register_exchange_type
from amqpd.broker.message import Message

_CACHE_MAX = 4096


def _words(key: str) -> list[str]:
    """An empty key has no words at all (RabbitMQ), so '*' cannot match it."""
    return key.split(".") if key else []


class _Node:
    __slots__ = ("children", "dests")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.dests: dict[tuple[str, str, str, str], Destination] = {}


def _collect(node: _Node, words: list[str], i: int, out: dict[int, Destination]) -> None:
    """Depth-first match of words[i:] against the trie below node."""
    if i == len(words):
        for dest in node.dests.values():
            out[id(dest)] = dest
        hash_node = node.children.get("#")
        if hash_node is not None:
            _collect(hash_node, words, i, out)
        return
    word = words[i]
    child = node.children.get(word)
    if child is not None:
        _collect(child, words, i + 1, out)
    star = node.children.get("*")
    if star is not None:
        _collect(star, words, i + 1, out)
    hash_node = node.children.get("#")
    if hash_node is not None:
        # '#' swallows zero or more words
        for j in range(i, len(words) + 1):
            _collect(hash_node, words, j, out)


class TopicExchange(Exchange):
    type_name = "topic"

    def __init__(
        self, vhost: str, name: str, durable: bool = False, auto_delete: bool = False,
        internal: bool = False, arguments: dict[str, Any] | None = None,
    ) -> None:
        self._root = _Node()
        self._cache: dict[str, list[Destination]] = {}
        super().__init__(vhost, name, durable, auto_delete, internal, arguments)

    def add_binding(self, binding: Binding) -> None:
        node = self._root
        for word in _words(binding.routing_key):
            node = node.children.setdefault(word, _Node())
        node.dests[binding.key] = binding.destination
        self._cache.clear()

    def remove_binding(self, binding: Binding) -> None:
        path = [self._root]
        words = _words(binding.routing_key)
        for word in words:
            nxt = path[-1].children.get(word)
            if nxt is None:
                return
            path.append(nxt)
        path[-1].dests.pop(binding.key, None)
        for depth in range(len(words), 0, -1):  # prune empty branches
            node = path[depth]
            if node.dests or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]
        self._cache.clear()

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        out: dict[int, Destination] = {}
        _collect(self._root, _words(routing_key), 0, out)
        result = list(out.values())
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[routing_key] = result
        return result


register_exchange_type(TopicExchange)
