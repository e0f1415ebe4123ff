"""The cluster's import contract names the broker's modules one by one (pyproject.toml).

The contract forbids every module of ``amqpd/broker`` but the public API,
``amqpd.broker.api``, with indirect imports allowed, so it needs no ignored import; it
only holds what it claims while the list is complete. A module added to the broker
package and not to the list would be open to the cluster without anyone noticing: this
test notices.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"amqpd.broker.api"}


def _cluster_contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    found = [c for c in contracts if c.get("source_modules") == ["amqpd.cluster"]]
    assert len(found) == 1, "one contract has amqpd.cluster as its source"
    return dict(found[0])


def _broker_modules() -> set[str]:
    """Every module and subpackage directly inside amqpd/broker (not its __init__)."""
    broker = ROOT / "amqpd" / "broker"
    out = {f"amqpd.broker.{p.stem}" for p in broker.glob("*.py") if p.stem != "__init__"}
    out |= {f"amqpd.broker.{p.name}" for p in broker.iterdir()
            if p.is_dir() and (p / "__init__.py").exists()}
    return out


def test_cluster_contract_forbids_every_broker_module_but_the_api() -> None:
    contract = _cluster_contract()
    forbidden = {m for m in contract["forbidden_modules"] if m.startswith("amqpd.broker")}
    internal = _broker_modules() - PUBLIC
    assert internal - forbidden == set(), (
        "broker modules the cluster contract does not forbid (add them to its "
        "forbidden_modules in pyproject.toml)")
    assert forbidden - internal == set(), "the contract names modules that do not exist"
    assert "amqpd.broker" not in forbidden  # that would forbid the API too


def test_cluster_contract_ignores_nothing() -> None:
    contract = _cluster_contract()
    assert contract["type"] == "forbidden"
    assert not contract.get("ignore_imports")
    # only the cluster's own imports count: the API it may import reaches the internals
    assert contract["allow_indirect_imports"] is True
