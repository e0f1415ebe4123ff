// Channels: every visible channel with its prefetch, unacked count, mode and rates.

import * as api from "../api.js";
import { clear, fmtNum, fmtRate, h, link, table } from "../ui.js";
import { connectionHref } from "./common.js";

export function channelColumns() {
  return [
    { title: "Channel", get: (c) => c.name, cls: "name" },
    { title: "Connection", get: (c) => link(connectionHref(c.connection_details.name), c.connection_details.name) },
    { title: "User", get: (c) => c.user }, { title: "Virtual host", get: (c) => c.vhost },
    { title: "Mode", get: (c) => [c.confirm ? "confirm" : "", c.transactional ? "tx" : ""].join(" ").trim() },
    { title: "Prefetch", get: (c) => String(c.prefetch_count) },
    { title: "Unacked", get: (c) => fmtNum(c.messages_unacknowledged), cls: "num" },
    { title: "Consumers", get: (c) => fmtNum(c.consumer_count), cls: "num" },
    { title: "publish", get: (c) => fmtRate((c.message_stats || {}).publish_details), cls: "num" },
    { title: "confirm", get: (c) => fmtRate((c.message_stats || {}).confirm_details), cls: "num" },
    { title: "deliver", get: (c) => fmtRate((c.message_stats || {}).deliver_get_details), cls: "num" },
    { title: "ack", get: (c) => fmtRate((c.message_stats || {}).ack_details), cls: "num" },
  ];
}

export async function render(ctx) {
  const list = h("div", { id: "channels-list" });
  ctx.root.append(h("h1", {}, "Channels"), list);
  await ctx.every(5000, async () => {
    const items = await api.get("/api/channels");
    if (!ctx.live()) return;
    clear(list, table(channelColumns(), items, { id: "channels-table", empty: "No channels." }));
  });
}
