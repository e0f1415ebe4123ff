"""Runtime parameters: component/vhost/name -> JSON value, plus global parameters.

RabbitMQ keeps shovel, federation-upstream and similar settings as *runtime parameters*
(``rabbitmqctl set_parameter shovel / my-shovel '{...}'``). A component must be registered
before parameters of it are accepted; plugins register a validator (raise ``ValueError``
with a readable message to refuse a value) and optional change callbacks::

    api.parameters.register("shovel", validate_shovel, on_set=start, on_clear=stop)

Unknown components are refused, as RabbitMQ does ("component X not found"). Every change
calls the ``on_change`` callbacks; the broker hangs its definitions save there, so a
parameter set or cleared is saved without the caller asking. Operator
metadata for vhosts (description, tags, default queue type) and topic permissions live
here too, since nothing
else in the broker needs it.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Validator = Callable[[str, str, Any], None]  # (vhost, name, value); raise ValueError
Callback = Callable[[str, str, Any], None]


class UnknownComponent(LookupError):
    pass


@dataclass
class Component:
    name: str
    validate: Validator | None = None
    on_set: Callback | None = None
    on_clear: Callback | None = None


class ParameterStore:
    def __init__(self) -> None:
        self.components: dict[str, Component] = {}
        self.values: dict[tuple[str, str, str], Any] = {}  # (component, vhost, name)
        self.global_values: dict[str, Any] = {}
        self.vhost_meta: dict[str, dict[str, Any]] = {}
        # topic permissions (enforced by broker/topic_auth.py) and user limits
        # (broker/resource_limits.py): user -> {"max-connections": n, ...}
        self.topic_permissions: list[dict[str, Any]] = []
        self.user_limits: dict[str, dict[str, int]] = {}
        self.on_change: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ registry
    def register(self, component: str, validate: Validator | None = None,
                 on_set: Callback | None = None, on_clear: Callback | None = None) -> None:
        self.components[component] = Component(component, validate, on_set, on_clear)

    # ------------------------------------------------------------------ values
    def set(self, component: str, vhost: str, name: str, value: Any) -> bool:
        """Store a value; True if it was new. Raises UnknownComponent or ValueError."""
        comp = self.components.get(component)
        if comp is None:
            raise UnknownComponent(f"component {component} not found")
        if comp.validate is not None:
            comp.validate(vhost, name, value)
        key = (component, vhost, name)
        new = key not in self.values
        self.values[key] = value
        if comp.on_set is not None:
            comp.on_set(vhost, name, value)
        self._changed()
        return new

    def get(self, component: str, vhost: str, name: str) -> Any:
        return self.values.get((component, vhost, name))

    def clear(self, component: str, vhost: str, name: str) -> bool:
        value = self.values.pop((component, vhost, name), None)
        if value is None:
            return False
        comp = self.components.get(component)
        if comp is not None and comp.on_clear is not None:
            comp.on_clear(vhost, name, value)
        self._changed()
        return True

    def clear_vhost(self, vhost: str) -> None:
        for comp, vh, name in [k for k in self.values if k[1] == vhost]:
            self.clear(comp, vh, name)
        self.vhost_meta.pop(vhost, None)

    def list(self, component: str | None = None,
             vhost: str | None = None) -> builtins.list[dict[str, Any]]:
        """RabbitMQ's JSON shape: ``{"component", "vhost", "name", "value"}``."""
        return [
            {"component": c, "vhost": v, "name": n, "value": value}
            for (c, v, n), value in sorted(self.values.items())
            if (component is None or c == component) and (vhost is None or v == vhost)
        ]

    # ------------------------------------------------------------------ global
    def set_global(self, name: str, value: Any) -> bool:
        new = name not in self.global_values
        self.global_values[name] = value
        self._changed()
        return new

    def clear_global(self, name: str) -> bool:
        found = self.global_values.pop(name, None) is not None
        if found:
            self._changed()
        return found

    def list_global(self) -> builtins.list[dict[str, Any]]:
        return [{"name": n, "value": v} for n, v in sorted(self.global_values.items())]

    def _changed(self) -> None:
        for cb in self.on_change:
            cb()
