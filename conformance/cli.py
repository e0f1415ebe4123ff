"""Command line: ``amqpd-conformance --url amqp://guest:guest@127.0.0.1:5672/%2F``.

Prints one row per case (id, area, result; expected/got for failures) and a summary,
optionally writes a JSON report, and exits 0 only when no case failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict

from conformance.framework import Settings
from conformance.runner import Result, run_all, select


def _row(r: Result, width: int) -> str:
    line = f"{r.id:<{width}}  {r.area:<24} {r.result.upper():<5} {r.duration:6.2f}s"
    if r.result == "fail":
        line += f"\n    {r.detail}"
    elif r.result == "skip" and r.detail:
        line += f"  ({r.detail})"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="amqpd-conformance",
                                 description="Run the AMQP 0-9-1 conformance suite against a "
                                             "broker.")
    ap.add_argument("--url", default=os.environ.get("AMQP_URL",
                                                    "amqp://guest:guest@127.0.0.1:5672/%2F"))
    ap.add_argument("--http-url", default=os.environ.get("AMQP_HTTP_URL"),
                    help="management API base URL (e.g. http://127.0.0.1:15672)")
    ap.add_argument("--only", help="regular expression on case id or area")
    ap.add_argument("--exclude", help="regular expression on case id or area to leave out")
    ap.add_argument("--report", help="write JSON results here")
    ap.add_argument("--jobs", type=int, default=4, help="cases run in parallel (default 4)")
    ap.add_argument("--timeout", type=float, default=5.0, help="socket timeout per operation")
    ap.add_argument("--case-timeout", type=float, default=300.0,
                    help="seconds a case may run before its connections are cut and it "
                         "fails (a broker that never answers must not hang the run)")
    ap.add_argument("--alarm-cmd", default=os.environ.get("AMQP_ALARM_CMD"),
                    help="shell command raising a resource alarm on the broker (enables the "
                         "connection.blocked/unblocked cases, which then run alone)")
    ap.add_argument("--clear-alarm-cmd", default=os.environ.get("AMQP_CLEAR_ALARM_CMD"),
                    help="shell command clearing that alarm")
    ap.add_argument("--restart-cmd", default=os.environ.get("AMQP_RESTART_CMD"),
                    help="shell command restarting the broker with its data (enables the "
                         "durability cases: they prepare, share one restart, then verify)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    ap.add_argument("--live", action="store_true",
                    help="print each result as it completes instead of one sorted table")
    args = ap.parse_args(argv)

    cases = select(args.only)
    if args.exclude:
        rx = re.compile(args.exclude)
        cases = [c for c in cases if not (rx.search(c.id) or rx.search(c.area))]
    if args.list:
        for c in cases:
            print(f"{c.id:<70} {c.area}")
        print(f"{len(cases)} cases")
        return 0
    if not cases:
        print("no case matches", file=sys.stderr)
        return 2
    settings = Settings(url=args.url, http_url=args.http_url, timeout=args.timeout,
                        alarm_cmd=args.alarm_cmd, clear_alarm_cmd=args.clear_alarm_cmd,
                        restart_cmd=args.restart_cmd, case_timeout=args.case_timeout)
    width = max(len(c.id) for c in cases)
    t0 = time.monotonic()

    def live(r: Result) -> None:
        if args.live and (not args.quiet or r.result == "fail"):
            print(_row(r, width), flush=True)

    print(f"{len(cases)} cases against {_redact(args.url)} ({args.jobs} jobs)", flush=True)
    results = run_all(cases, settings, jobs=args.jobs, on_result=live)
    elapsed = time.monotonic() - t0
    counts = Counter(r.result for r in results)
    failed = [r for r in results if r.result == "fail"]
    if not args.live and not args.quiet:
        print(f"\n{'CASE':<{width}}  {'AREA':<24} {'RESULT':<5} {'TIME':>7}")
        for r in sorted(results, key=lambda r: (r.area, r.id)):
            print(_row(r, width))
    if failed:
        print("\nFailures:")
        for r in failed:
            print(_row(r, width))
    print("\nPer area (pass/fail/skip):")
    for area in sorted({r.area for r in results}):
        n = Counter(r.result for r in results if r.area == area)
        print(f"  {area:<28} {n['pass']:>4} / {n['fail']:>3} / {n['skip']:>3}")
    print(f"\n{len(results)} cases: {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['skip']} skipped in {elapsed:.1f}s")
    if args.report:
        with open(args.report, "w") as fh:
            json.dump({"url": _redact(args.url), "elapsed": round(elapsed, 2),
                       "results": [asdict(r) for r in results]}, fh, indent=1)
    return 1 if failed else 0


def _redact(url: str) -> str:
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    if u.password:
        netloc = f"{u.username}:***@{u.hostname}" + (f":{u.port}" if u.port else "")
        u = u._replace(netloc=netloc)
    return urllib.parse.urlunsplit(u)


if __name__ == "__main__":
    sys.exit(main())
