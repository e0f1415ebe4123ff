// Queues: a list paged, sorted and filtered by the server (RabbitMQ's page, page_size,
// sort, sort_reverse, name, use_regex), so it stays fast with tens of thousands of queues;
// and a form to add one. A stream's log (size on disk, segments, first and last offset)
// has its own columns, drawn only on a page that lists a stream.

import * as api from "../api.js";
import { add, clear, describeError, features, fmtBytes, fmtNum, fmtOffset, fmtRate, form, h, link, parseArgs, section, table } from "../ui.js";
import { columnChooser, filterBox, pager, queueHref, vhostNames, vhostSelect } from "./common.js";

// the optional columns, and those shown until someone chooses (as RabbitMQ's defaults)
const STREAM_COLUMNS = ["Size on disk", "Segments", "First offset", "Last offset"];
const OPTIONAL = ["Virtual host", "Type", "Features", "Policy", "State", "Consumers", "Ready", "Unacked", "Total", "incoming", "deliver / get", "ack", ...STREAM_COLUMNS];
const DEFAULT = ["Virtual host", "Type", "Features", "State", "Ready", "Unacked", "Total", "incoming", "deliver / get", "ack", ...STREAM_COLUMNS];

const view = { vhost: "", name: "", regex: false, page: 1, pageSize: 100, sort: { key: "name", reverse: false } };
const COLUMNS = "name,vhost,type,durable,auto_delete,exclusive,arguments,policy,state,consumers,messages,messages_ready," +
  "messages_unacknowledged,message_stats.publish_details.rate,message_stats.deliver_get_details.rate,message_stats.ack_details.rate," +
  "stream.size_bytes,stream.segments,stream.first_offset,stream.last_offset";

export async function render(ctx) {
  if (ctx.params.length >= 2) return (await import("./queue.js")).render(ctx);
  const names = await vhostNames();
  const listBox = h("div", { id: "queue-list" });
  const sizeSel = h("select", { id: "page-size", onchange: () => { view.pageSize = Number(sizeSel.value); view.page = 1; refresh(); } },
    [20, 100, 500].map((n) => h("option", { value: n }, `${n} per page`)));
  sizeSel.value = String(view.pageSize);
  const chooser = columnChooser("amqpd-queue-columns", OPTIONAL, DEFAULT, () => refresh());
  add(ctx.root, h("h1", {}, "Queues"),
    h("div", { class: "toolbar" },
      vhostSelect(names, view.vhost, (v) => { view.vhost = v; view.page = 1; refresh(); }, { id: "vhost-filter" }),
      filterBox(view.name, view.regex, (name, regex) => { view.name = name; view.regex = regex; view.page = 1; refresh(); }),
      sizeSel, chooser.el),
    listBox,
    section("Add a queue", form([
      { name: "vhost", label: "Virtual host", type: "select", options: names, value: view.vhost || names[0] },
      { name: "name", label: "Name", required: true },
      { name: "durable", label: "Durable", type: "checkbox", value: true },
      { name: "auto_delete", label: "Auto delete", type: "checkbox", value: false },
      { name: "arguments", label: "Arguments", type: "textarea", rows: 2, placeholder: "x-max-length=1000\nx-queue-mode=lazy  (or a JSON object)" },
    ], "Add queue", async (v) => {
      await api.put(`/api/queues/${api.seg(v.vhost)}/${api.seg(v.name)}`,
        { durable: v.durable, auto_delete: v.auto_delete, arguments: parseArgs(v.arguments) });
      refresh();
      return `Queue ${v.name} declared.`;
    }, { id: "add-queue" })));

  function onSort(key) {
    view.sort = { key, reverse: view.sort.key === key ? !view.sort.reverse : false };
    view.page = 1;
    refresh();
  }

  let latest = 0;  // only the newest request draws: an older answer must not undo a click
  async function refresh() {
    const mine = ++latest;
    const path = `/api/queues${view.vhost ? "/" + api.seg(view.vhost) : ""}` + api.query({
      page: view.page, page_size: view.pageSize, name: view.name, use_regex: view.regex ? "true" : "",
      sort: view.sort.key, sort_reverse: view.sort.reverse ? "true" : "false", columns: COLUMNS,
    });
    let res;
    try {
      res = await api.get(path);
    } catch (exc) {
      if (exc instanceof api.ApiError && exc.error === "page_out_of_range" && view.page > 1) { view.page = 1; return refresh(); }
      if (mine === latest) clear(listBox, h("div", { class: "form-status error" }, describeError(exc)));
      return;
    }
    if (!ctx.live() || mine !== latest) return;
    const ms = (q) => q.message_stats || {};
    const shown = chooser.chosen();
    const streams = res.items.some((q) => q.stream);
    const st = (q, f) => (q.stream ? f(q.stream) : "");
    clear(listBox, pager(res, (p) => { view.page = p; refresh(); }), table([
      { title: "Virtual host", get: (q) => q.vhost, sort: "vhost" },
      { title: "Name", get: (q) => link(queueHref(q.vhost, q.name), q.name), sort: "name", cls: "name" },
      { title: "Type", get: (q) => q.type },
      { title: "Features", get: (q) => features(q) },
      { title: "Policy", get: (q) => q.policy || "" },
      { title: "State", get: (q) => h("span", { class: `state ${q.state}` }, q.state) },
      { title: "Consumers", get: (q) => fmtNum(q.consumers), sort: "consumers", cls: "num" },
      { title: "Ready", get: (q) => fmtNum(q.messages_ready), sort: "messages_ready", cls: "num" },
      { title: "Unacked", get: (q) => fmtNum(q.messages_unacknowledged), sort: "messages_unacknowledged", cls: "num" },
      { title: "Total", get: (q) => fmtNum(q.messages), sort: "messages", cls: "num messages" },
      { title: "incoming", get: (q) => fmtRate(ms(q).publish_details), cls: "num" },
      { title: "deliver / get", get: (q) => fmtRate(ms(q).deliver_get_details), cls: "num" },
      { title: "ack", get: (q) => fmtRate(ms(q).ack_details), cls: "num" },
      { title: "Size on disk", get: (q) => st(q, (s) => fmtBytes(s.size_bytes)), cls: "num stream-size" },
      { title: "Segments", get: (q) => st(q, (s) => fmtNum(s.segments)), cls: "num stream-segments" },
      { title: "First offset", get: (q) => st(q, (s) => fmtOffset(s.first_offset, s.last_offset)), cls: "num stream-first" },
      { title: "Last offset", get: (q) => st(q, (s) => fmtOffset(s.last_offset, s.last_offset)), cls: "num stream-last" },
    ].filter((c) => c.title === "Name" || (shown.has(c.title) && (streams || !STREAM_COLUMNS.includes(c.title)))), res.items, { sort: view.sort, onSort, id: "queues-table", empty: view.name ? "No queue matches the filter." : "No queues." }));
  }
  await ctx.every(refresh);
}
