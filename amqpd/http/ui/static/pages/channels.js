// Channels: every visible channel with its prefetch, unacked count, mode and rates, and a
// channel's page: its details, consumers, and message rates over the last minute (the
// server's samples, so the chart opens full).

import * as api from "../api.js";
import { Chart, LAST_MINUTE, ratesFromSamples } from "../charts.js";
import { add, clear, fmtJson, fmtNum, fmtRate, h, kv, link, section, table } from "../ui.js";
import { channelHref, connectionHref, fetchOr404, is404, notFound, queueHref } from "./common.js";

const RATES = ["publish", "confirm", "deliver_get", "ack", "redeliver"];

export function channelColumns() {
  return [
    { title: "Channel", get: (c) => link(channelHref(c.name), c.name), cls: "name" },
    { title: "Connection", get: (c) => link(connectionHref(c.connection_details.name), c.connection_details.name) },
    { title: "User", get: (c) => c.user }, { title: "Virtual host", get: (c) => c.vhost },
    { title: "Mode", get: (c) => mode(c) },
    { title: "Prefetch", get: (c) => String(c.prefetch_count) },
    { title: "Unacked", get: (c) => fmtNum(c.messages_unacknowledged), cls: "num" },
    { title: "Consumers", get: (c) => fmtNum(c.consumer_count), cls: "num" },
    { title: "publish", get: (c) => fmtRate((c.message_stats || {}).publish_details), cls: "num" },
    { title: "confirm", get: (c) => fmtRate((c.message_stats || {}).confirm_details), cls: "num" },
    { title: "deliver", get: (c) => fmtRate((c.message_stats || {}).deliver_get_details), cls: "num" },
    { title: "ack", get: (c) => fmtRate((c.message_stats || {}).ack_details), cls: "num" },
  ];
}

const mode = (c) => [c.confirm ? "confirm" : "", c.transactional ? "tx" : ""].join(" ").trim();

export async function render(ctx) {
  if (ctx.params.length >= 1 && ctx.params[0]) return renderOne(ctx, ctx.params[0]);
  const list = h("div", { id: "channels-list" });
  add(ctx.root, h("h1", {}, "Channels"), list);
  await ctx.every(async () => {
    const items = await api.get("/api/channels");
    if (!ctx.live()) return;
    clear(list, table(channelColumns(), items, { id: "channels-table", empty: "No channels." }));
  });
}

async function renderOne(ctx, name) {
  const base = `/api/channels/${api.seg(name)}`;
  const missing = `Channel "${name}" does not exist (it or its connection may have closed).`;
  const back = ["#/channels", "Channels"];
  if (!(await fetchOr404(ctx, base, missing, back))) return;
  const details = h("div", { id: "channel-details" }), consumers = h("div", { id: "channel-consumers" });
  const chartBox = h("div", { class: "chart-box" }), ratesNow = h("div", { class: "muted", id: "channel-rates-now" });
  add(ctx.root, h("p", {}, link("#/channels", "« Channels")), h("h1", {}, "Channel ", h("span", { class: "objname" }, name)),
    section("Details", details), section("Message rates (last minute)", chartBox, ratesNow), section("Consumers", consumers));
  const chart = new Chart(chartBox, ["publish", "confirm", "deliver", "ack", "redeliver"], { id: "channel-rate-chart" });
  await ctx.every(async () => {
    let c, all;
    try {
      [c, all] = await Promise.all([api.get(base + LAST_MINUTE), api.get(`/api/consumers`)]);
    } catch (exc) {
      if (is404(exc) && ctx.live()) { notFound(ctx, missing, back); return; }
      throw exc;
    }
    if (!ctx.live()) return;
    const m = c.message_stats || {};
    clear(details, kv([
      ["Connection", link(connectionHref(c.connection_details.name), c.connection_details.name)],
      ["Number", String(c.number)], ["User", c.user], ["Virtual host", c.vhost], ["State", c.state],
      ["Mode", mode(c) || "none"], ["Prefetch (per consumer)", String(c.prefetch_count)],
      ["Prefetch (per channel)", String(c.global_prefetch_count)],
      ["Unacked", h("span", { id: "channel-unacked" }, fmtNum(c.messages_unacknowledged))],
      ["Uncommitted messages", fmtNum(c.messages_uncommitted)], ["Uncommitted acks", fmtNum(c.acks_uncommitted)],
    ]));
    chart.set(ratesFromSamples(RATES.map((k) => m[`${k}_details`])));
    clear(ratesNow, RATES.map((k) => `${k.replace("_get", "")} ${fmtRate(m[`${k}_details`])}`).join(" · "));
    clear(consumers, table([
      { title: "Consumer tag", get: (x) => x.consumer_tag },
      { title: "Queue", get: (x) => link(queueHref(x.queue.vhost, x.queue.name), x.queue.name) },
      { title: "Ack required", get: (x) => (x.ack_required ? "yes" : "no") },
      { title: "Exclusive", get: (x) => (x.exclusive ? "yes" : "no") },
      { title: "Prefetch", get: (x) => String(x.prefetch_count) },
      { title: "Arguments", get: (x) => fmtJson(x.arguments) },
    ], all.filter((x) => x.channel_details.name === name), { id: "channel-consumers-table", empty: "No consumers." }));
  });
}
