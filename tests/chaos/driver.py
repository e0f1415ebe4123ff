"""The randomized fault test (issue 28, "Must show"): three amqpd nodes and a real etcd,
faults one at a time from a seeded schedule, then heal and check.

Clients (tests/chaos/clients.py): a reconnecting confirmed publisher and an acking
consumer on each of a quorum queue (``chaos-quorum``), an ``ha-mode: all`` queue
(``chaos-all``) and an ``ha-mode: exactly``, ``ha-params: 2`` queue (``chaos-two``);
every few seconds a new queue under the ``ha-mode: all`` policy (``chaos-all-new-N``)
is declared and published to at once (confirmed), and drained after the heal.

Faults, one at a time (the next starts once the last one healed and a gap passed):
``kill`` (kill -9 of a node, restarted a few seconds later), ``kill-leader`` (kill -9
of the node leading one of the three queues, by /api/queues), ``stop`` (SIGSTOP of a
node for 3-10 s), ``stop-etcd`` (SIGSTOP of etcd for 3-10 s), ``partition`` (a node
cut off for 4-10 s). A partition is made one of two ways (``partition=``):

* ``netns`` (the default where the machine allows it): every node runs in a network
  namespace of its own, joined to the host by a bridge (tests/support/netns.py); the cut
  takes the node's veth down, so every packet to or from it vanishes — etcd, the other
  nodes' heartbeats *and* the inter-node links, and the clients too. Established TCP
  connections stay open and silent, as across a real network's partition.
* ``proxy``: the node's etcd connection goes through a TCP proxy and its heartbeats
  through UDP relays (tests/support/), as tests/integration/test_cluster_partition.py
  does; the cut blackholes those two only — the inter-node links stay up.
The schedule (kinds, targets, durations, gaps) is drawn from the seed alone; which
node leads a queue when a ``kill-leader`` comes is the cluster's state.

While it runs, a sampler asks every reachable node for /api/queues twice a second;
two nodes that each list themselves as a queue's leader in the same round count as two
leaders. After the heal: every node must answer HTTP and an AMQP passive declare
within 5 s, every queue must accept and confirm a publish within 30 s, and once the
consumers drained: no confirmed message lost, and no send delivered twice unless the
later delivery says redelivered.

Run: ``python -m tests.chaos --seed 7 --duration 180 [--partition proxy]`` (``make chaos
SEEDS="1 2 3" DURATION=180 [PARTITION=proxy]``); tests/integration/test_chaos.py runs
short ones on fixed seeds, both ways.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pamqp import commands

from tests.chaos.clients import (
    IO_TIMEOUT,
    ClientError,
    Consumer,
    Ledger,
    Publisher,
    connect,
    publish_once,
)
from tests.integration._http import Api
from tests.integration.cluster_support import ClusterNode, free_udp_port, new_prefix
from tests.support import netns
from tests.support.etcdproc import EtcdProcess
from tests.support.tcpproxy import TcpProxy
from tests.support.udpproxy import UdpRelay

QUEUES = {"chaos-quorum": {"x-queue-type": "quorum"}, "chaos-all": {}, "chaos-two": {}}
POLICIES = {"chaos-all": {"pattern": "^chaos-all", "definition": {"ha-mode": "all"}},
            "chaos-two": {"pattern": "^chaos-two$",
                          "definition": {"ha-mode": "exactly", "ha-params": 2}}}
KINDS = ("kill", "kill-leader", "stop", "stop-etcd", "partition")
NEW_QUEUE_BATCH = 50
ANSWER_WITHIN = 5.0  # every node answers within this after the heal
CONFIRM_WITHIN = 30.0  # every queue confirms a publish within this after the heal


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the previous fault healed
    kind: str
    target: int  # node index (kill, stop, partition) or queue index (kill-leader)
    hold: float  # seconds a stop or partition lasts; seconds a killed node stays down

    def describe(self, names: list[str]) -> str:
        if self.kind == "kill-leader":
            return f"kill -9 of the leader of {list(QUEUES)[self.target % len(QUEUES)]}"
        if self.kind == "stop-etcd":
            return f"SIGSTOP of etcd for {self.hold:.1f}s"
        what = {"kill": "kill -9 of", "stop": "SIGSTOP of", "partition": "partition of"}
        return f"{what[self.kind]} {names[self.target % len(names)]} ({self.hold:.1f}s)"


def schedule(seed: int, duration: float, gap: tuple[float, float]) -> list[Fault]:
    """The faults of a run, from the seed alone."""
    rng = random.Random(seed)
    out: list[Fault] = []
    spent = 0.0
    while True:
        wait = rng.uniform(*gap)
        kind = rng.choice(KINDS)
        hold = rng.uniform(3.0, 10.0) if kind in ("stop", "stop-etcd") else \
            rng.uniform(4.0, 10.0) if kind == "partition" else rng.uniform(1.0, 4.0)
        fault = Fault(wait, kind, rng.randrange(3), hold)
        spent += wait + hold
        if spent > duration and out:
            return out
        out.append(fault)


@dataclass
class Result:
    seed: int
    duration: float
    rerun: str = ""  # the command line that replays the schedule
    faults: list[str] = field(default_factory=list)
    confirmed: dict[str, int] = field(default_factory=dict)
    lost: dict[str, list[int]] = field(default_factory=dict)
    bad_duplicates: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    two_leaders: list[str] = field(default_factory=list)
    silent_nodes: list[str] = field(default_factory=list)
    unconfirmed_queues: list[str] = field(default_factory=list)
    declare_failures: list[str] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def failures(self) -> list[str]:
        out = []
        for queue, numbers in self.lost.items():
            if numbers:
                out.append(f"{queue}: {len(numbers)} of {self.confirmed.get(queue, 0)} "
                           f"confirmed messages lost, e.g. {numbers[:10]}")
        for queue, keys in self.bad_duplicates.items():
            if keys:
                out.append(f"{queue}: {len(keys)} sends delivered twice without "
                           f"redelivered, e.g. {keys[:5]}")
        out += [f"two leaders: {x}" for x in self.two_leaders[:10]]
        out += [f"did not answer within {ANSWER_WITHIN:g}s after the heal: {x}"
                for x in self.silent_nodes]
        out += [f"no confirmed publish within {CONFIRM_WITHIN:g}s after the heal: {x}"
                for x in self.unconfirmed_queues]
        out += [f"client error: {x}" for x in self.client_errors]
        return out

    def report(self) -> str:
        lines = [f"chaos seed={self.seed} duration={self.duration:g}s "
                 f"(re-run: {self.rerun})",
                 f"faults ({len(self.faults)}): " + "; ".join(self.faults),
                 "confirmed: " + ", ".join(f"{q}={n}" for q, n in
                                           sorted(self.confirmed.items())),
                 f"two-leader rounds: {len(self.two_leaders)}; declare failures during "
                 f"faults: {len(self.declare_failures)}"]
        lines += [f"note: {n}" for n in self.notes]
        failures = self.failures()
        lines.append("RESULT: " + ("ok" if not failures else f"{len(failures)} failure(s)"))
        lines += [f"  - {f}" for f in failures]
        return "\n".join(lines)


class Chaos:
    """One run: the cluster, the clients, the faults, the checks."""

    def __init__(self, workdir: Path, seed: int, duration: float,
                 gap: tuple[float, float] = (8.0, 20.0),
                 new_queue_every: tuple[float, float] = (3.0, 6.0),
                 rate: float = 100.0, drain_timeout: float = 90.0,
                 partition: str = "netns") -> None:
        if partition not in ("netns", "proxy"):
            raise ValueError(f"partition must be 'netns' or 'proxy', not {partition!r}")
        self.workdir = workdir
        self.partition = partition
        self.lab: netns.Lab | None = None  # the namespaces (partition="netns")
        self.etcd_bridge: TcpProxy | None = None  # etcd as the namespaces reach it
        self.drain_timeout = drain_timeout  # seconds the consumers get after the heal
        self.seed = seed
        self.duration = duration
        self.gap = gap
        self.new_queue_every = new_queue_every
        self.rate = rate
        self.result = Result(seed, duration, rerun=(
            f"python -m tests.chaos --seed {seed} --duration {duration:g} "
            f"--gap {gap[0]:g} {gap[1]:g} --rate {rate:g} --partition {partition}"))
        self.rng = random.Random(seed ^ 0x5EED)  # the clients' choices
        self.etcd: EtcdProcess | None = None
        self.nodes: list[ClusterNode] = []
        self.down: set[str] = set()  # nodes a fault holds now (clients avoid them)
        self.ledgers = {q: Ledger(q) for q in QUEUES}
        self.new_ledgers: dict[str, Ledger] = {}
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.started = time.monotonic()  # reset when the clients start

    # ------------------------------------------------------------------ the cluster
    def urls(self) -> list[str]:
        with self.lock:
            up = [n.url for n in self.nodes if n.name not in self.down]
        return up or [n.url for n in self.nodes]

    @contextlib.contextmanager
    def cluster(self) -> Iterator[None]:
        self.etcd = EtcdProcess(self.workdir / "etcd").start()
        prefix = new_prefix()
        try:
            if self.partition == "netns":
                self.lab = netns.Lab().open()
                # etcd listens on the host's loopback; the namespaces reach it through a
                # proxy on the bridge's address (never cut: a cut is a node's veth)
                self.etcd_bridge = TcpProxy("127.0.0.1", self.etcd.client_port,
                                            host=self.lab.host_address).start()
            for name in ("a", "b", "c"):
                self.nodes.append(self._node(f"node-{name}", self.workdir / name, prefix))
            for n in self.nodes:
                n.start()
            self.wait_formed(60.0)
            yield
        finally:
            self.heal_all()
            for n in self.nodes:
                n.stop()
                if n.relay is not None:
                    n.relay.stop()
                if n.etcd_proxy is not None:
                    n.etcd_proxy.stop()
            if self.etcd_bridge is not None:
                self.etcd_bridge.stop()
            if self.lab is not None:
                self.lab.close()
            self.etcd.kill()

    def _node(self, name: str, data_dir: Path, prefix: str) -> ClusterNode:
        if self.lab is not None:
            assert self.etcd_bridge is not None
            bridge = f"http://{self.etcd_bridge.host}:{self.etcd_bridge.port}"
            return ClusterNode(name, data_dir, bridge, prefix,
                               partition_handling="pause_minority",
                               member=self.lab.add(name))
        hb_port = free_udp_port()
        relay = UdpRelay(("127.0.0.1", hb_port)).start()
        assert self.etcd is not None
        proxy = TcpProxy("127.0.0.1", self.etcd.client_port).start()
        return ClusterNode(name, data_dir, self.etcd.url, prefix,
                           partition_handling="pause_minority", etcd_proxy=proxy,
                           relay=relay, hb_port=hb_port)

    def formed(self) -> bool:
        names = sorted(n.name for n in self.nodes)
        for n in self.nodes:
            try:
                r = Api(n.proc.http_url).get("/api/cluster/status") if n.proc else None
            except OSError:
                return False
            if r is None or r.status != 200:
                return False
            s = r.json()
            if s["running_nodes"] != names or s["paused"]:
                return False
        return True

    def wait_formed(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if self.formed():
                    return True
            time.sleep(0.2)
        return False

    def setup(self) -> None:
        api = self.nodes[0].api
        for name, body in POLICIES.items():
            r = api.put(f"/api/policies/%2F/{name}",
                        {"pattern": body["pattern"], "definition": body["definition"],
                         "apply-to": "queues", "priority": 1})
            assert r.status in (201, 204), r.text
        conn = connect(lambda: [self.nodes[0].url], self.rng)
        try:
            ch = conn.open_channel(1)
            for queue, args in QUEUES.items():
                conn.declare_queue(ch, queue, durable=True, arguments=args)
        finally:
            conn.close()

    # ------------------------------------------------------------------ faults
    def _signal(self, pid: int | None, sig: signal.Signals) -> None:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _pid(self, node: ClusterNode) -> int | None:
        proc = node.proc.proc if node.proc is not None else None
        return proc.pid if proc is not None and proc.poll() is None else None

    def leader_of(self, queue: str) -> ClusterNode | None:
        for n in self.nodes:
            if n.name in self.down or n.proc is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                r = Api(n.proc.http_url).get(f"/api/queues/%2F/{queue}")
                if r.status == 200:
                    leader = r.json().get("node")
                    return next((m for m in self.nodes if m.name == leader), None)
        return None

    def isolate(self, node: ClusterNode, cut: bool) -> None:
        if self.lab is not None:
            (self.lab.cut if cut else self.lab.restore)(node.name)
            return
        assert node.etcd_proxy is not None and node.relay is not None
        if cut:
            node.etcd_proxy.cut("blackhole")
        else:
            node.etcd_proxy.restore()
        node.relay.cut = cut
        for o in self.nodes:
            if o is not node and o.relay is not None:
                (o.relay.drop_senders.add if cut else o.relay.drop_senders.discard)(node.name)

    def inject(self, fault: Fault) -> None:
        names = [n.name for n in self.nodes]
        text = fault.describe(names)
        node = self.nodes[fault.target % len(self.nodes)]
        if fault.kind == "kill-leader":
            queue = list(QUEUES)[fault.target % len(QUEUES)]
            found = self.leader_of(queue)
            if found is None:
                self.result.faults.append(f"{text}: no leader found, skipped")
                return
            node = found
            text += f" ({node.name}, down {fault.hold:.1f}s)"
        self.result.faults.append(f"t={time.monotonic() - self.started:.0f}s {text}")
        if fault.kind in ("kill", "kill-leader"):
            with self.lock:
                self.down.add(node.name)
            node.kill()
            time.sleep(fault.hold)
            try:
                node.start()
            except RuntimeError as exc:
                self.result.notes.append(f"{node.name} did not restart: {exc}"[:400])
            with self.lock:
                self.down.discard(node.name)
        elif fault.kind == "stop":
            with self.lock:
                self.down.add(node.name)
            self._signal(self._pid(node), signal.SIGSTOP)
            time.sleep(fault.hold)
            self._signal(self._pid(node), signal.SIGCONT)
            with self.lock:
                self.down.discard(node.name)
        elif fault.kind == "stop-etcd":
            assert self.etcd is not None and self.etcd.proc is not None
            self._signal(self.etcd.proc.pid, signal.SIGSTOP)
            time.sleep(fault.hold)
            self._signal(self.etcd.proc.pid, signal.SIGCONT)
        elif fault.kind == "partition":
            with self.lock:
                self.down.add(node.name)
            self.isolate(node, True)
            time.sleep(fault.hold)
            self.isolate(node, False)
            with self.lock:
                self.down.discard(node.name)

    def heal_all(self) -> None:
        """Every fault undone (also on the way out of a failed run)."""
        if self.etcd is not None and self.etcd.proc is not None:
            self._signal(self.etcd.proc.pid, signal.SIGCONT)
        for n in self.nodes:
            self._signal(self._pid(n), signal.SIGCONT)
            if self.lab is not None or (n.etcd_proxy is not None and n.relay is not None):
                self.isolate(n, False)
        with self.lock:
            self.down.clear()

    # ------------------------------------------------------------------ observers
    def sample_leaders(self) -> None:
        """Twice a second: which node claims which queue (two leaders: a failure)."""
        pool = ThreadPoolExecutor(max_workers=len(self.nodes))

        def claims(node: ClusterNode) -> set[str]:
            if node.proc is None:
                return set()
            r = Api(node.proc.http_url).get("/api/queues/%2F?columns=name,node,state")
            if r.status != 200:
                return set()
            return {q["name"] for q in r.json()
                    if q.get("node") == node.name and q.get("state") != "down"}

        try:
            while not self.stop_event.wait(0.5):
                with self.lock:
                    live = [n for n in self.nodes if n.name not in self.down]
                futures = {n.name: pool.submit(claims, n) for n in live}
                seen: dict[str, list[str]] = {}
                for name, fut in futures.items():
                    try:
                        for queue in fut.result(timeout=3.0):
                            seen.setdefault(queue, []).append(name)
                    except Exception:  # a node not answering: not a claim
                        continue
                for queue, who in sorted(seen.items()):
                    if len(who) > 1:
                        self.result.two_leaders.append(
                            f"t={time.monotonic() - self.started:.1f}s {queue}: "
                            f"{', '.join(sorted(who))}")
        finally:
            pool.shutdown(wait=False)

    def new_queues(self) -> None:
        """Every few seconds, a new ha-mode all queue, published to at once."""
        k = 0
        while not self.stop_event.wait(self.rng.uniform(*self.new_queue_every)):
            k += 1
            ledger = Ledger(f"chaos-all-new-{k}")
            self.new_ledgers[ledger.queue] = ledger
            try:
                publish_once(self.urls, self.rng, ledger, list(range(NEW_QUEUE_BATCH)),
                             0, 10.0, declare={})
            except ClientError as exc:
                self.result.declare_failures.append(f"{ledger.queue}: {exc}"[:300])

    # ------------------------------------------------------------------ checks
    def check_answers(self) -> None:
        """Every node answers HTTP and an AMQP passive declare of every long-lived queue
        (declare-ok: the queues exist and their leaders run) within 5 s; a 404 for a
        queue whose leader runs is asked again within those 5 s, then reported."""
        for n in self.nodes:
            t0 = time.monotonic()
            last: BaseException | None = None
            while time.monotonic() - t0 < ANSWER_WITHIN:
                try:
                    self._answer(n)
                    last = None
                    break
                except ClientError as exc:
                    last = exc
                    time.sleep(0.2)
            took = time.monotonic() - t0
            if last is not None:
                self.result.silent_nodes.append(
                    f"{n.name}: no right answer in {took:.1f}s; last: {last}"[:300])
            elif took > ANSWER_WITHIN:
                self.result.silent_nodes.append(f"{n.name}: answered after {took:.1f}s")

    def _answer(self, n: ClusterNode) -> None:
        assert n.proc is not None
        r = Api(n.proc.http_url).get("/api/overview")
        if r.status != 200:
            raise OSError(f"HTTP {r.status}")
        conn = connect(lambda: [n.url], self.rng)
        try:
            conn.sock.settimeout(ANSWER_WITHIN)
            ch = conn.open_channel(1)
            for queue in QUEUES:
                conn.rpc(ch, commands.Queue.Declare(queue=queue, passive=True),
                         commands.Queue.DeclareOk)
        finally:
            conn.close()

    def check_confirms(self, healed: float) -> None:
        """Every queue confirms one more publish within 30 s of the heal."""
        queues = [*self.ledgers.values(), *self.new_ledgers.values()]
        pending = {x.queue: x for x in queues}
        probe = 1_000_000
        while pending and time.monotonic() - healed < CONFIRM_WITHIN:
            for queue, ledger in list(pending.items()):
                probe += 1
                ledger.probes.add(probe)
                try:
                    if publish_once(self.urls, self.rng, ledger, [probe], probe,
                                    min(IO_TIMEOUT, CONFIRM_WITHIN), passive=True):
                        del pending[queue]
                except ClientError as exc:
                    if "NOT_FOUND - no queue" in str(exc) and queue in self.new_ledgers \
                            and not ledger.confirmed:
                        del pending[queue]  # its declare failed during a fault: none
            if pending:
                time.sleep(0.5)
        self.result.unconfirmed_queues += sorted(pending)

    def drain(self, consumers: list[Consumer], timeout: float) -> None:
        """Wait until every confirmed message was delivered (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        last = -1
        stalled_since = time.monotonic()
        while time.monotonic() < deadline:
            ledgers = [*self.ledgers.values(), *self.new_ledgers.values()]
            missing = sum(len(x.lost()) for x in ledgers)
            if missing == 0:
                return
            if missing != last:
                last, stalled_since = missing, time.monotonic()
            elif time.monotonic() - stalled_since > 5.0:
                for c in consumers:  # consume again, maybe through another node
                    c.kick.set()
                stalled_since = time.monotonic()
            time.sleep(0.2)

    # ------------------------------------------------------------------ the run
    def run(self) -> Result:
        faults = schedule(self.seed, self.duration, self.gap)
        with self.cluster():
            self.setup()
            self.started = time.monotonic()
            publishers = [Publisher(x, self.urls, random.Random(self.seed + i), self.rate)
                          for i, x in enumerate(self.ledgers.values())]
            consumers = [Consumer([x], self.urls, random.Random(self.seed + 50 + i))
                         for i, x in enumerate(self.ledgers.values())]
            observers = [threading.Thread(target=self.sample_leaders, daemon=True),
                         threading.Thread(target=self.new_queues, daemon=True)]
            for t in [*publishers, *consumers, *observers]:
                t.start()
            try:
                for fault in faults:
                    time.sleep(fault.at)
                    self.inject(fault)
                    if not self.wait_formed(60.0):
                        self.result.notes.append(
                            f"cluster not formed within 60s after: {self.result.faults[-1]}")
            finally:
                self.heal_all()
            healed = time.monotonic()
            self.stop_event.set()
            if not self.wait_formed(60.0):
                self.result.notes.append("cluster not formed within 60s of the heal")
            self.check_answers()
            self.check_confirms(healed)
            for p in publishers:
                p.stopping.set()
            for p in publishers:
                p.join(30)
            # the new queues: one consumer each (one that was never declared must not
            # stop the others)
            consumers += [Consumer([x], self.urls, random.Random(self.seed + 100 + i))
                          for i, x in enumerate(self.new_ledgers.values())]
            for c in consumers[len(self.ledgers):]:
                c.start()
            self.drain(consumers, self.drain_timeout)
            for c in consumers:
                c.stopping.set()
            for t in [*consumers, *observers]:
                t.join(30)
            clients: list[Publisher | Consumer] = [*publishers, *consumers]
            for client in clients:
                if client.error is not None:
                    self.result.client_errors.append(
                        f"{client.name}: {client.error!r}"[:300])
            for ledger in [*self.ledgers.values(), *self.new_ledgers.values()]:
                self.result.confirmed[ledger.queue] = len(ledger.confirmed)
                self.result.lost[ledger.queue] = lost = ledger.lost()
                if lost:
                    times = sorted(ledger.confirmed_at.get(n, 0.0) - self.started
                                   for n in lost)
                    self.result.notes.append(
                        f"{ledger.queue}: the lost messages were confirmed at "
                        f"t={times[0]:.1f}s..{times[-1]:.1f}s")
                self.result.bad_duplicates[ledger.queue] = ledger.bad_duplicates()
            self._save_logs()
        return self.result

    def _save_logs(self) -> None:
        """The run's result next to the nodes' logs (for whoever reads a failure)."""
        path = self.workdir / "chaos-result.json"
        data: dict[str, Any] = dict(self.result.__dict__)
        data["failures"] = self.result.failures()
        path.write_text(json.dumps(data, indent=1, default=str))


def run(seed: int, duration: float, workdir: Path, **kwargs: Any) -> Result:
    """One seeded run under ``workdir`` (the nodes' data and logs stay there)."""
    workdir.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(workdir, seed, duration, **kwargs)
    print(f"chaos: seed={seed} duration={duration:g}s workdir={workdir} "
          f"(re-run: {chaos.result.rerun})", flush=True)
    return chaos.run()


__all__ = ["Chaos", "Fault", "Result", "run", "schedule"]
