// Connections (with closing one, as its owner or an administrator) and a connection's page.

import * as api from "../api.js";
import { clear, dangerButton, fmtJson, fmtNum, h, kv, link, section, table } from "../ui.js";
import { connectionHref, fetchOr404, is404, notFound } from "./common.js";
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
  ctx.root.append(h("p", {}, link("#/connections", "« Connections")), h("h1", {}, "Connection ", h("span", { class: "objname" }, name)),
    section("Details", details), section("Channels", channels),
    section("Close this connection", closeButton(name, (said) => ctx.go("#/connections", said))));
  await ctx.every(5000, async () => {
    let c, chans;
    try {
      [c, chans] = await Promise.all([api.get(base), api.get(`${base}/channels`)]);
    } catch (exc) {
      if (is404(exc) && ctx.live()) { notFound(ctx, missing, back); return; }
      throw exc;
    }
    if (!ctx.live()) return;
    clear(details, kv([["User", c.user], ["Virtual host", c.vhost], ["Client", clientName(c)], ["Peer", `${c.peer_host}:${c.peer_port}`],
      ["Protocol", c.protocol], ["TLS", c.ssl ? "yes" : "no"], ["Heartbeat", `${c.timeout}s`], ["Frame max", fmtNum(c.frame_max)],
      ["Client properties", fmtJson(c.client_properties)]]));
    clear(channels, table(channelColumns(), chans));
  });
}
