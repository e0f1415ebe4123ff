// Pieces several pages share: the vhost picker, the pager, links to objects.

import * as api from "../api.js";
import { button, clear, fmtNum, h, kv, section } from "../ui.js";

export async function vhostNames() {
  const vhosts = await api.get("/api/vhosts?columns=name");
  return vhosts.map((v) => v.name);
}

export function vhostSelect(names, value, onchange, { all = true, id } = {}) {
  const sel = h("select", { id, onchange: () => onchange(sel.value) },
    all ? h("option", { value: "" }, "All vhosts") : null,
    names.map((n) => h("option", { value: n }, n)));
  sel.value = value || (all ? "" : names[0] || "/");
  return sel;
}

export function queueHref(vhost, name) { return `#/queues/${api.seg(vhost)}/${api.seg(name)}`; }
export function exchangeHref(vhost, name) { return `#/exchanges/${api.seg(vhost)}/${api.seg(name || "amq.default")}`; }
export function connectionHref(name) { return `#/connections/${api.seg(name)}`; }
export function channelHref(name) { return `#/channels/${api.seg(name)}`; }
export function userHref(name) { return `#/admin/users/${api.seg(name)}`; }
export function vhostHref(name) { return `#/admin/vhosts/${api.seg(name)}`; }

// a RabbitMQ paged answer -> "page x of y" and buttons; onPage(n) asks for another page
export function pager(res, onPage, { id = "pager" } = {}) {
  const last = Math.max(res.page_count, 1);
  return h("div", { class: "pager", id },
    button("« first", () => onPage(1), { cls: "small" }),
    button("‹ prev", () => onPage(Math.max(res.page - 1, 1)), { cls: "small" }),
    h("span", { class: "page-info" }, `Page ${res.page} of ${last} · `,
      h("span", { class: "filtered-count" }, fmtNum(res.filtered_count)),
      ` matching of ${fmtNum(res.total_count)}`),
    button("next ›", () => onPage(Math.min(res.page + 1, last)), { cls: "small", title: "next page" }),
    button("last »", () => onPage(last), { cls: "small" }));
}

// a filter box that calls back 300 ms after the last keystroke
export function filterBox(value, regex, onchange, { placeholder = "Filter by name" } = {}) {
  let timer = null;
  const input = h("input", { type: "search", placeholder, value, id: "filter", oninput: () => {
    clearTimeout(timer);
    timer = setTimeout(() => onchange(input.value, check.checked), 300);
  } });
  const check = h("input", { type: "checkbox", id: "filter-regex", checked: regex, onchange: () => onchange(input.value, check.checked) });
  return h("span", { class: "filter" }, input, h("label", {}, check, " regex"));
}

export function errorBox(el, exc, describe) { clear(el, h("div", { class: "form-status error" }, describe(exc))); }

export const is404 = (exc) => exc instanceof api.ApiError && exc.status === 404;

// the page of an object that is not there (any more): says so, with no forms to use on it
export function notFound(ctx, text, [href, label]) {
  clear(ctx.root, h("p", {}, h("a", { href }, `« ${label}`)),
    h("section", { class: "panel not-found", id: "not-found" }, h("h1", {}, "Not found"),
      h("p", {}, text), h("p", { class: "muted" }, "The broker answered 404 (Object Not Found).")));
}

// GET the object a page shows; null, with the not-found page drawn, when it is missing
export async function fetchOr404(ctx, path, text, back) {
  try { return await api.get(path); } catch (exc) {
    if (!is404(exc)) throw exc;
    notFound(ctx, text, back);
    return null;
  }
}

// "Columns": a checkbox per optional column (RabbitMQ's "+/-"), remembered by the browser
// under `key`; `chosen()` is the set of titles to show
export function columnChooser(key, titles, defaults, onchange) {
  let saved = null;
  try { saved = JSON.parse(localStorage.getItem(key) || "null"); } catch (exc) { saved = null; }
  const shown = new Set(Array.isArray(saved) ? saved : defaults);
  const boxes = titles.map((t) => h("label", { class: "choice" }, h("input", { type: "checkbox", checked: shown.has(t), dataset: { column: t }, onchange: (ev) => {
    if (ev.target.checked) shown.add(t); else shown.delete(t);
    localStorage.setItem(key, JSON.stringify([...shown]));
    onchange();
  } }), ` ${t}`));
  const el = h("details", { class: "columns", id: "column-chooser" }, h("summary", {}, "Columns"), h("div", {}, boxes));
  return { el, chosen: () => shown };
}

// The deduplication cache of an x-message-deduplication exchange or of a queue with
// x-message-deduplication (the API's "deduplication" object, docs/dedup.md): a panel
// that stays hidden on every other exchange and queue. set(obj) after each refresh.
export function dedupPanel() {
  const box = h("div", { id: "dedup-details" });
  const panel = section("Deduplication cache", box);
  panel.hidden = true;
  const set = (obj) => {
    const d = obj.deduplication;
    panel.hidden = !d;
    if (!d) return;
    const exchange = "cache_persistence" in d;
    clear(box, kv([
      ["Entries", h("span", { id: "dedup-entries" }, fmtNum(d.cache_entries))],
      ["Size", h("span", { id: "dedup-size" }, exchange ? `at most ${fmtNum(d.cache_size)}` : "the values of the messages in the queue")],
      exchange ? ["TTL", d.cache_ttl == null ? "none: a value stays until evicted" : `${fmtNum(d.cache_ttl)} ms`] : null,
      exchange ? ["Persistence", d.cache_persistence] : null,
      exchange ? ["Kept", h("span", { id: "dedup-scope" }, d.cache_scope === "cluster" ? "for the whole cluster (etcd)" : "on this node")] : null,
      d.cache_scope === "cluster" ? ["Entries in the cluster", d.cluster_entries == null ? "not counted yet" : fmtNum(d.cluster_entries)] : null,
      ["Duplicates dropped", h("span", { id: "dedup-duplicates" }, fmtNum(d.duplicates))],
    ]));
  };
  return { panel, set };
}
