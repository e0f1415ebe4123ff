// Federation upstreams (policymakers): the list, adding one and deleting one. A
// federation-upstream parameter names the remote broker; a policy whose definition says
// {"federation-upstream": name} (or "federation-upstream-set") starts the links.

import * as api from "../api.js";
import { clear, dangerButton, fmtJson, form, h, section, table } from "../ui.js";

// passwords in upstream URIs stay in the API, off the screen
export const redact = (text) => text.replace(/(amqps?:\/\/[^:/@"]*):[^@/"]*@/g, "$1:***@");

const NUMBERS = ["prefetch-count", "reconnect-delay", "max-hops", "expires", "message-ttl"];

export function upstreamsSection(ctx, vhosts) {
  const list = h("div", { id: "federation-upstreams" });
  const el = section("Upstreams", list, h("h3", {}, "Add an upstream"), form([
    { name: "vhost", label: "Virtual host", type: "select", options: vhosts },
    { name: "name", label: "Name", required: true },
    { name: "uri", label: "URI", required: true, placeholder: "amqp://user:password@server-name/vhost" },
    { name: "exchange", label: "Upstream exchange", help: "Empty: the federated exchange's own name." },
    { name: "queue", label: "Upstream queue", help: "Empty: the federated queue's own name." },
    { name: "ack-mode", label: "Ack mode", type: "select", options: ["on-confirm", "on-publish", "no-ack"] },
    { name: "max-hops", label: "Max hops", type: "number", value: "1" },
    { name: "prefetch-count", label: "Prefetch count", type: "number", value: "1000" },
    { name: "reconnect-delay", label: "Reconnect delay (s)", type: "number", value: "5" },
    { name: "expires", label: "Expires (ms)", type: "number", help: "Of the upstream's queue while the link is down; empty: never." },
    { name: "message-ttl", label: "Message TTL (ms)", type: "number" },
    { name: "trust-user-id", label: "Trust user-id", type: "checkbox" },
  ], "Add upstream", async (v) => {
    const value = { uri: v.uri, "ack-mode": v["ack-mode"], "trust-user-id": v["trust-user-id"] };
    for (const k of ["exchange", "queue"]) if (v[k]) value[k] = v[k];
    for (const k of NUMBERS) if (v[k] !== "") value[k] = Number(v[k]);
    await api.put(`/api/parameters/federation-upstream/${api.seg(v.vhost)}/${api.seg(v.name)}`, { value });
    await refresh();
    return `Upstream ${v.name} added.`;
  }, { id: "add-upstream" }));

  async function refresh() {
    const ups = await api.get("/api/parameters/federation-upstream");
    if (!ctx.live()) return;
    clear(list, table([
      { title: "Name", get: (u) => u.name, cls: "name" }, { title: "Virtual host", get: (u) => u.vhost },
      { title: "URI", get: (u) => redact(String((u.value || {}).uri || "")) },
      { title: "Definition", get: (u) => redact(fmtJson({ ...u.value, uri: undefined })) },
      { title: "", get: (u) => dangerButton("Delete", `Delete upstream ${u.name}? Its links stop.`, async () => {
        await api.del(`/api/parameters/federation-upstream/${api.seg(u.vhost)}/${api.seg(u.name)}`);
        await refresh();
        return `Upstream ${u.name} deleted.`;
      }) },
    ], ups, { id: "upstreams-table", empty: "No upstreams." }));
  }
  return { el, refresh };
}
