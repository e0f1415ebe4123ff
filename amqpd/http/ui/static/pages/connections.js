// Connections (with closing one, as its owner or an administrator) and a connection's page
// with its data rates (bytes from and to the client, as RabbitMQ's recv_oct and send_oct)
// and message rates over the last minute (the server's samples).

import * as api from "../api.js";
import { Chart, LAST_MINUTE, ratesFromSamples } from "../charts.js";
import { add, clear, dangerButton, fmtBytes, fmtJson, fmtNum, fmtRate, h, kv, link, section, table } from "../ui.js";
import { connectionHref, fetchOr404, is404, notFound } from "./common.js";
import { channelColumns } from "./channels.js";

export async function render(ctx) {
  if (ctx.params.length >= 1 && ctx.params[0]) return renderOne(ctx, ctx.params[0]);
  const list = h("div", { id: "connections-list" });
  add(ctx.root, h("h1", {}, "Connections"), list);
  await ctx.every(async () => {
    const items = await api.get("/api/connections");
    if (!ctx.live()) return;
    clear(list, table([
      { title: "Name", get: (c) => link(connectionHref(c.name), c.name), cls: "name" },
      { title: "User", get: (c) => c.user }, { title: "Virtual host", get: (c) => c.vhost },
      { title: "Client", get: (c) => clientName(c) }, { title: "TLS", get: (c) => (c.ssl ? "yes" : "no") },
      { title: "Channels", get: (c) => fmtNum(c.channels), cls: "num" },
      { title: "State", get: (c) => c.state || "running" },
      { title: "From client", get: (c) => byteRate(c.recv_oct_details), cls: "num" },
      { title: "To client", get: (c) => byteRate(c.send_oct_details), cls: "num" },
      { title: "publish", get: (c) => fmtRate((c.message_stats || {}).publish_details), cls: "num" },
      { title: "deliver", get: (c) => fmtRate((c.message_stats || {}).deliver_get_details), cls: "num" },
      { title: "", get: (c) => closeButton(c.name) },
    ], items, { id: "connections-table", empty: "No connections." }));
  });
}

const byteRate = (d) => `${fmtBytes(d && typeof d.rate === "number" ? d.rate : 0)}/s`;
const MSG_RATES = ["publish", "deliver_get", "ack", "confirm"];

function clientName(c) {
  const p = c.client_properties || {};
  return [p.product, p.version, p.connection_name ? `"${p.connection_name}"` : ""].filter(Boolean).join(" ");
}

function closeButton(name, after) {
  return dangerButton("Close", `Close connection ${name}?`, async () => {
    await api.request("DELETE", `/api/connections/${api.seg(name)}`);
    const said = `Connection ${name} closed.`;
    if (after) { after(said); return ""; }
    return said;
  });
}

async function renderOne(ctx, name) {
  const base = `/api/connections/${api.seg(name)}`;
  const missing = `Connection "${name}" does not exist (it may have closed).`;
  const back = ["#/connections", "Connections"];
  if (!(await fetchOr404(ctx, base, missing, back))) return;
  const details = h("div"), channels = h("div", { id: "connection-channels" });
  const dataBox = h("div", { class: "chart-box" }), msgBox = h("div", { class: "chart-box" });
  const ratesNow = h("div", { class: "muted", id: "connection-rates-now" });
  add(ctx.root, h("p", {}, link("#/connections", "« Connections")), h("h1", {}, "Connection ", h("span", { class: "objname" }, name)),
    section("Details", details),
    section("Data rates (last minute)", dataBox),
    section("Message rates (last minute, its channels together)", msgBox, ratesNow),
    section("Channels", channels),
    section("Close this connection", closeButton(name, (said) => ctx.go("#/connections", said))));
  const data = new Chart(dataBox, ["from client", "to client"], { unit: "B/s", id: "connection-data-chart" });
  const messages = new Chart(msgBox, ["publish", "deliver", "ack", "confirm"], { id: "connection-rate-chart" });
  await ctx.every(async () => {
    let c, chans;
    try {
      [c, chans] = await Promise.all([api.get(base + LAST_MINUTE), api.get(`${base}/channels`)]);
    } catch (exc) {
      if (is404(exc) && ctx.live()) { notFound(ctx, missing, back); return; }
      throw exc;
    }
    if (!ctx.live()) return;
    clear(details, kv([["User", c.user], ["Virtual host", c.vhost], ["Client", clientName(c)], ["Peer", `${c.peer_host}:${c.peer_port}`],
      ["Protocol", c.protocol], ["TLS", c.ssl ? "yes" : "no"], ["Heartbeat", `${c.timeout}s`], ["Frame max", fmtNum(c.frame_max)],
      ["Client properties", fmtJson(c.client_properties)]]));
    data.set(ratesFromSamples([c.recv_oct_details, c.send_oct_details]));
    const m = c.message_stats || {};
    messages.set(ratesFromSamples(MSG_RATES.map((k) => m[`${k}_details`])));
    clear(ratesNow, `from client ${byteRate(c.recv_oct_details)} · to client ${byteRate(c.send_oct_details)} · `, MSG_RATES.map((k) => `${k.replace("_get", "")} ${fmtRate(m[`${k}_details`])}`).join(" · "));
    clear(channels, table(channelColumns(), chans));
  });
}
