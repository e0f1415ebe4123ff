// Nodes (monitoring users): every node of the cluster or warren with its role, health and
// resources (/api/nodes), the cluster's membership and partitions (/api/cluster/status),
// and replication: this node's warren role, epoch, and each standby's lag (/api/replication).

import * as api from "../api.js";
import { add, clear, fmtBytes, fmtDuration, fmtNum, h, kv, section, table } from "../ui.js";
import { is404 } from "./common.js";

export async function render(ctx) {
  const nodes = h("div", { id: "nodes-list" }), cluster = h("div", { id: "cluster-status" });
  const repl = h("div", { id: "replication" });
  add(ctx.root, h("h1", {}, "Nodes"), section("Nodes", nodes), section("Cluster", cluster), section("Replication (warren)", repl));
  await ctx.every(async () => {
    const [list, status, replication] = await Promise.all([api.get("/api/nodes"), api.get("/api/cluster/status"),
      api.get("/api/replication").catch((exc) => { if (is404(exc)) return null; throw exc; })]);
    if (!ctx.live()) return;
    const here = status.node;
    clear(nodes, table([
      { title: "Name", get: (n) => [nodeLink(n, here), n.name === here ? h("span", { class: "muted" }, " (this node)") : null], cls: "name" },
      { title: "State", get: (n) => h("span", { class: `state ${n.running ? "running" : "error"}` }, n.running ? (n.amqpd_paused ? "paused" : "running") : "not running") },
      { title: "Role", get: (n) => role(n, status) },
      { title: "Partitions", get: (n) => (n.partitions && n.partitions.length ? h("span", { class: "state error" }, n.partitions.join(", ")) : "none") },
      { title: "Memory", get: (n) => (n.mem_used !== undefined ? `${fmtBytes(n.mem_used)}${n.mem_alarm ? " ALARM" : ""}` : "—"), cls: "num" },
      { title: "Disk free", get: (n) => (n.disk_free !== undefined ? `${fmtBytes(n.disk_free)}${n.disk_free_alarm ? " ALARM" : ""}` : "—"), cls: "num" },
      { title: "File descriptors", get: (n) => (n.fd_used !== undefined ? `${fmtNum(n.fd_used)} / ${fmtNum(n.fd_total)}` : "—"), cls: "num" },
      { title: "Uptime", get: (n) => (n.uptime !== undefined ? fmtDuration(n.uptime) : "—") },
      { title: "Replication lag", get: (n) => lag(n) },
    ], list, { id: "nodes-table" }));
    const parts = Object.entries(status.partitions || {});
    clear(cluster, status.cluster === null
      ? h("p", { class: "muted" }, `A single node (${here}): not in a cluster.`)
      : kv([["Cluster", status.cluster_name], ["Members (disk nodes)", (status.disk_nodes || []).join(", ")],
        ["Running", h("span", { id: "running-nodes" }, (status.running_nodes || []).join(", "))],
        ["Partitions", parts.length ? h("span", { class: "state error", id: "partitions" }, parts.map(([n, from]) => `${n} cannot reach ${from.join(", ")}`).join("; ")) : h("span", { id: "partitions" }, "none")],
        ["Partition handling", status.partition_handling], ["Paused", status.paused ? `yes (${status.pause_reason})` : "no"],
        ["etcd reachable", status.etcd_reachable === undefined ? "—" : status.etcd_reachable ? "yes" : "no"]]));
    clear(repl, replication === null ? h("p", { class: "muted" }, "Replication is not configured on this node.") : replicationView(replication));
  });
}

function nodeLink(n, here) {
  const a = n.amqpd_addresses || {};
  let http = a.http || null;  // a warren peer records host:port
  if (!http && a.http_port && a.link) http = `${a.link.replace(/:\d+$/, "")}:${a.http_port}`;  // a cluster member
  if (n.name === here || !http) return n.name;
  return h("a", { href: `${location.protocol}//${http}/`, title: "this node's management UI" }, n.name);
}

function role(n, status) {
  if (n.amqpd_role) return h("span", { class: `role ${n.amqpd_role}` }, n.amqpd_role + (n.amqpd_epoch !== undefined && n.amqpd_epoch !== null ? ` (epoch ${n.amqpd_epoch})` : ""));
  if (status.cluster !== null && status.cluster !== undefined) return n.amqpd_member === false ? "joining" : "cluster member";
  return "single node";
}

function lag(n) {
  const r = n.replication || {};
  if (r.lag_seconds !== undefined) return `${r.lag_seconds} s, ${fmtNum(r.lag_records)} records${n.amqpd_in_sync ? " (in sync)" : ""}`;
  if (n.amqpd_in_sync !== undefined && n.amqpd_in_sync !== null) return n.amqpd_in_sync ? "in sync" : "behind";
  return "—";
}

function replicationView(r) {
  const rows = [["Role", h("span", { id: "replication-role" }, r.role)], ["Epoch", String(r.epoch)], ["Mode", r.mode],
    ["Failover", r.static ? "static (amqpctl promote)" : "automatic (etcd)"]];
  if (r.role !== "active" && r.active !== undefined) {
    rows.push(["Active", `${r.active_name || "?"} (replication from ${r.active})`], ["Connected", r.connected ? "yes" : "no"],
      ["Lag", h("span", { id: "replication-lag" }, `${fmtNum(r.lag_records)} records, ${r.lag_seconds} s`)],
      ["Received", fmtBytes(r.bytes_received)], r.refused ? ["Refused", r.refused] : null);
  }
  const out = [kv(rows)];
  if (r.standbys) {
    out.push(h("h3", {}, "Standbys"), table([
      { title: "Name", get: (s) => s.name }, { title: "Address", get: (s) => s.address },
      { title: "In sync", get: (s) => (s.in_sync ? "yes" : "no") },
      { title: "Acked", get: (s) => `${fmtNum(s.acked_seq)} of ${fmtNum(r.last_seq)}`, cls: "num" },
      { title: "Lag", get: (s) => `${fmtNum(s.lag_records)} records, ${fmtBytes(s.lag_bytes)}, ${s.lag_seconds} s`, cls: "num" },
    ], r.standbys, { id: "standbys-table", empty: "No standby connected." }));
  }
  return out;
}
