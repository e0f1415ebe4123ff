// Shovels (the shovel plugin): status of each, restart or delete, and adding a dynamic one.

import * as api from "../api.js";
import { add, clear, dangerButton, form, h, section, table } from "../ui.js";
import { vhostNames } from "./common.js";

export async function render(ctx) {
  const names = await vhostNames();
  const list = h("div", { id: "shovels-list" });
  add(ctx.root, h("h1", {}, "Shovels"), list,
    ctx.me.policymaker ? section("Add a dynamic shovel", h("p", { class: "muted" }, "A URI without a host (amqp:// or amqp:///vhost) is this broker."), form([
      { name: "vhost", label: "Virtual host", type: "select", options: names }, { name: "name", label: "Name", required: true },
      { name: "src-uri", label: "Source URI", value: "amqp://" }, { name: "src-queue", label: "Source queue", required: true },
      { name: "dest-uri", label: "Destination URI", value: "amqp://" }, { name: "dest-queue", label: "Destination queue", required: true },
      { name: "ack-mode", label: "Ack mode", type: "select", options: ["on-confirm", "on-publish", "no-ack"] },
      { name: "src-delete-after", label: "Delete after", type: "select", options: ["never", "queue-length"] },
    ], "Add shovel", async (v) => {
      const value = { ...v };
      delete value.vhost; delete value.name;
      await api.put(`/api/parameters/shovel/${api.seg(v.vhost)}/${api.seg(v.name)}`, { value });
      return `Shovel ${v.name} added.`;
    }, { id: "add-shovel" })) : null);
  await ctx.every(async () => {
    const items = await api.get("/api/shovels");
    if (!ctx.live()) return;
    clear(list, table([
      { title: "Name", get: (s) => s.name, cls: "name" }, { title: "Node", get: (s) => s.node || "" }, { title: "Virtual host", get: (s) => s.vhost },
      { title: "Type", get: (s) => s.type }, { title: "State", get: (s) => h("span", { class: `state ${s.state}` }, s.state + (s.reason ? ` (${s.reason})` : "")) },
      { title: "Source", get: (s) => `${s.src_uri || ""} ${s.src_queue !== undefined ? `queue ${s.src_queue}` : `exchange ${s.src_exchange}`}` },
      { title: "Destination", get: (s) => `${s.dest_uri || ""} ${s.dest_queue !== undefined ? `queue ${s.dest_queue}` : `exchange ${s.dest_exchange || ""}`}` },
      { title: "Since", get: (s) => s.timestamp },
      { title: "", get: (s) => (s.type === "dynamic" && ctx.me.policymaker ? [
        dangerButton("Restart", null, () => api.del(`/api/shovels/vhost/${api.seg(s.vhost)}/${api.seg(s.name)}/restart`).then(() => "Restarting.")),
        dangerButton("Delete", `Delete shovel ${s.name}?`, () => api.del(`/api/shovels/vhost/${api.seg(s.vhost)}/${api.seg(s.name)}`).then(() => `Shovel ${s.name} deleted.`)),
      ] : "") },
    ], items, { id: "shovels-table", empty: "No shovels." }));
  });
}
