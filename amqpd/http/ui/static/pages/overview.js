// Overview: totals, message rates and queued messages over the last ten minutes (from the
// server's samples), the node's memory and disk against their alarm thresholds, alarms,
// listeners and the hot-path mode.

import * as api from "../api.js";
import { Chart, lengthsFromSamples, ratesFromSamples } from "../charts.js";
import { add, clear, fmtBytes, fmtDuration, fmtNum, fmtRate, h, kv, section, table } from "../ui.js";

const RATES = ["publish", "deliver_get", "ack", "confirm", "redeliver"];
const RATE_LABELS = ["publish", "deliver", "ack", "confirm", "redeliver"];

export async function render(ctx) {
  const alarms = h("div", { id: "alarms" });
  const totals = h("div", { id: "totals" });
  const rateBox = h("div", { class: "chart-box" });
  const rateNow = h("div", { id: "rates-now", class: "muted" });
  const lenBox = h("div", { class: "chart-box" });
  const node = h("div", { id: "node" });
  const listeners = h("div", { id: "listeners" });
  const about = h("div", { id: "about" });
  add(ctx.root, 
    h("h1", {}, "Overview"), alarms,
    section("Totals", totals),
    section("Message rates (last 10 minutes)", rateBox, rateNow),
    section("Queued messages (last 10 minutes)", lenBox),
    ctx.me.monitor ? section("Node", node) : null,
    section("Listeners", listeners),
    section("About", about),
  );
  const rates = new Chart(rateBox, RATE_LABELS, { id: "rate-chart" });
  const lengths = new Chart(lenBox, ["ready", "unacked"], { unit: "", id: "length-chart" });

  await ctx.every(async () => {
    const o = await api.get("/api/overview" + api.query({ msg_rates_age: 600, msg_rates_incr: 5, lengths_age: 600, lengths_incr: 5 }));
    if (!ctx.live()) return;
    const t = o.object_totals, q = o.queue_totals, m = o.message_stats || {};
    clear(totals, h("div", { class: "tiles" }, [
      ["Connections", t.connections, "#/connections"], ["Channels", t.channels, "#/channels"],
      ["Exchanges", t.exchanges, "#/exchanges"], ["Queues", t.queues, "#/queues"],
      ["Consumers", t.consumers], ["Ready", q.messages_ready], ["Unacked", q.messages_unacknowledged],
      ["Total messages", q.messages],
    ].map(([label, value, href]) => h("div", { class: "tile", dataset: { total: label } },
      h("div", { class: "value" }, fmtNum(value)), href ? h("a", { href }, label) : h("div", {}, label)))));
    rates.set(ratesFromSamples(RATES.map((k) => m[`${k}_details`])));
    clear(rateNow, "Now: ", RATES.map((k, i) => `${RATE_LABELS[i]} ${fmtRate(m[`${k}_details`])}`).join(" · "));
    lengths.set(lengthsFromSamples([q.messages_ready_details, q.messages_unacknowledged_details]));
    clear(listeners, table([
      { title: "Protocol", get: (l) => l.protocol }, { title: "Bound to", get: (l) => l.ip_address },
      { title: "Port", get: (l) => String(l.port) },
    ], o.listeners || []));
    clear(about, kv([
      ["Product", `${o.product_name} ${o.product_version} (speaks RabbitMQ ${o.rabbitmq_version}'s management API)`],
      ["Cluster name", o.cluster_name], ["Node", o.node],
      ["Hot path", h("span", { id: "hot-path" }, o.amqpd_hot_path || "—")],
      o.amqpd_replication ? ["Warren role", h("span", { id: "warren-role" }, `${o.amqpd_replication.role}${o.amqpd_replication.active_node && o.amqpd_replication.role !== "active" ? ` (the active is ${o.amqpd_replication.active_node})` : ""}`)] : null,
      ["Runtime", o.erlang_version], ["Plugins", (o.amqpd_plugins || []).join(", ") || "none"],
    ]));
    if (ctx.me.monitor) {
      const all = await api.get("/api/nodes");
      const n = all.find((x) => x.name === o.node) || all[0];
      if (!ctx.live() || !n) return;
      renderNode(node, alarms, n);
      // in a cluster or warren: every node, as RabbitMQ's overview lists them
      if (all.length > 1) {
        node.append(h("h3", {}, `All ${all.length} nodes`), table([
          { title: "Name", get: (x) => x.name + (x.name === o.node ? " (this node)" : "") },
          { title: "State", get: (x) => h("span", { class: `state ${x.running ? "running" : "error"}` }, x.running ? "running" : "not running") },
          { title: "Role", get: (x) => x.amqpd_role || (x.amqpd_member === false ? "joining" : "cluster member") },
          { title: "Partitions", get: (x) => (x.partitions && x.partitions.length ? x.partitions.join(", ") : "none") },
        ], all, { id: "overview-nodes" }), h("p", {}, h("a", { href: "#/nodes" }, "Details on the Nodes page")));
      }
    }
  });
}

function gauge(used, limit, alarm, label, invert = false) {
  // memory: used against the high watermark; disk: free space against the low limit
  const pct = limit ? Math.min(100, (100 * used) / (invert ? Math.max(used, limit * 4) : limit)) : 0;
  return h("div", { class: `gauge ${alarm ? "alarm" : ""}` },
    h("div", { class: "bar" }, h("div", { class: "fill", style: `width:${pct.toFixed(1)}%` })),
    h("div", { class: "gauge-text" }, label));
}

function renderNode(node, alarms, n) {
  const list = [];
  if (n.mem_alarm) list.push(`Memory alarm: ${fmtBytes(n.mem_used)} used, above the high watermark of ${fmtBytes(n.mem_limit)}. Publishers are blocked.`);
  if (n.disk_free_alarm) list.push(`Disk alarm: ${fmtBytes(n.disk_free)} free, below the limit of ${fmtBytes(n.disk_free_limit)}. Publishers are blocked.`);
  clear(alarms, list.length
    ? h("div", { class: "alarm-box", id: "alarm-list" }, h("strong", {}, "Resource alarms in effect"), h("ul", {}, list.map((a) => h("li", {}, a))))
    : h("div", { class: "ok-box", id: "alarm-list" }, "No resource alarms."));
  clear(node, kv([
    ["Name", n.name],
    ["Memory", gauge(n.mem_used, n.mem_limit, n.mem_alarm, `${fmtBytes(n.mem_used)} of ${n.mem_limit ? fmtBytes(n.mem_limit) + " high watermark" : "no limit"}${n.mem_alarm ? " — ALARM" : ""}`)],
    ["Disk free", gauge(n.disk_free, n.disk_free_limit, n.disk_free_alarm, `${fmtBytes(n.disk_free)} free, alarm below ${fmtBytes(n.disk_free_limit)}${n.disk_free_alarm ? " — ALARM" : ""}`, true)],
    ["File descriptors", `${fmtNum(n.fd_used)} / ${fmtNum(n.fd_total)}`],
    ["Sockets", `${fmtNum(n.sockets_used)} / ${fmtNum(n.sockets_total)}`],
    ["Uptime", fmtDuration(n.uptime)], ["Processors", String(n.processors)], ["OS pid", n.os_pid],
  ]));
}
