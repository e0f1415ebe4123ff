// Stream protocol clients (port 5552, when its listener runs): connections, publishers
// with their publishing ids and counts, consumers with their offsets, lag, credit and,
// for single active consumer groups, which member is active. The same lists as
// /api/stream/connections, /publishers and /consumers (RabbitMQ's stream management).

import * as api from "../api.js";
import { add, clear, fmtNum, h, link, section, table } from "../ui.js";
import { queueHref } from "./common.js";

export async function render(ctx) {
  const conns = h("div", { id: "stream-connections" });
  const pubs = h("div", { id: "stream-publishers" });
  const subs = h("div", { id: "stream-consumers" });
  add(ctx.root, h("h1", {}, "Streams"),
    h("p", { class: "muted" }, "Clients of the stream protocol listener (RabbitMQ Stream protocol)."),
    section("Stream connections", conns), section("Publishers", pubs), section("Consumers", subs));
  const stream = (x) => link(queueHref(x.queue.vhost, x.queue.name), x.queue.name);
  const num = (v) => (v === null || v === undefined ? "—" : fmtNum(v));
  await ctx.every(async () => {
    const [c, p, s] = await Promise.all(["connections", "publishers", "consumers"].map((k) => api.get(`/api/stream/${k}`)));
    if (!ctx.live()) return;
    clear(conns, table([
      { title: "Name", get: (x) => x.name, cls: "name" }, { title: "User", get: (x) => x.user },
      { title: "Virtual host", get: (x) => x.vhost },
      { title: "Client", get: (x) => [x.client_properties.product, x.client_properties.version].filter(Boolean).join(" ") },
      { title: "Publishers", get: (x) => fmtNum(x.publishers), cls: "num publishers" },
      { title: "Consumers", get: (x) => fmtNum(x.consumers), cls: "num consumers" },
      { title: "Heartbeat", get: (x) => `${x.heartbeat}s`, cls: "num" }, { title: "Frame max", get: (x) => fmtNum(x.frame_max), cls: "num" },
    ], c, { id: "stream-connections-table", empty: "No stream connections." }));
    clear(pubs, table([
      { title: "Connection", get: (x) => x.connection_details.name, cls: "name" },
      { title: "Id", get: (x) => String(x.publisher_id), cls: "num publisher-id" },
      { title: "Reference", get: (x) => x.reference, cls: "reference" }, { title: "Stream", get: stream, cls: "stream" },
      { title: "Published", get: (x) => fmtNum(x.published), cls: "num published" },
      { title: "Confirmed", get: (x) => fmtNum(x.confirmed), cls: "num confirmed" },
      { title: "Errored", get: (x) => fmtNum(x.errored), cls: "num errored" },
      { title: "Last publishing id", get: (x) => num(x.last_publishing_id), cls: "num last-id" },
      { title: "Confirmed publishing id", get: (x) => num(x.confirmed_publishing_id), cls: "num confirmed-id" },
    ], p, { id: "stream-publishers-table", empty: "No publishers." }));
    clear(subs, table([
      { title: "Connection", get: (x) => x.connection_details.name, cls: "name" },
      { title: "Subscription", get: (x) => String(x.subscription_id), cls: "num subscription-id" },
      { title: "Stream", get: stream, cls: "stream" }, { title: "Group", get: (x) => x.group || "", cls: "group" },
      { title: "Status", get: (x) => x.activity_status, cls: "status" },
      { title: "Offset", get: (x) => (x.active ? fmtNum(x.offset) : "—"), cls: "num offset" },
      { title: "Lag", get: (x) => (x.active ? fmtNum(x.offset_lag) : "—"), cls: "num lag" },
      { title: "Credits", get: (x) => fmtNum(x.credits), cls: "num credits" },
      { title: "Consumed", get: (x) => fmtNum(x.consumed), cls: "num consumed" },
    ], s, { id: "stream-consumers-table", empty: "No consumers." }));
  });
}
