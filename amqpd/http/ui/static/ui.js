// Small DOM helpers shared by the pages: element building, tables, forms, formatting.
// Text always goes in through textContent (never innerHTML): names of queues, users and
// message bodies are whatever clients chose, and must never become markup.

import { ApiError } from "./api.js";

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = !!v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// el.append that leaves out null, undefined and false (sections shown only to some users)
export function add(el, ...children) { append(el, children); return el; }

export function clear(el, ...children) { el.replaceChildren(); append(el, children); return el; }

export function link(href, text) { return h("a", { href }, text); }

const NUMBER = new Intl.NumberFormat("en-US");  // one formatter: toLocaleString makes one per call

export function fmtNum(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return "—";
  return NUMBER.format(Number(n));
}

export function fmtRate(details) {
  const r = details && typeof details.rate === "number" ? details.rate : 0;
  return `${r.toFixed(1)}/s`;
}

export function fmtBytes(n) {
  if (n === undefined || n === null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = Number(n);
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// a stream offset; "—" while the stream holds nothing (its last offset is -1)
export function fmtOffset(offset, last) {
  return last === undefined || last === null || last < 0 ? "—" : fmtNum(offset);
}

export function fmtDuration(ms) {
  let s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hh = Math.floor(s / 3600); s -= hh * 3600;
  const mm = Math.floor(s / 60); s -= mm * 60;
  return d ? `${d}d ${hh}h` : hh ? `${hh}h ${mm}m` : `${mm}m ${s}s`;
}

export function fmtJson(v) {
  if (v === undefined || v === null) return "";
  if (typeof v === "object" && Object.keys(v).length === 0) return "";
  return JSON.stringify(v);
}

// columns: [{title, get(row) -> Node|string, cls?, sort?: "api key"}]
export function table(columns, rows, { empty = "Nothing here.", sort, onSort, id } = {}) {
  const head = h("tr", {}, columns.map((c) => {
    if (!c.sort || !onSort) return h("th", { class: c.cls }, c.title);
    const active = sort && sort.key === c.sort;
    const arrow = active ? (sort.reverse ? " ▼" : " ▲") : "";
    return h("th", { class: `sortable ${c.cls || ""}`, dataset: { sort: c.sort },
      onclick: () => onSort(c.sort) }, c.title + arrow);
  }));
  const body = rows.length
    ? rows.map((r) => h("tr", {}, columns.map((c) => h("td", { class: c.cls }, c.get(r)))))
    : [h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, empty))];
  return h("table", { class: "list", id }, h("thead", {}, head), h("tbody", {}, body));
}

export function kv(pairs) {
  return h("table", { class: "kv" }, pairs.filter((p) => p).map(([k, v]) =>
    h("tr", {}, h("th", {}, k), h("td", {}, v === undefined || v === null || v === "" ? "—" : v))));
}

export function section(title, ...children) {
  return h("section", { class: "panel" }, h("h2", {}, title), ...children);
}

// a form whose submit runs `action(values)`; errors from the API appear under it
export function form(fields, submitText, action, { id } = {}) {
  const status = h("div", { class: "form-status" });
  const inputs = {};
  const rows = fields.map((f) => {
    let input;
    if (f.type === "select") {
      input = h("select", { name: f.name }, f.options.map((o) =>
        Array.isArray(o) ? h("option", { value: o[0] }, o[1]) : h("option", { value: o }, o)));
      if (f.value !== undefined) input.value = f.value;
    } else if (f.type === "textarea") {
      input = h("textarea", { name: f.name, rows: f.rows || 4, placeholder: f.placeholder }, f.value || "");
    } else if (f.type === "checkbox") {
      input = h("input", { type: "checkbox", name: f.name, checked: f.value });
    } else if (f.type === "file") {
      input = h("input", { type: "file", name: f.name, accept: f.accept });
    } else {
      input = h("input", { type: f.type || "text", name: f.name, value: f.value ?? "",
        placeholder: f.placeholder, autocomplete: f.autocomplete || "off", required: f.required });
    }
    inputs[f.name] = input;
    return h("label", { class: "field" }, h("span", {}, f.label), input, f.help ? h("small", { class: "muted" }, f.help) : null);
  });
  const button = h("button", { type: "submit" }, submitText);
  const el = h("form", { class: "form", id }, rows, h("div", { class: "actions" }, button), status);
  el.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const values = {};
    for (const [name, input] of Object.entries(inputs)) {
      values[name] = input.type === "checkbox" ? input.checked : input.type === "file" ? input.files[0] : input.value;
    }
    button.disabled = true;
    status.className = "form-status";
    status.textContent = "";
    try {
      const msg = await action(values);
      status.className = "form-status ok";
      status.textContent = msg || "Done.";
    } catch (exc) {
      status.className = "form-status error";
      status.textContent = describeError(exc);
    } finally {
      button.disabled = false;
    }
  });
  return el;
}

export function describeError(exc) {
  if (exc instanceof ApiError) return exc.describe();
  return exc && exc.message ? exc.message : String(exc);
}

// "x-max-length=10" lines or a JSON object -> an arguments object; numbers stay numbers
export function parseArgs(text) {
  const t = (text || "").trim();
  if (!t) return {};
  if (t.startsWith("{")) {
    try { return JSON.parse(t); } catch (exc) { throw new Error(`arguments: invalid JSON (${exc.message})`); }
  }
  const out = {};
  for (const line of t.split(/\n|,/)) {
    const s = line.trim();
    if (!s) continue;
    const i = s.indexOf("=");
    if (i < 1) throw new Error(`arguments: "${s}" is not key=value`);
    const k = s.slice(0, i).trim(), v = s.slice(i + 1).trim();
    out[k] = /^-?\d+(\.\d+)?$/.test(v) ? Number(v) : v === "true" ? true : v === "false" ? false : v;
  }
  return out;
}

export function button(text, onclick, { cls = "", title } = {}) {
  return h("button", { type: "button", class: cls, title, onclick }, text);
}

// the line under the header for news that outlives a page ("Queue q deleted."): a
// confirmation fades after 10 s, an error stays until dismissed
let flashTimer = null;
export function flash(text, cls = "error") {
  const el = document.getElementById("flash");
  clearTimeout(flashTimer);
  clear(el, h("span", { id: "flash-text" }, text), " ", button("dismiss", () => { el.hidden = true; }, { cls: "link" }));
  el.className = cls;
  el.hidden = !text;
  if (cls === "ok") flashTimer = setTimeout(() => { el.hidden = true; }, 10000);
}

// a button that asks first, runs `action`, and reports its outcome next to itself, or
// in the flash line when the action took the button away (a deleted row, another page)
export function dangerButton(text, question, action) {
  const status = h("span", { class: "form-status" });
  const b = button(text, async () => {
    if (question && !window.confirm(question)) return;
    b.disabled = true;
    try {
      const said = (await action()) || "";
      status.className = "form-status ok";
      status.textContent = said;
      if (said && !b.isConnected) flash(said, "ok");
    } catch (exc) {
      status.className = "form-status error";
      status.textContent = describeError(exc);
    } finally { b.disabled = false; }
  }, { cls: "danger" });
  return h("span", {}, b, " ", status);
}

// RabbitMQ's short names for well-known arguments in the features column
const SHORT_ARGS = {
  "alternate-exchange": "AE", "x-message-ttl": "TTL", "x-expires": "Exp", "x-max-length": "Lim",
  "x-max-length-bytes": "Lim B", "x-overflow": "Ovfl", "x-dead-letter-exchange": "DLX",
  "x-dead-letter-routing-key": "DLK", "x-max-priority": "Pri", "x-single-active-consumer": "SAC",
  "x-delivery-limit": "DlL", "x-queue-mode": "Mode", "x-queue-type": "Type",
};

// the features column of queues and exchanges: D(urable), AD (auto-delete), I(nternal),
// Excl(usive) and one flag per argument, its value in the tooltip
export function features(obj) {
  const flag = (text, title, cls = "feature") => h("abbr", { title, class: cls }, text);
  const f = [];
  if (obj.durable) f.push(flag("D", "durable"));
  if (obj.auto_delete) f.push(flag("AD", "auto-delete"));
  if (obj.internal) f.push(flag("I", "internal"));
  if (obj.exclusive) f.push(flag("Excl", "exclusive"));
  for (const [k, v] of Object.entries(obj.arguments || {})) {
    f.push(flag(SHORT_ARGS[k] || k.replace(/^x-/, ""), `${k}: ${JSON.stringify(v)}`, "feature arg"));
  }
  return f;
}

export function tagsOf(user) { return new Set(user ? user.tags : []); }
