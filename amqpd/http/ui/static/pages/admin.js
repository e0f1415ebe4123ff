// Admin: users, virtual hosts, permissions, topic permissions, policies, operator policies
// and limits; a user's and a virtual host's own pages are user.js and vhost.js.
// Administrators see every tab; policymakers see policies only (as in RabbitMQ's UI).
// Every tab refreshes at the chosen interval, like the other pages.

import * as api from "../api.js";
import { add, clear, dangerButton, describeError, fmtJson, fmtNum, form, h, link, parseArgs, section, table } from "../ui.js";
import { userHref, vhostHref } from "./common.js";

const TABS = [
  ["users", "Users", (me) => me.admin], ["vhosts", "Virtual hosts", (me) => me.admin],
  ["permissions", "Permissions", (me) => me.admin], ["topic-permissions", "Topic permissions", (me) => me.admin],
  ["policies", "Policies", (me) => me.policymaker], ["operator-policies", "Operator policies", (me) => me.admin],
  ["limits", "Limits", (me) => me.admin],
];

export async function render(ctx) {
  const tabs = TABS.filter(([, , can]) => can(ctx.me));
  const current = tabs.find(([k]) => k === ctx.params[0]) || tabs[0];
  if (ctx.params[1] && ctx.me.admin && (current[0] === "users" || current[0] === "vhosts")) {
    return (await import(current[0] === "users" ? "./user.js" : "./vhost.js")).render(ctx, ctx.params[1]);
  }
  add(ctx.root, h("h1", {}, "Admin"), h("nav", { class: "tabs" }, tabs.map(([k, label]) =>
    h("a", { href: `#/admin/${k}`, class: k === current[0] ? "active" : "", id: `tab-${k}` }, label))));
  const body = h("div", { id: `admin-${current[0]}` });
  add(ctx.root, body);
  await RENDER[current[0]](ctx, body);
}

const names = async (path) => (await api.get(`${path}?columns=name`)).map((x) => x.name);

const RENDER = {
  async users(ctx, body) {
    const list = h("div");
    body.append(section("Users", list), section("Add or update a user", form([
      { name: "name", label: "Username", required: true },
      { name: "password", label: "Password", type: "password", autocomplete: "new-password", help: "Leave empty when updating tags only." },
      { name: "tags", label: "Tags", placeholder: "administrator, monitoring, policymaker, management", help: "Comma-separated." },
    ], "Save user", async (v) => {
      const payload = { tags: v.tags };
      if (v.password) payload.password = v.password;
      await api.put(`/api/users/${api.seg(v.name)}`, payload);
      body.querySelector("#add-user [name=password]").value = "";  // not left in the page
      await refresh();
      return `User ${v.name} saved.`;
    }, { id: "add-user" })));
    async function refresh() {
      const [users, perms] = await Promise.all([api.get("/api/users"), api.get("/api/permissions")]);
      clear(list, table([
        { title: "Name", get: (u) => link(userHref(u.name), u.name), cls: "name" },
        { title: "Tags", get: (u) => u.tags.join(", ") },
        { title: "Can access vhosts", get: (u) => perms.filter((p) => p.user === u.name).map((p) => p.vhost).join(", ") || "none" },
        { title: "Has password", get: (u) => (u.password_hash ? "yes" : "no") },
        { title: "", get: (u) => (u.name === ctx.me.name ? "(you)" : dangerButton("Delete", `Delete user ${u.name}?`, async () => { await api.del(`/api/users/${api.seg(u.name)}`); await refresh(); return `User ${u.name} deleted.`; })) },
      ], users, { id: "users-table" }));
    }
    await ctx.every(refresh);
  },

  async vhosts(ctx, body) {
    const list = h("div");
    body.append(section("Virtual hosts", list), section("Add a virtual host", form([
      { name: "name", label: "Name", required: true }, { name: "description", label: "Description" },
      { name: "tags", label: "Tags", placeholder: "comma-separated" },
    ], "Add vhost", async (v) => {
      await api.put(`/api/vhosts/${api.seg(v.name)}`, { description: v.description, tags: v.tags });
      await refresh();
      return `Virtual host ${v.name} added (remember to give users permissions in it).`;
    }, { id: "add-vhost" })));
    async function refresh() {
      const vhosts = await api.get("/api/vhosts");
      clear(list, table([
        { title: "Name", get: (v) => link(vhostHref(v.name), v.name), cls: "name" }, { title: "Description", get: (v) => v.description },
        { title: "Tags", get: (v) => (v.tags || []).join(", ") },
        { title: "Ready", get: (v) => fmtNum(v.messages_ready), cls: "num" }, { title: "Unacked", get: (v) => fmtNum(v.messages_unacknowledged), cls: "num" },
        { title: "", get: (v) => (v.name === "/" ? "" : dangerButton("Delete", `Delete vhost ${v.name} with all its queues and messages?`, async () => { await api.del(`/api/vhosts/${api.seg(v.name)}`); await refresh(); return `Virtual host ${v.name} deleted.`; })) },
      ], vhosts, { id: "vhosts-table" }));
    }
    await ctx.every(refresh);
  },

  async permissions(ctx, body) {
    const [users, vhosts] = await Promise.all([names("/api/users"), names("/api/vhosts")]);
    const list = h("div");
    body.append(section("Permissions", list), section("Set permission", form([
      { name: "user", label: "User", type: "select", options: users }, { name: "vhost", label: "Virtual host", type: "select", options: vhosts },
      { name: "configure", label: "Configure regexp", value: ".*" }, { name: "write", label: "Write regexp", value: ".*" },
      { name: "read", label: "Read regexp", value: ".*" },
    ], "Set permission", async (v) => {
      await api.put(`/api/permissions/${api.seg(v.vhost)}/${api.seg(v.user)}`, { configure: v.configure, write: v.write, read: v.read });
      await refresh();
      return `Permissions of ${v.user} in ${v.vhost} set.`;
    }, { id: "set-permission" })));
    async function refresh() {
      const perms = await api.get("/api/permissions");
      clear(list, table([
        { title: "User", get: (p) => p.user }, { title: "Virtual host", get: (p) => p.vhost },
        { title: "Configure", get: (p) => p.configure }, { title: "Write", get: (p) => p.write }, { title: "Read", get: (p) => p.read },
        { title: "", get: (p) => dangerButton("Clear", null, async () => { await api.del(`/api/permissions/${api.seg(p.vhost)}/${api.seg(p.user)}`); await refresh(); return `Permissions of ${p.user} in ${p.vhost} cleared.`; }) },
      ], perms, { id: "permissions-table" }));
    }
    await ctx.every(refresh);
  },

  async "topic-permissions"(ctx, body) {
    const [users, vhosts] = await Promise.all([names("/api/users"), names("/api/vhosts")]);
    const list = h("div");
    body.append(section("Topic permissions", list), section("Set topic permission", form([
      { name: "user", label: "User", type: "select", options: users }, { name: "vhost", label: "Virtual host", type: "select", options: vhosts },
      { name: "exchange", label: "Exchange", value: "amq.topic" },
      { name: "write", label: "Write regexp", value: ".*" }, { name: "read", label: "Read regexp", value: ".*" },
    ], "Set topic permission", async (v) => {
      await api.put(`/api/topic-permissions/${api.seg(v.vhost)}/${api.seg(v.user)}`, { exchange: v.exchange, write: v.write, read: v.read });
      await refresh();
      return "Topic permission set.";
    }, { id: "set-topic-permission" })));
    async function refresh() {
      const perms = await api.get("/api/topic-permissions");
      clear(list, table([
        { title: "User", get: (p) => p.user }, { title: "Virtual host", get: (p) => p.vhost }, { title: "Exchange", get: (p) => p.exchange },
        { title: "Write", get: (p) => p.write }, { title: "Read", get: (p) => p.read },
        { title: "", get: (p) => dangerButton("Clear", null, async () => { await api.del(`/api/topic-permissions/${api.seg(p.vhost)}/${api.seg(p.user)}/${api.seg(p.exchange)}`); await refresh(); return "Topic permission cleared."; }) },
      ], perms, { id: "topic-permissions-table" }));
    }
    await ctx.every(refresh);
  },

  policies: (ctx, body) => policyTab(ctx, body, POLICY_KINDS.policies),
  "operator-policies": (ctx, body) => policyTab(ctx, body, POLICY_KINDS.operator),

  async limits(ctx, body) {
    const [users, vhosts] = await Promise.all([names("/api/users"), names("/api/vhosts")]);
    const vlist = h("div"), ulist = h("div");
    body.append(
      section("Virtual host limits", vlist, form([
        { name: "vhost", label: "Virtual host", type: "select", options: vhosts },
        { name: "limit", label: "Limit", type: "select", options: ["max-connections", "max-queues"] },
        { name: "value", label: "Value", type: "number", help: "-1 for no limit" },
      ], "Set limit", async (v) => {
        await api.put(`/api/vhost-limits/${api.seg(v.vhost)}/${v.limit}`, { value: Number(v.value) });
        await refresh();
        return "Limit set.";
      }, { id: "set-vhost-limit" })),
      section("User limits", ulist, form([
        { name: "user", label: "User", type: "select", options: users },
        { name: "limit", label: "Limit", type: "select", options: ["max-connections", "max-channels"] },
        { name: "value", label: "Value", type: "number", help: "-1 for no limit" },
      ], "Set limit", async (v) => {
        await api.put(`/api/user-limits/${api.seg(v.user)}/${v.limit}`, { value: Number(v.value) });
        await refresh();
        return "Limit set.";
      }, { id: "set-user-limit" })));
    const limitRows = (items, key, path) => items.flatMap((it) => Object.entries(it.value || {}).map(([limit, value]) => ({ who: it[key], limit, value, path })));
    async function show(el, path, key) {
      try {
        const rows = limitRows(await api.get(path), key, path);
        clear(el, table([{ title: key === "vhost" ? "Virtual host" : "User", get: (r) => r.who }, { title: "Limit", get: (r) => r.limit },
          { title: "Value", get: (r) => String(r.value) },
          { title: "", get: (r) => dangerButton("Clear", null, async () => { await api.del(`${path}/${api.seg(r.who)}/${r.limit}`); await refresh(); return `Limit ${r.limit} of ${r.who} cleared.`; }) },
        ], rows, { empty: "No limits set." }));
      } catch (exc) {
        const missing = exc instanceof api.ApiError && exc.status === 404;
        clear(el, h("div", { class: "form-status error" }, missing
          ? `This broker does not offer limits here yet (GET ${path} answered 404).` : describeError(exc)));
      }
    }
    async function refresh() { await Promise.all([show(vlist, "/api/vhost-limits", "vhost"), show(ulist, "/api/user-limits", "user")]); }
    await ctx.every(refresh);
  },
};

// user policies, and operator policies (administrators' limits on queues, which win over
// a user policy's looser value: RabbitMQ 3.10 lets them apply to queues only)
const POLICY_KINDS = {
  policies: { path: "/api/policies", title: "Policies", noun: "Policy", id: "policy", table: "policies-table",
    heading: "Add or update a policy",
    applyTo: [["all", "Exchanges and queues"], ["queues", "Queues"], ["exchanges", "Exchanges"]],
    example: "max-length=1000\nmessage-ttl=60000 (key=value lines or JSON)" },
  operator: { path: "/api/operator-policies", title: "Operator policies", noun: "Operator policy", id: "operator-policy",
    table: "operator-policies-table", applyTo: [["queues", "Queues"]], heading: "Add or update an operator policy",
    example: "max-length=100000\nexpires=86400000 (key=value lines or JSON)" },
};

async function policyTab(ctx, body, kind) {
  const vhosts = await names("/api/vhosts");
  const list = h("div");
  body.append(section(kind.title, list), section(kind.heading, form([
    { name: "vhost", label: "Virtual host", type: "select", options: vhosts }, { name: "name", label: "Name", required: true },
    { name: "pattern", label: "Pattern", placeholder: "^amq\\.", required: true },
    { name: "apply-to", label: "Apply to", type: "select", options: kind.applyTo },
    { name: "priority", label: "Priority", type: "number", value: "0" },
    { name: "definition", label: "Definition", type: "textarea", rows: 3, placeholder: kind.example, required: true },
  ], `Save ${kind.noun.toLowerCase()}`, async (v) => {
    await api.put(`${kind.path}/${api.seg(v.vhost)}/${api.seg(v.name)}`,
      { pattern: v.pattern, "apply-to": v["apply-to"], priority: Number(v.priority || 0), definition: parseArgs(v.definition) });
    await refresh();
    return `${kind.noun} ${v.name} saved.`;
  }, { id: `add-${kind.id}` })));
  async function refresh() {
    const pols = await api.get(kind.path);
    if (!ctx.live()) return;
    clear(list, table([
      { title: "Virtual host", get: (p) => p.vhost }, { title: "Name", get: (p) => p.name, cls: "name" },
      { title: "Pattern", get: (p) => p.pattern }, { title: "Apply to", get: (p) => p["apply-to"] },
      { title: "Definition", get: (p) => fmtJson(p.definition) }, { title: "Priority", get: (p) => String(p.priority) },
      { title: "", get: (p) => dangerButton("Delete", `Delete ${kind.noun.toLowerCase()} ${p.name}?`, async () => {
        await api.del(`${kind.path}/${api.seg(p.vhost)}/${api.seg(p.name)}`); await refresh(); return `${kind.noun} ${p.name} deleted.`;
      }) },
    ], pols, { id: kind.table }));
  }
  await ctx.every(refresh);
}
