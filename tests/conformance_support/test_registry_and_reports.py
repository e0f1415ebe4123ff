"""The case registry, the method coverage, the CLI and the report renderers, without a broker."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.coverage import missing
from conformance.framework import REGISTRY, case
from conformance.results import render, render_observed
from conformance.runner import select


def test_at_least_250_uniquely_named_cases_in_known_areas() -> None:
    cases = select(None)
    assert len(cases) >= 250
    assert len({c.id for c in cases}) == len(cases)
    for c in cases:
        assert re.fullmatch(r"[A-Za-z0-9_.\-/]+", c.id), c.id
        assert c.area, c.id


def test_every_method_of_every_class_has_a_case() -> None:
    assert missing() == []


def test_duplicate_case_id_is_refused() -> None:
    select(None)
    some_id = next(iter(REGISTRY))
    with pytest.raises(ValueError, match="duplicate"):
        case(some_id, "x")(lambda ctx: None)


def test_cli_list_and_no_match() -> None:
    assert main(["--list", "--only", "^tx\\."]) == 0
    assert main(["--only", "no-case-is-called-this"]) == 2


def test_cli_fails_against_a_port_where_nothing_listens(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    rc = main(["--url", "amqp://guest:guest@127.0.0.1:1/%2F", "--only",
               "^exchange.direct/exact-key-routes$", "--report", str(report), "--quiet"])
    assert rc == 1
    data = json.loads(report.read_text())
    assert data["url"] == "amqp://guest:***@127.0.0.1:1/%2F"
    (r,) = data["results"]
    assert r["result"] == "fail" and "expected a working connection" in r["detail"]


def _report(results: list[dict[str, object]]) -> dict[str, object]:
    return {"url": "amqp://x", "elapsed": 1.0, "results": results}


def test_results_markdown_counts_per_area_and_lists_differences() -> None:
    a = _report([
        {"id": "tx.select/ok", "area": "tx", "result": "pass", "detail": "", "duration": 0.1},
        {"id": "x-delayed-message/d", "area": "ext", "result": "skip", "detail": "503",
         "duration": 0.1},
    ])
    b = _report([
        {"id": "tx.select/ok", "area": "tx", "result": "fail", "detail": "expected 1, got 2",
         "duration": 0.1},
        {"id": "x-delayed-message/d", "area": "ext", "result": "pass", "detail": "",
         "duration": 0.1},
    ])
    md = render({"rabbit": a, "amqpd": b})
    assert "| tx | 1 | 1/0/0 | 0/1/0 |" in md
    assert "`tx.select/ok` | tx | pass | fail: expected 1, got 2 |" in md
    assert "## Methods" in md


def test_observed_table_hides_generated_names() -> None:
    rep = _report([{"id": "queue.declare/p", "area": "queue", "result": "pass", "detail": "",
                    "duration": 0.0,
                    "observed": ["Channel.Close 404 \"NOT_FOUND - no queue "
                                 "'conf-q-declare-p-0123abcd' in vhost '/'\""]}])
    out = render_observed(rep)
    assert "no queue '<queue>'" in out and "0123abcd" not in out
