// One user (#/admin/users/<name>, administrators): tags and password, permissions and
// topic permissions in each vhost (set, clear), limits, and deleting the user.

import * as api from "../api.js";
import { add, clear, dangerButton, fmtJson, form, h, kv, link, section, table } from "../ui.js";
import { fetchOr404, is404, notFound, vhostHref, vhostNames } from "./common.js";

export async function render(ctx, name) {
  const base = `/api/users/${api.seg(name)}`;
  const missing = `User "${name}" does not exist.`;
  const back = ["#/admin/users", "Users"];
  if (!(await fetchOr404(ctx, base, missing, back))) return;
  const vhosts = await vhostNames();
  const details = h("div", { id: "user-details" }), perms = h("div", { id: "user-permissions" });
  const topics = h("div", { id: "user-topic-permissions" }), limits = h("div", { id: "user-limits" });
  add(ctx.root, h("p", {}, link("#/admin/users", "« Users")), h("h1", {}, "User ", h("span", { class: "objname", id: "user-name" }, name)),
    section("Details", details, form([
      { name: "tags", label: "Tags", help: "Comma-separated: administrator, monitoring, policymaker, management." },
      { name: "password", label: "New password", type: "password", autocomplete: "new-password", help: "Leave empty to keep the password." },
    ], "Update user", async (v) => {
      const body = { tags: v.tags };
      if (v.password) body.password = v.password;
      await api.put(base, body);
      ctx.root.querySelector("#update-user [name=password]").value = "";
      await refresh();
      return `User ${name} updated.`;
    }, { id: "update-user" })),
    section("Permissions", perms, form([
      { name: "vhost", label: "Virtual host", type: "select", options: vhosts },
      { name: "configure", label: "Configure regexp", value: ".*" }, { name: "write", label: "Write regexp", value: ".*" },
      { name: "read", label: "Read regexp", value: ".*" },
    ], "Set permission", async (v) => {
      await api.put(`/api/permissions/${api.seg(v.vhost)}/${api.seg(name)}`, { configure: v.configure, write: v.write, read: v.read });
      await refresh();
      return `Permissions in ${v.vhost} set.`;
    }, { id: "set-user-permission" })),
    section("Topic permissions", topics),
    section("Limits", limits),
    name === ctx.me.name ? null : section("Delete this user", dangerButton("Delete user", `Delete user ${name}?`, async () => {
      await api.del(base);
      ctx.go("#/admin/users", `User ${name} deleted.`);
    })));

  async function refresh() {
    let user, p, t, l;
    try {
      [user, p, t, l] = await Promise.all([api.get(base), api.get(`${base}/permissions`),
        api.get(`${base}/topic-permissions`), api.get(`/api/user-limits/${api.seg(name)}`)]);
    } catch (exc) {
      if (is404(exc) && ctx.live()) { notFound(ctx, `${missing} It was deleted.`, back); return; }
      throw exc;
    }
    if (!ctx.live()) return;
    clear(details, kv([["Tags", user.tags.join(", ") || "none"], ["Has password", user.password_hash ? "yes" : "no"],
      ["Hashing", user.hashing_algorithm]]));
    const tags = ctx.root.querySelector("#update-user [name=tags]");
    if (tags && document.activeElement !== tags) tags.value = user.tags.join(", ");
    clear(perms, table([
      { title: "Virtual host", get: (x) => link(vhostHref(x.vhost), x.vhost) },
      { title: "Configure", get: (x) => x.configure }, { title: "Write", get: (x) => x.write }, { title: "Read", get: (x) => x.read },
      { title: "", get: (x) => dangerButton("Clear", null, async () => {
        await api.del(`/api/permissions/${api.seg(x.vhost)}/${api.seg(name)}`); await refresh(); return `Permissions in ${x.vhost} cleared.`;
      }) },
    ], p, { id: "user-permissions-table", empty: "No permissions: this user can use no virtual host." }));
    clear(topics, table([
      { title: "Virtual host", get: (x) => x.vhost }, { title: "Exchange", get: (x) => x.exchange },
      { title: "Write", get: (x) => x.write }, { title: "Read", get: (x) => x.read },
    ], t, { empty: "No topic permissions." }));
    clear(limits, table([{ title: "Limits", get: (x) => fmtJson(x.value) }], l, { empty: "No limits." }));
  }
  await ctx.every(refresh);
}
