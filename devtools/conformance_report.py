"""Regenerate conformance/RESULTS.md (and the appendix of conformance/NOTES.md) from fresh
runs of the conformance suite against a private RabbitMQ and a private amqpd:

    python -m devtools.conformance_report [--jobs 4] [--keep DIR]

RabbitMQ runs with the management and consistent-hash plugins, the memory-alarm hooks
(rabbitmqctl set_vm_memory_high_watermark) and a restart hook (stop_app/start_app); amqpd
runs from this checkout with its HTTP API, the same alarm hooks through amqpctl
(``python -m amqpd.ctl set_vm_memory_high_watermark``) and a restart hook
(devtools.amqpdproc restart).
The JSON reports are kept in DIR (default: a temporary directory, removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from conformance.framework import Settings
from conformance.results import render, render_observed
from conformance.runner import run_all, select
from devtools import amqpdproc
from devtools.rabbitmq import running_rabbitmq

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ("rabbitmq_management", "rabbitmq_consistent_hash_exchange")
APPENDIX = "## Appendix:"


def _module_cmd(module: str, *args: str) -> str:
    return (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m {module} "
            + " ".join(shlex.quote(a) for a in args))


def _run(name: str, settings: Settings, jobs: int, out: Path) -> Path:
    t0 = time.monotonic()
    results = run_all(select(None), settings, jobs=jobs)
    elapsed = round(time.monotonic() - t0, 1)
    path = out / f"{name}.json"
    failed = sum(r.result == "fail" for r in results)
    path.write_text(json.dumps({"url": settings.url.replace(":guest@", ":***@"),
                                "elapsed": elapsed,
                                "results": [asdict(r) for r in results]}, indent=1))
    print(f"{name}: {len(results)} cases, {failed} failed", file=sys.stderr)
    return path


def run_rabbitmq(out: Path, jobs: int) -> Path:
    with running_rabbitmq(out / "rabbitmq", plugins=PLUGINS) as info:
        def ctl(*args: str) -> str:
            return _module_cmd("devtools.rabbitmq", "ctl", "--dir", info.dir, "--", *args)

        settings = Settings(
            url=info.amqp_url, http_url=info.http_url,
            alarm_cmd=ctl("set_vm_memory_high_watermark", "0.000001"),
            clear_alarm_cmd=ctl("set_vm_memory_high_watermark", "0.4"),
            restart_cmd=ctl("stop_app") + " && " + ctl("start_app"))
        return _run("rabbitmq-3.10.8", settings, jobs, out)


def run_amqpd(out: Path, jobs: int) -> Path:
    d = out / "amqpd"
    state = amqpdproc.start(d)
    try:
        http_url = str(state["http_url"])

        def watermark(value: str) -> str:
            return _module_cmd("amqpd.ctl", "--url", http_url, "set_vm_memory_high_watermark",
                               value)

        settings = Settings(url=str(state["amqp_url"]), http_url=http_url,
                            alarm_cmd=watermark("0.000001"), clear_alarm_cmd=watermark("0.4"),
                            restart_cmd=_module_cmd("devtools.amqpdproc", "restart",
                                                    "--dir", str(d)))
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=False).stdout.strip()
        return _run(f"amqpd-{sha or 'unknown'}", settings, jobs, out)
    finally:
        amqpdproc.stop(d)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.conformance_report",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--keep", help="keep the reports (and broker directories) here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        out = Path(args.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        rabbit = run_rabbitmq(out, args.jobs)
        amqpd = run_amqpd(out, args.jobs)
        reports = {p.stem: json.loads(p.read_text()) for p in (rabbit, amqpd)}
        (ROOT / "conformance" / "RESULTS.md").write_text(render(reports))
        notes = ROOT / "conformance" / "NOTES.md"
        head = notes.read_text().split(APPENDIX)[0] if notes.exists() else ""
        title = f"{APPENDIX} every close, return and dropped socket the suite observed " \
                "on RabbitMQ 3.10.8\n\n"
        notes.write_text(head + title + render_observed(reports[rabbit.stem]))
    print("wrote conformance/RESULTS.md and the appendix of conformance/NOTES.md",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
