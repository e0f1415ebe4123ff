"""The HTTP API's modules load at its first connection, not at start (amqpd/http/listener.py).

A broker process runs in a subprocess with a helper thread beside it: once the ready
file is there, the thread notes whether aiohttp (and the API's modules) are loaded, opens
connections to the HTTP port while nothing is loaded (one that waits and sends its request
only after another connection started the load, one closed unanswered, two requests at
once), reads the answers, notes again, then stops the broker with SIGTERM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from devtools.rabbitmq import free_ports

SCRIPT = textwrap.dedent("""
    import base64, json, os, signal, socket, sys, threading, time

    ready = sys.argv[sys.argv.index("--ready-file") + 1]
    out = {}

    def loaded():
        return sorted(m for m in ("aiohttp", "amqpd.http.app", "amqpd.http.core", "yarl")
                      if m in sys.modules)

    def request(sock, path):
        auth = base64.b64encode(b"guest:guest").decode()
        sock.sendall(f"GET {path} HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Basic {auth}"
                     f"\\r\\nConnection: close\\r\\n\\r\\n".encode())

    def answer(sock):
        sock.settimeout(60)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data.decode(errors="replace")
            data += chunk

    def watch():
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(ready) and time.monotonic() < deadline:
                time.sleep(0.05)
            port = json.load(open(ready))["http_port"]
            out["at_start"] = loaded()
            addr = ("127.0.0.1", port)
            idle = socket.create_connection(addr)   # connects, sends later
            gone = socket.create_connection(addr)   # connects, leaves unanswered
            gone.close()
            first, second = socket.create_connection(addr), socket.create_connection(addr)
            request(first, "/api/overview")
            request(second, "/api/queues?msg_rates_age=60&msg_rates_incr=5")
            answers = [answer(first), answer(second)]
            request(idle, "/api/vhosts")
            answers.append(answer(idle))
            after = socket.create_connection(addr)
            request(after, "/api/health/checks/alarms")
            answers.append(answer(after))
            out["answers"] = [a.split("\\r\\n", 1)[0] + " " + a.rsplit("\\r\\n\\r\\n", 1)[-1][:80]
                              for a in answers]
            out["after"] = loaded()
        except Exception as exc:
            out["error"] = repr(exc)
        finally:
            print(json.dumps(out), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    from amqpd.cli import main
    raise SystemExit(main(sys.argv[1:]))
""")


def test_the_api_loads_at_its_first_connection(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, "--bind", "127.0.0.1", "--port", str(port),
         "--http-port", "0", "--data-dir", str(tmp_path / "data"),
         "--ready-file", str(tmp_path / "ready.json")],
        capture_output=True, text=True, timeout=180)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "error" not in result, (result, out.stderr[-3000:])
    assert result["at_start"] == [], result
    assert result["after"] == ["aiohttp", "amqpd.http.app", "amqpd.http.core", "yarl"]
    overview, queues, vhosts, alarms = result["answers"]
    assert overview.startswith("HTTP/1.1 200") and "management_version" in overview
    assert queues.startswith("HTTP/1.1 200") and "[]" in queues
    assert vhosts.startswith("HTTP/1.1 200") and '"name": "/"' in vhosts
    assert alarms.startswith("HTTP/1.1 200") and '"status": "ok"' in alarms
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loading the application failed" not in out.stderr
