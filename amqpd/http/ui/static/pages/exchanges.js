// Exchanges: the list, paged and filtered by the server (RabbitMQ's page, page_size, name,
// use_regex), with each one's message rates in and out and a form to add one; and an
// exchange's page: its message rates over the last minute (the server's samples, so the
// chart opens full), its bindings in both directions, binding it to a queue or exchange,
// publishing to it, deleting it.

import * as api from "../api.js";
import { Chart, LAST_MINUTE, ratesFromSamples } from "../charts.js";
import { add, clear, dangerButton, describeError, features, fmtJson, fmtRate, form, h, link, parseArgs, section, table } from "../ui.js";
import { dedupPanel, exchangeHref, fetchOr404, filterBox, is404, notFound, pager, queueHref, vhostNames, vhostSelect } from "./common.js";
import { publishForm } from "./publish.js";

const view = { vhost: "", name: "", regex: false, page: 1, pageSize: 100 };

export async function render(ctx) {
  if (ctx.params.length >= 2) return renderOne(ctx, ctx.params[0], ctx.params[1]);
  const names = await vhostNames();
  const list = h("div", { id: "exchange-list" });
  const types = (ctx.overview && ctx.overview.exchange_types || []).map((t) => t.name);
  add(ctx.root, h("h1", {}, "Exchanges"),
    h("div", { class: "toolbar" }, vhostSelect(names, view.vhost, (v) => { view.vhost = v; view.page = 1; refresh(); }),
      filterBox(view.name, view.regex, (name, regex) => { view.name = name; view.regex = regex; view.page = 1; refresh(); })),
    list,
    section("Add an exchange", form([
      { name: "vhost", label: "Virtual host", type: "select", options: names },
      { name: "name", label: "Name", required: true },
      { name: "type", label: "Type", type: "select", options: types.length ? types : ["direct", "fanout", "topic", "headers"] },
      { name: "durable", label: "Durable", type: "checkbox", value: true },
      { name: "auto_delete", label: "Auto delete", type: "checkbox" },
      { name: "internal", label: "Internal", type: "checkbox" },
      { name: "arguments", label: "Arguments", type: "textarea", rows: 2, placeholder: "alternate-exchange=my-ae" },
    ], "Add exchange", async (v) => {
      await api.put(`/api/exchanges/${api.seg(v.vhost)}/${api.seg(v.name)}`,
        { type: v.type, durable: v.durable, auto_delete: v.auto_delete, internal: v.internal, arguments: parseArgs(v.arguments) });
      refresh();
      return `Exchange ${v.name} declared.`;
    }, { id: "add-exchange" })));

  let latest = 0;  // only the newest request draws
  async function refresh() {
    const mine = ++latest;
    const path = `/api/exchanges${view.vhost ? "/" + api.seg(view.vhost) : ""}` + api.query({
      page: view.page, page_size: view.pageSize, name: view.name, use_regex: view.regex ? "true" : "", sort: "name",
    });
    let res;
    try { res = await api.get(path); } catch (exc) {
      if (exc instanceof api.ApiError && exc.error === "page_out_of_range" && view.page > 1) { view.page = 1; return refresh(); }
      if (mine === latest) clear(list, h("div", { class: "form-status error" }, describeError(exc)));
      return;
    }
    if (!ctx.live() || mine !== latest) return;
    clear(list, pager(res, (p) => { view.page = p; refresh(); }), table([
      { title: "Virtual host", get: (e) => e.vhost },
      { title: "Name", get: (e) => link(exchangeHref(e.vhost, e.name), e.name || "(AMQP default)"), cls: "name" },
      { title: "Type", get: (e) => e.type },
      { title: "Features", get: (e) => features(e) },
      { title: "Policy", get: (e) => e.policy || "" },
      { title: "Message rate in", get: (e) => fmtRate(stat(e, "publish_in")), cls: "num" },
      { title: "Message rate out", get: (e) => fmtRate(stat(e, "publish_out")), cls: "num" },
    ], res.items, { id: "exchanges-table", empty: view.name ? "No exchange matches the filter." : "No exchanges." }));
  }
  await ctx.every(refresh);
}

// an exchange's publish_in_details or publish_out_details; absent (RabbitMQ leaves them
// out) until something was published to it or routed out of it
const stat = (e, key) => (e.message_stats || {})[`${key}_details`];
const RATES = ["publish_in", "publish_out"];

async function renderOne(ctx, vhost, name) {
  const urlName = name || "amq.default";
  const base = `/api/exchanges/${api.seg(vhost)}/${api.seg(urlName)}`;
  const details = h("div");
  const chartBox = h("div", { class: "chart-box" });
  const ratesNow = h("div", { class: "muted", id: "exchange-rates-now" });
  const out = h("div", { id: "bindings-out" });
  const incoming = h("div", { id: "bindings-in" });
  const dedup = dedupPanel();
  const real = urlName === "amq.default" ? "" : urlName;
  const missing = `Exchange "${real}" does not exist in virtual host "${vhost}".`;
  const back = ["#/exchanges", "Exchanges"];
  if (!(await fetchOr404(ctx, base, missing, back))) return;
  add(ctx.root, h("p", {}, link("#/exchanges", "« Exchanges")),
    h("h1", {}, "Exchange ", h("span", { class: "objname" }, real || "(AMQP default)"), h("span", { class: "muted" }, ` in vhost ${vhost}`)),
    section("Details", details),
    dedup.panel,
    section("Message rates (last minute)", chartBox, ratesNow),
    section("Bindings from this exchange", out, real ? form([
      { name: "kind", label: "To", type: "select", options: [["q", "Queue"], ["e", "Exchange"]] },
      { name: "destination", label: "Name", required: true },
      { name: "routing_key", label: "Routing key" },
      { name: "arguments", label: "Arguments", type: "textarea", rows: 2 },
    ], "Bind", async (v) => {
      await api.post(`/api/bindings/${api.seg(vhost)}/e/${api.seg(real)}/${v.kind}/${api.seg(v.destination)}`,
        { routing_key: v.routing_key, arguments: parseArgs(v.arguments) });
      await refresh();
      return "Bound.";
    }, { id: "add-binding" }) : h("p", { class: "muted" }, "The default exchange binds every queue by its name; those bindings cannot change.")),
    section("Bindings to this exchange", incoming),
    section("Publish a message", publishForm(vhost, urlName)),
    real && !real.startsWith("amq.") ? section("Delete", dangerButton("Delete this exchange", `Delete exchange ${real}?`, async () => {
      await api.del(base); ctx.go("#/exchanges", `Exchange ${real} deleted.`);
    })) : null);

  const chart = new Chart(chartBox, ["in", "out"], { id: "exchange-rate-chart" });
  const dest = (b) => (b.destination_type === "queue" ? link(queueHref(vhost, b.destination), `queue ${b.destination}`) : link(exchangeHref(vhost, b.destination), `exchange ${b.destination}`));
  async function refresh() {
    let e, from, to;
    try {
      [e, from, to] = await Promise.all([api.get(base + LAST_MINUTE), api.get(`${base}/bindings/source`), api.get(`${base}/bindings/destination`)]);
    } catch (exc) {
      if (is404(exc) && ctx.live()) { notFound(ctx, `${missing} It was deleted.`, back); return; }
      throw exc;
    }
    if (!ctx.live()) return;
    clear(details, table([{ title: "Type", get: (x) => x.type }, { title: "Durable", get: (x) => String(x.durable) },
      { title: "Auto delete", get: (x) => String(x.auto_delete) }, { title: "Internal", get: (x) => String(x.internal) },
      { title: "Arguments", get: (x) => fmtJson(x.arguments) }, { title: "Policy", get: (x) => x.policy || "" }], [e]));
    dedup.set(e);
    chart.set(ratesFromSamples(RATES.map((k) => stat(e, k))));
    clear(ratesNow, `in ${fmtRate(stat(e, "publish_in"))} · out ${fmtRate(stat(e, "publish_out"))}`);
    const unbind = (b) => dangerButton("Unbind", null, async () => {
      await api.del(`/api/bindings/${api.seg(vhost)}/e/${api.seg(b.source)}/${b.destination_type[0]}/${api.seg(b.destination)}/${api.seg(b.properties_key)}`);
      await refresh();
      return "Unbound.";
    });
    clear(out, table([{ title: "To", get: dest }, { title: "Routing key", get: (b) => b.routing_key },
      { title: "Arguments", get: (b) => fmtJson(b.arguments) }, { title: "", get: (b) => (real ? unbind(b) : "") }], real ? from : [], { empty: real ? "No bindings." : "(implicit)" }));
    clear(incoming, table([{ title: "From", get: (b) => link(exchangeHref(vhost, b.source), b.source) },
      { title: "Routing key", get: (b) => b.routing_key }, { title: "Arguments", get: (b) => fmtJson(b.arguments) }, { title: "", get: unbind }], to));
  }
  await ctx.every(refresh);
}
