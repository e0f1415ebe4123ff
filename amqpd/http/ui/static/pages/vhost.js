// One virtual host (#/admin/vhosts/<name>, administrators): its messages, who may use it
// (set, clear), its limits, and deleting it.

import * as api from "../api.js";
import { add, clear, dangerButton, fmtJson, fmtNum, form, h, kv, link, section, table } from "../ui.js";
import { fetchOr404, is404, notFound, userHref } from "./common.js";

export async function render(ctx, name) {
  const base = `/api/vhosts/${api.seg(name)}`;
  const missing = `Virtual host "${name}" does not exist.`;
  const back = ["#/admin/vhosts", "Virtual hosts"];
  if (!(await fetchOr404(ctx, base, missing, back))) return;
  const users = (await api.get("/api/users?columns=name")).map((u) => u.name);
  const details = h("div", { id: "vhost-details" }), perms = h("div", { id: "vhost-permissions" });
  const limits = h("div", { id: "vhost-limits" });
  add(ctx.root, h("p", {}, link("#/admin/vhosts", "« Virtual hosts")), h("h1", {}, "Virtual host ", h("span", { class: "objname", id: "vhost-name" }, name)),
    section("Overview", details, h("p", {}, link(`#/queues`, "Queues"), " · ", link("#/exchanges", "Exchanges"), h("span", { class: "muted" }, " (choose this vhost in their lists)"))),
    section("Permissions", perms, form([
      { name: "user", label: "User", type: "select", options: users },
      { name: "configure", label: "Configure regexp", value: ".*" }, { name: "write", label: "Write regexp", value: ".*" },
      { name: "read", label: "Read regexp", value: ".*" },
    ], "Set permission", async (v) => {
      await api.put(`/api/permissions/${api.seg(name)}/${api.seg(v.user)}`, { configure: v.configure, write: v.write, read: v.read });
      await refresh();
      return `Permissions of ${v.user} set.`;
    }, { id: "set-vhost-permission" })),
    section("Limits", limits),
    name === "/" ? null : section("Delete this virtual host", dangerButton("Delete virtual host", `Delete vhost ${name} with all its queues and messages?`, async () => {
      await api.del(base);
      ctx.go("#/admin/vhosts", `Virtual host ${name} deleted.`);
    })));

  async function refresh() {
    let v, p, l;
    try {
      [v, p, l] = await Promise.all([api.get(base), api.get(`${base}/permissions`), api.get(`/api/vhost-limits/${api.seg(name)}`)]);
    } catch (exc) {
      if (is404(exc) && ctx.live()) { notFound(ctx, `${missing} It was deleted.`, back); return; }
      throw exc;
    }
    if (!ctx.live()) return;
    clear(details, kv([["Description", v.description], ["Tags", (v.tags || []).join(", ")],
      ["Default queue type", v.default_queue_type],
      ["Messages ready", h("span", { id: "vhost-ready" }, fmtNum(v.messages_ready))],
      ["Messages unacked", fmtNum(v.messages_unacknowledged)], ["Messages total", fmtNum(v.messages)]]));
    clear(perms, table([
      { title: "User", get: (x) => link(userHref(x.user), x.user) },
      { title: "Configure", get: (x) => x.configure }, { title: "Write", get: (x) => x.write }, { title: "Read", get: (x) => x.read },
      { title: "", get: (x) => dangerButton("Clear", null, async () => {
        await api.del(`/api/permissions/${api.seg(name)}/${api.seg(x.user)}`); await refresh(); return `Permissions of ${x.user} cleared.`;
      }) },
    ], p, { id: "vhost-permissions-table", empty: "No user may use this virtual host." }));
    clear(limits, table([{ title: "Limits", get: (x) => fmtJson(x.value) }], l, { empty: "No limits." }));
  }
  await ctx.every(refresh);
}
