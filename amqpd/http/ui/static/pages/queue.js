// One queue: details and policy, its length and rates over the last minute (samples kept
// by the server, so the charts open full), consumers, bindings (add and remove), and the
// message tools: get (ack mode, count, encoding), publish, purge, delete, and moving its
// messages to another queue through a shovel when the shovel plugin runs. A stream also
// shows its log (size on disk, segments, first and last offset) and each consumer's
// position: the next offset it reads and how far behind the end of the log that is.

import * as api from "../api.js";
import { Chart, LAST_MINUTE, lengthsFromSamples, ratesFromSamples } from "../charts.js";
import { add, clear, dangerButton, features, fmtBytes, fmtJson, fmtNum, fmtOffset, fmtRate, form, h, kv, link, parseArgs, section, table } from "../ui.js";
import { channelHref, connectionHref, dedupPanel, exchangeHref, fetchOr404, is404, notFound } from "./common.js";
import { publishForm } from "./publish.js";

const RATES = ["publish", "deliver_get", "ack", "redeliver"];

export async function render(ctx) {
  const [vhost, name] = ctx.params;
  const base = `/api/queues/${api.seg(vhost)}/${api.seg(name)}`;
  const missing = `Queue "${name}" does not exist in virtual host "${vhost}".`;
  const back = ["#/queues", "Queues"];
  if (!(await fetchOr404(ctx, base, missing, back))) return;
  const details = h("div", { id: "queue-details" });
  const streamBox = h("div", { id: "stream-details" });
  const streamPanel = section("Stream", streamBox);
  streamPanel.hidden = true;
  const dedup = dedupPanel();
  const chartBox = h("div", { class: "chart-box" });
  const lenBox = h("div", { class: "chart-box" });
  const rateNow = h("div", { class: "muted", id: "queue-rates-now" });
  const consumers = h("div", { id: "queue-consumers" });
  const bindings = h("div", { id: "queue-bindings" });
  const got = h("div", { id: "got-messages" });
  add(ctx.root, 
    h("p", {}, link("#/queues", "« Queues")),
    h("h1", {}, "Queue ", h("span", { class: "objname", id: "queue-name" }, name), h("span", { class: "muted" }, ` in vhost ${vhost}`)),
    section("Details", details),
    dedup.panel,
    streamPanel,
    section("Queued messages (last minute)", lenBox),
    section("Message rates (last minute)", chartBox, rateNow),
    section("Consumers", consumers),
    section("Bindings", bindings, form([
      { name: "source", label: "From exchange", required: true },
      { name: "routing_key", label: "Routing key" },
      { name: "arguments", label: "Arguments", type: "textarea", rows: 2, placeholder: "key=value lines or JSON" },
    ], "Bind", async (v) => {
      await api.post(`/api/bindings/${api.seg(vhost)}/e/${api.seg(v.source)}/q/${api.seg(name)}`,
        { routing_key: v.routing_key, arguments: parseArgs(v.arguments) });
      await refreshBindings();
      return "Bound.";
    }, { id: "add-binding" })),
    section("Get messages", h("p", { class: "muted" }, "Getting messages is destructive unless the ack mode requeues them (a requeued message comes back marked redelivered)."),
      form([
        { name: "ackmode", label: "Ack mode", type: "select", options: [["ack_requeue_true", "Nack, requeue true"], ["ack_requeue_false", "Ack (remove from the queue)"], ["reject_requeue_true", "Reject, requeue true"], ["reject_requeue_false", "Reject, requeue false (dead-letter)"]] },
        { name: "encoding", label: "Encoding", type: "select", options: [["auto", "Auto string / base64"], ["base64", "base64"]] },
        { name: "count", label: "Messages", type: "number", value: "1" },
        { name: "truncate", label: "Truncate payloads at (bytes)", type: "number", value: "50000" },
      ], "Get messages", async (v) => {
        const msgs = await api.post(`${base}/get`, { count: Number(v.count), ackmode: v.ackmode, encoding: v.encoding, truncate: v.truncate ? Number(v.truncate) : undefined });
        showMessages(got, msgs);
        refresh();
        return msgs.length ? `${msgs.length} message(s).` : "The queue is empty.";
      }, { id: "get-messages" }), got),
    section("Publish a message", h("p", { class: "muted" }, "Published to the default exchange with this queue's name as routing key."),
      publishForm(vhost, "", { routingKey: name, fixedKey: true, after: refresh })),
    ctx.plugins.includes("shovel") && ctx.me.policymaker ? section("Move messages", h("p", { class: "muted" }, "A shovel moves every message now in this queue to another queue of this vhost, then removes itself."),
      form([{ name: "dest", label: "Destination queue", required: true }], "Move messages", async (v) => {
        const value = {
          "src-uri": `amqp:///${api.seg(vhost)}`, "src-queue": name, "src-protocol": "amqp091", "src-prefetch-count": 1000,
          "src-delete-after": "queue-length", "dest-protocol": "amqp091", "dest-uri": `amqp:///${api.seg(vhost)}`,
          "dest-queue": v.dest, "dest-add-forward-headers": false, "ack-mode": "on-confirm",
        };
        await api.put(`/api/parameters/shovel/${api.seg(vhost)}/${api.seg(`Move from ${name}`)}`, { value });
        return `Shovel "Move from ${name}" started; see the Shovels page for its progress.`;
      }, { id: "move-messages" })) : null,
    section("Purge and delete",
      dangerButton("Purge messages", `Remove every ready message from ${name}?`, async () => { await api.del(`${base}/contents`); refresh(); return "Purged."; }),
      " ",
      dangerButton("Delete queue", `Delete queue ${name} and its messages?`, async () => { await api.del(base); ctx.go("#/queues", `Queue ${name} deleted.`); })),
  );
  const lengths = new Chart(lenBox, ["ready", "unacked"], { unit: "", id: "queue-length-chart" });
  const chart = new Chart(chartBox, ["publish", "deliver", "ack", "redeliver"], { id: "queue-rate-chart" });

  async function refresh() {
    let q;
    try { q = await api.get(base + LAST_MINUTE); } catch (exc) {
      if (is404(exc) && ctx.live()) { notFound(ctx, `${missing} It was deleted.`, back); return; }
      throw exc;
    }
    if (!ctx.live()) return;
    const m = q.message_stats || {};
    clear(details, kv([
      ["Features", features(q)], ["State", q.state], ["Type", q.type],
      ["Policy", q.policy || "none"], ["Effective policy definition", fmtJson(q.effective_policy_definition) || "—"],
      ["Arguments", fmtJson(q.arguments) || "none"],
      ["Exclusive owner", q.owner_pid_details ? link(connectionHref(q.owner_pid_details.name), q.owner_pid_details.name) : "none"],
      ["Consumers", fmtNum(q.consumers)],
      ["Messages ready", h("span", { id: "messages-ready" }, fmtNum(q.messages_ready))],
      ["Messages unacked", fmtNum(q.messages_unacknowledged)],
      ["Messages total", h("span", { id: "messages-total" }, fmtNum(q.messages))],
      ["Ready bytes", fmtBytes(q.message_bytes_ready)],
    ]));
    chart.set(ratesFromSamples(RATES.map((k) => m[`${k}_details`])));
    lengths.set(lengthsFromSamples([q.messages_ready_details, q.messages_unacknowledged_details]));
    clear(rateNow, RATES.map((k) => `${k.replace("_get", "")} ${fmtRate(m[`${k}_details`])}`).join(" · "));
    dedup.set(q);
    const log = q.stream;
    streamPanel.hidden = !log;
    if (log) {
      clear(streamBox, kv([
        ["Size on disk", h("span", { id: "stream-size" }, fmtBytes(log.size_bytes))],
        ["Segments", h("span", { id: "stream-segments" }, fmtNum(log.segments))],
        ["First offset", h("span", { id: "stream-first" }, fmtOffset(log.first_offset, log.last_offset))],
        ["Last offset", h("span", { id: "stream-last" }, fmtOffset(log.last_offset, log.last_offset))],
        ["Committed offset", fmtOffset(log.committed_offset, log.committed_offset)],
        ["Segments deleted by retention", fmtNum(log.segments_deleted)],
      ]));
    }
    const all = await api.get(`/api/consumers/${api.seg(vhost)}`);
    if (!ctx.live()) return;
    // a stream consumer's position: the stream names it by channel and consumer tag
    const position = (c) => (log ? log.consumers.find((p) => p.consumer_tag === c.consumer_tag && p.channel === c.channel_details.name) : null);
    clear(consumers, table([
      { title: "Consumer tag", get: (c) => c.consumer_tag },
      { title: "Channel", get: (c) => link(channelHref(c.channel_details.name), c.channel_details.name) },
      { title: "Ack required", get: (c) => (c.ack_required ? "yes" : "no") },
      { title: "Exclusive", get: (c) => (c.exclusive ? "yes" : "no") },
      { title: "Prefetch", get: (c) => String(c.prefetch_count) },
      { title: "Arguments", get: (c) => fmtJson(c.arguments) },
      ...(log ? [
        { title: "Next offset", get: (c) => { const p = position(c); return p ? fmtNum(p.offset) : "—"; }, cls: "num stream-offset" },
        { title: "Lag", get: (c) => { const p = position(c); return p ? fmtNum(p.lag) : "—"; }, cls: "num stream-lag" },
      ] : []),
    ], all.filter((c) => c.queue.name === name), { empty: "No consumers.", id: "queue-consumers-table" }));
  }

  async function refreshBindings() {
    const list = await api.get(`${base}/bindings`);
    if (!ctx.live()) return;
    clear(bindings, table([
      { title: "From", get: (b) => (b.source ? link(exchangeHref(vhost, b.source), b.source) : "(default exchange binding)") },
      { title: "Routing key", get: (b) => b.routing_key },
      { title: "Arguments", get: (b) => fmtJson(b.arguments) },
      { title: "", get: (b) => (b.source ? dangerButton("Unbind", null, async () => {
        await api.del(`/api/bindings/${api.seg(vhost)}/e/${api.seg(b.source)}/q/${api.seg(name)}/${api.seg(b.properties_key)}`);
        await refreshBindings();
        return "Unbound.";
      }) : "") },
    ], list, { id: "bindings-table" }));
  }

  await refreshBindings();
  await ctx.every(refresh);
}

function showMessages(el, msgs) {
  clear(el, msgs.map((m, i) => h("div", { class: "message", dataset: { index: String(i) } },
    h("h3", {}, `Message ${i + 1}`),
    kv([
      ["Exchange", m.exchange || "(AMQP default)"], ["Routing key", m.routing_key], ["Redelivered", m.redelivered ? "yes" : "no"],
      ["Properties", fmtJson(m.properties) || "none"], ["Messages left in queue", fmtNum(m.message_count)],
      [`Payload (${fmtNum(m.payload_bytes)} bytes, ${m.payload_encoding})`, h("pre", { class: "payload" }, m.payload)],
    ]))));
}
