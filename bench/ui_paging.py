"""How long one page of the web UI's queue list takes with 10,000 queues.

    python -m bench.ui_paging [--queues 10000] [--runs 20] [--no-browser]

Starts an amqpd (devtools.amqpdproc, free loopback ports), declares N queues through one
definitions import and puts a few messages in one of them, then times the list requests
the web UI makes (``GET /api/queues?page=..&page_size=100&sort=..&columns=..``): the first
and a middle page by name, sorted by message count, filtered by a substring and by a
regular expression, and, for comparison, a sort on a key the server must build every
queue's view for, and the whole unpaged list. Each is run ``--runs`` times after two
warm-ups; medians and 90th percentiles are written to bench/RESULTS-ui-paging.md and
.json. Where headless Chromium is installed it also times, in the browser, a click on
"next" until the new page is drawn. Nothing here is asserted: the figures are the result.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from devtools import amqpdproc

HERE = Path(__file__).resolve().parent
COLUMNS = ("name,vhost,durable,auto_delete,exclusive,arguments,policy,state,consumers,messages,"
           "messages_ready,messages_unacknowledged,message_stats.publish_details.rate,"
           "message_stats.deliver_get_details.rate,message_stats.ack_details.rate")
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Authorization": AUTH,
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.status, resp.read()


def scenarios(n: int) -> list[tuple[str, str]]:
    middle = max(n // 200, 1)
    page = f"page_size=100&columns={COLUMNS}"
    return [
        ("page 1, by name", f"/api/queues?page=1&{page}&sort=name&sort_reverse=false"),
        (f"page {middle}, by name", f"/api/queues?page={middle}&{page}&sort=name"),
        ("page 1, by messages, descending",
         f"/api/queues?page=1&{page}&sort=messages&sort_reverse=true"),
        ("page 1, name contains '-0999'", f"/api/queues?page=1&{page}&sort=name&name=-0999"),
        ("page 1, regex ^bench-0000[1-3]$",
         f"/api/queues?page=1&{page}&sort=name&name=%5Ebench-0000%5B1-3%5D%24&use_regex=true"),
        ("page 1, by publish rate (every view built)",
         f"/api/queues?page=1&{page}&sort=message_stats.publish_details.rate"),
        ("whole list, unpaged (what paging avoids)", f"/api/queues?columns={COLUMNS}"),
    ]


def time_requests(base: str, n: int, runs: int) -> list[dict[str, Any]]:
    out = []
    for label, path in scenarios(n):
        for _ in range(2):
            call(base, "GET", path)
        times, size = [], 0
        for _ in range(runs):
            t0 = time.perf_counter()
            _, body = call(base, "GET", path)
            times.append((time.perf_counter() - t0) * 1000)
            size = len(body)
        times.sort()
        out.append({"scenario": label, "path": path.split("&columns=")[0],
                    "median_ms": round(statistics.median(times), 2),
                    "p90_ms": round(times[int(0.9 * (len(times) - 1))], 2),
                    "bytes": size})
        print(f"  {label:48s} median {out[-1]['median_ms']:8.2f} ms  p90 "
              f"{out[-1]['p90_ms']:8.2f} ms  {size} bytes", flush=True)
    return out


def time_browser(http_url: str, runs: int) -> dict[str, Any] | None:
    """Click "next" in the page and wait for the new first row; None without Chromium."""
    chromium, driver_path = "/usr/bin/chromium", "/usr/bin/chromedriver"
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not (os.path.exists(chromium) and os.path.exists(driver_path)):
        return None
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        driver.get(http_url + "/#/queues")
        deadline = time.monotonic() + 30
        while not driver.find_elements("css selector", "#login-form"):
            if time.monotonic() > deadline:
                raise RuntimeError("no login form")
            time.sleep(0.05)
        driver.find_element("css selector", "#login-form [name=username]").send_keys("guest")
        driver.find_element("css selector", "#login-form [name=password]").send_keys("guest")
        driver.find_element("css selector", "#login-form button").click()
        script = """
            const done = arguments[arguments.length - 1];
            const first = () => (document.querySelector('#queues-table td.name') || {}).textContent;
            const wait = (pred, t0) => pred() ? done(performance.now() - t0)
                : (performance.now() - t0 > 20000 ? done(-1) : setTimeout(() => wait(pred, t0), 2));
            const before = first();
            if (!before) return wait(() => first(), performance.now());
            const next = [...document.querySelectorAll('#pager button')]
                .find(b => b.textContent.includes('next'));
            const t0 = performance.now();
            next.click();
            wait(() => first() && first() !== before, t0);
        """
        driver.set_script_timeout(30)
        driver.execute_async_script(script)  # wait for the first page
        times = []
        for _ in range(runs):
            ms = driver.execute_async_script(script)
            if ms < 0:
                raise RuntimeError("the next page never appeared")
            times.append(ms)
        times.sort()
        return {"scenario": "browser: click 'next' until the page is drawn",
                "median_ms": round(statistics.median(times), 2),
                "p90_ms": round(times[int(0.9 * (len(times) - 1))], 2)}
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ui_paging", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--out", default=str(HERE / "RESULTS-ui-paging"))
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="amqpd-ui-bench-") as tmp:
        state = amqpdproc.start(tmp)
        base = str(state["http_url"])
        try:
            deadline = time.monotonic() + 30
            while True:  # the HTTP API may come up a moment after AMQP
                try:
                    call(base, "GET", "/api/overview")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            t0 = time.perf_counter()
            queues = [{"name": f"bench-{i:05d}", "vhost": "/", "durable": False,
                       "auto_delete": False, "arguments": {}} for i in range(args.queues)]
            call(base, "POST", "/api/definitions", {"queues": queues})
            declare_s = time.perf_counter() - t0
            for n in range(5):
                call(base, "POST", "/api/exchanges/%2F/amq.default/publish",
                     {"routing_key": "bench-04321", "payload": str(n), "properties": {}})
            print(f"{args.queues} queues declared in {declare_s:.2f} s; timing list requests",
                  flush=True)
            results = time_requests(base, args.queues, args.runs)
            browser = None if args.no_browser else time_browser(base, args.runs)
            if browser:
                print(f"  {browser['scenario']:48s} median {browser['median_ms']:8.2f} ms  "
                      f"p90 {browser['p90_ms']:8.2f} ms", flush=True)
        finally:
            amqpdproc.stop(tmp)
    import amqpd.hotpath as hotpath

    report = {"queues": args.queues, "runs": args.runs, "page_size": 100,
              "hot_path": hotpath.MODE, "python": platform.python_version(),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": "python -m bench.ui_paging " + " ".join(sys.argv[1:]),
              # the machine is shared: its 1-minute load average before and after the run
              "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              "requests": results, "browser": browser}
    Path(args.out + ".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# The web UI's queue list with 10,000 queues",
        "",
        f"`{report['command'].strip()}` on {report['when']}: {report['machine']}, Python "
        f"{report['python']}, hot path: {report['hot_path']}. {args.queues} queues, pages "
        f"of 100 with the UI's columns; each request run {args.runs} times after two warm-ups "
        "(HTTP client on the same machine, loopback). The machine's 1-minute load average "
        f"was {report['load_average'][0]} before and {report['load_average'][1]} after "
        f"on {os.cpu_count()} cores: other work shared it, so compare rows with each other "
        "more than with other runs.",
        "",
        "| request | median | p90 | bytes |",
        "|---|---:|---:|---:|",
        *[f"| {r['scenario']} | {r['median_ms']} ms | {r['p90_ms']} ms | {r['bytes']} |"
          for r in results],
    ]
    if browser:
        lines += ["", f"In headless Chromium, {browser['scenario']}: median "
                  f"{browser['median_ms']} ms, p90 {browser['p90_ms']} ms."]
    else:
        lines += ["", "(No browser timing: headless Chromium or selenium is not installed, "
                  "or --no-browser.)"]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
