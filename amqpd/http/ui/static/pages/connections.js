// Connections (with closing one, as its owner or an administrator) and a connection's page.

import * as api from "../api.js";
import { clear, dangerButton, fmtJson, fmtNum, h, kv, link, section, table } from "../ui.js";
import { connectionHref } from "./common.js";
import { channelColumns } from "./channels.js";

export async function render(ctx) {
  if (ctx.params.length >= 1 && ctx.params[0]) return renderOne(ctx, ctx.params[0]);
  const list = h("div", { id: "connections-list" });
  ctx.root.append(h("h1", {}, "Connections"), list);
  await ctx.every(5000, async () => {
    const items = await api.get("/api/connections");
    if (!ctx.live()) return;
    clear(list, table([
      { title: "Name", get: (c) => link(connectionHref(c.name), c.name), cls: "name" },
      { title: "User", get: (c) => c.user }, { title: "Virtual host", get: (c) => c.vhost },
      { title: "Client", get: (c) => clientName(c) }, { title: "TLS", get: (c) => (c.ssl ? "yes" : "no") },
      { title: "Channels", get: (c) => fmtNum(c.channels), cls: "num" },
      { title: "State", get: (c) => c.state || "running" },
      { title: "", get: (c) => closeButton(c.name) },
    ], items, { id: "connections-table", empty: "No connections." }));
  });
}

function clientName(c) {
  const p = c.client_properties || {};
  return [p.product, p.version, p.connection_name ? `"${p.connection_name}"` : ""].filter(Boolean).join(" ");
}

function closeButton(name, after) {
  return dangerButton("Close", `Close connection ${name}?`, async () => {
    await api.request("DELETE", `/api/connections/${api.seg(name)}`);
    if (after) after();
    return "Closed.";
  });
}

async function renderOne(ctx, name) {
  const details = h("div"), channels = h("div", { id: "connection-channels" });
  ctx.root.append(h("p", {}, link("#/connections", "« Connections")), h("h1", {}, "Connection ", h("span", { class: "objname" }, name)),
    section("Details", details), section("Channels", channels),
    section("Close this connection", closeButton(name, () => ctx.go("#/connections"))));
  await ctx.every(5000, async () => {
    const [c, chans] = await Promise.all([api.get(`/api/connections/${api.seg(name)}`), api.get(`/api/connections/${api.seg(name)}/channels`)]);
    if (!ctx.live()) return;
    clear(details, kv([["User", c.user], ["Virtual host", c.vhost], ["Client", clientName(c)], ["Peer", `${c.peer_host}:${c.peer_port}`],
      ["Protocol", c.protocol], ["TLS", c.ssl ? "yes" : "no"], ["Heartbeat", `${c.timeout}s`], ["Frame max", fmtNum(c.frame_max)],
      ["Client properties", fmtJson(c.client_properties)]]));
    clear(channels, table(channelColumns(), chans));
  });
}
