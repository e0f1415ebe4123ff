// The management UI's shell: login, navigation (#/path routes), the connection banner,
// and the refresh loop each page registers with `ctx.every` (at the interval chosen in the
// header, remembered by the browser, with the time of the last refresh beside it).
//
// Who may see what follows the user's tags as RabbitMQ's UI does: management users see
// their vhosts' objects; policymaker adds policies; monitoring adds every vhost and the
// node's figures; administrator adds users, vhosts, permissions, limits and definitions.
// The server enforces the same rules; the UI only leaves out what would be refused.

import * as api from "./api.js";
import { button, clear, describeError, flash, form, h } from "./ui.js";

const PAGES = [
  // [route prefix, module, nav label, who sees it]
  ["", "overview", "Overview", () => true],
  ["connections", "connections", "Connections", () => true],
  ["channels", "channels", "Channels", () => true],
  ["exchanges", "exchanges", "Exchanges", () => true],
  ["queues", "queues", "Queues", () => true],
  ["admin", "admin", "Admin", (me) => me.admin || me.policymaker],
  ["definitions", "definitions", "Definitions", (me) => me.admin],
  ["nodes", "nodes", "Nodes", (me) => me.monitor],
  ["shovels", "shovels", "Shovels", (me, plugins) => plugins.includes("shovel")],
  ["federation", "federation", "Federation", (me, plugins) => plugins.includes("federation")],
  ["streams", "streams", "Streams", (me, plugins) => plugins.includes("stream")],
];

// how often open pages redraw (RabbitMQ's UI: one choice for every page, 5 s by default)
const INTERVALS = [[2000, "2 s"], [5000, "5 s"], [10000, "10 s"], [30000, "30 s"], [0, "off"]];
const savedInterval = Number(localStorage.getItem("amqpd-refresh-ms") ?? 5000);
const state = {
  me: null, plugins: [], overview: null, timers: [], ticks: [], generation: 0, heartbeat: null,
  interval: INTERVALS.some(([ms]) => ms === savedInterval) ? savedInterval : 5000,
};
const page = () => document.getElementById("page");

function who(user) {
  const tags = new Set(user.tags);
  return {
    name: user.name, tags: user.tags,
    admin: tags.has("administrator"),
    monitor: tags.has("administrator") || tags.has("monitoring"),
    policymaker: tags.has("administrator") || tags.has("policymaker"),
  };
}

// ---------------------------------------------------------------- banner and flash
let upTimer = null;
function banner(text, cls) {
  const el = document.getElementById("status");
  if (!text) { el.hidden = true; return; }
  el.className = cls;
  el.textContent = text;
  el.hidden = false;
}

api.on("down", () => {
  clearTimeout(upTimer);
  banner(`Lost contact with the broker at ${new Date().toLocaleTimeString()}; retrying every few seconds...`, "warn");
  document.body.classList.add("offline");
});
api.on("up", (seconds) => {
  document.body.classList.remove("offline");
  banner(`Reconnected to the broker after ${seconds} s away (it may have restarted); the page is live again.`, "ok");
  clearTimeout(upTimer);
  upTimer = setTimeout(() => banner(null), 15000);
  route();  // redraw the page from fresh data
});
api.on("unauthorised", (reason) => {
  if (state.me) showLogin(`Your session ended (${reason}); please log in again.`);
});

// ---------------------------------------------------------------- login
function showLogin(message) {
  stopTimers();
  state.me = null;
  clear(document.getElementById("nav"));
  clear(document.getElementById("whoami"));
  const f = form([
    { name: "username", label: "Username", autocomplete: "username", required: true },
    { name: "password", label: "Password", type: "password", autocomplete: "current-password" },
  ], "Log in", async (v) => {
    const user = await api.post("/api/login", { username: v.username, password: v.password });
    await start(user);
    return "Logged in.";
  }, { id: "login-form" });
  clear(page(), h("section", { class: "panel login" }, h("h1", {}, "Log in to amqpd"),
    message ? h("p", { class: "form-status error" }, message) : null, f,
    h("p", { class: "muted" }, "Users of the broker with a management tag may log in. The password is sent once; a session cookie the page cannot read stands for it afterwards.")));
  f.querySelector("input").focus();
}

async function logout() {
  try { await api.post("/api/logout"); } catch (exc) { /* ends locally anyway */ }
  showLogin("Logged out.");
}

// ---------------------------------------------------------------- navigation
function renderNav() {
  const nav = document.getElementById("nav");
  const current = location.hash.replace(/^#\/?/, "").split("/")[0];
  clear(nav, PAGES.filter(([, , , can]) => can(state.me, state.plugins)).map(([prefix, , label]) =>
    h("a", { href: `#/${prefix}`, class: prefix === current ? "active" : "", id: `nav-${prefix || "overview"}` }, label)));
  const pick = h("select", { id: "refresh-interval", title: "how often this page redraws", onchange: () => {
    state.interval = Number(pick.value);
    localStorage.setItem("amqpd-refresh-ms", String(state.interval));
    startTimers();
  } }, INTERVALS.map(([ms, label]) => h("option", { value: ms }, `Refresh: ${label}`)));
  pick.value = String(state.interval);
  clear(document.getElementById("refresh"), pick, " ", h("span", { id: "last-refreshed", class: "muted" }));
  clear(document.getElementById("whoami"), h("span", { title: state.me.tags.join(", ") || "no tags" },
    `${state.me.name} (${state.me.tags.join(", ")})`), " ", button("Log out", logout, { cls: "link", title: "end this session" }));
  document.getElementById("cluster-name").textContent = state.overview ? state.overview.cluster_name : "";
}

function stopTimers() {
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  state.ticks = [];
  state.generation++;
}

// (re)start the current page's refreshes at the chosen interval
function startTimers() {
  for (const t of state.timers) clearInterval(t);
  state.timers = state.interval ? state.ticks.map((tick) => setInterval(tick, state.interval)) : [];
}

function refreshed() {
  const el = document.getElementById("last-refreshed");
  if (el) el.textContent = `Last refreshed ${new Date().toLocaleTimeString([], { hour12: false })}`;
}

async function route() {
  if (!state.me) return;
  stopTimers();
  const generation = state.generation;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const entry = PAGES.find(([prefix, , , can]) => prefix === (parts[0] || "") && can(state.me, state.plugins));
  renderNav();
  const root = page();
  if (!entry) { clear(root, h("p", {}, "No such page. "), h("a", { href: "#/" }, "Overview")); return; }
  const ctx = {
    root, me: state.me, plugins: state.plugins, params: parts.slice(1),
    overview: state.overview,
    // run fn now, and again at the chosen refresh interval while this page stays open
    every(fn) {
      let busy = false;  // a slow answer must not overlap (and be overtaken by) the next
      const tick = async () => {
        if (generation !== state.generation || busy) return;
        busy = true;
        try { await fn(); refreshed(); } catch (exc) {
          if (!(exc instanceof api.NetworkError)) console.warn(exc);
        } finally { busy = false; }
      };
      state.ticks.push(tick);
      if (state.interval) state.timers.push(setInterval(tick, state.interval));
      return tick();
    },
    live: () => generation === state.generation,
    // another page, with news for the flash line ("Queue q deleted.")
    go(hash, news) { if (news) flash(news, "ok"); location.hash = hash; },
  };
  try {
    const mod = await import(`./pages/${entry[1]}.js`);
    if (generation !== state.generation) return;
    clear(root);
    await mod.render(ctx);
  } catch (exc) {
    if (generation !== state.generation) return;
    clear(root, h("div", { class: "panel form-status error" }, `This page could not be shown: ${describeError(exc)}`));
  }
}

// a warren standby says so on every page, and where the active (which takes the
// clients, and whose pages show them) is
function roleBanner(repl, node) {
  const el = document.getElementById("role-banner");
  if (!repl || repl.role === "active" || !repl.role) { el.hidden = true; return; }
  const active = repl.active_node || "unknown";
  const where = repl.active_http
    ? ["Its management UI: ", h("a", { href: `${location.protocol}//${repl.active_http}/`, id: "active-link" }, `${repl.active_node || "the active"} at ${repl.active_http}`), "."]
    : repl.active_replication ? [`The active replicates from ${repl.active_replication}; open the management UI on that host.`] : [];
  clear(el, h("strong", {}, `This node (${node}) is a ${repl.role === "standby" ? "standby" : `warren node in role "${repl.role}"`}`),
    `, not the active node (${active}). It takes no client connections and its pages do not show the active's queues and connections. `, ...where);
  el.className = "warn";
  el.hidden = false;
}

async function refreshOverview() {
  try {
    state.overview = await api.get("/api/overview");
    roleBanner(state.overview.amqpd_replication, state.overview.node);
    // the pages to offer: the enabled plugins', and "stream" while the stream protocol
    // listener runs (its clients' page)
    const streamOn = (state.overview.listeners || []).some((l) => l.protocol === "stream");
    const plugins = [...(state.overview.amqpd_plugins || []), ...(streamOn ? ["stream"] : [])];
    if (plugins.join() !== state.plugins.join()) { state.plugins = plugins; renderNav(); }
  } catch (exc) { /* the banner says it when the broker is away */ }
}

async function start(user) {
  state.me = who(user);
  await refreshOverview();
  // the heartbeat: notices a broker that went away (or came back) within two seconds,
  // even on pages that do not poll; the overview (plugins, cluster name) every 30 s
  if (!state.heartbeat) {
    let beats = 0;
    state.heartbeat = setInterval(() => {
      if (!state.me) return;
      if (++beats % 15 === 0) refreshOverview();
      else api.get("/api/whoami").catch(() => { /* the banner says it */ });
    }, 2000);
  }
  if (location.hash.startsWith("#/login")) location.hash = "#/";
  route();
}

window.addEventListener("hashchange", route);

(async function boot() {
  try {
    const user = await api.get("/api/whoami", { quiet401: true });
    await start(user);
  } catch (exc) {
    if (exc instanceof api.ApiError && exc.status === 401) showLogin();
    else {
      clear(page(), h("p", { class: "form-status error" }, `Cannot reach the broker: ${describeError(exc)}. Retrying...`));
      setTimeout(boot, 3000);
    }
  }
})();
