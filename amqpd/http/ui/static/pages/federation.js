// Federation (the federation plugin): the status of every link of the cluster, each with the
// node that runs it, and the upstreams (upstreams.js: list, add, delete).

import * as api from "../api.js";
import { add, clear, dangerButton, h, section, table } from "../ui.js";
import { vhostNames } from "./common.js";
import { upstreamsSection } from "./upstreams.js";

export async function render(ctx) {
  const links = h("div", { id: "federation-links" });
  const upstreams = ctx.me.policymaker ? upstreamsSection(ctx, await vhostNames()) : null;
  add(ctx.root, h("h1", {}, "Federation"), section("Links", links), upstreams && upstreams.el);
  await ctx.every(async () => {
    const items = await api.get("/api/federation-links");
    if (!ctx.live()) return;
    clear(links, table([
      { title: "Upstream", get: (l) => l.upstream }, { title: "Node", get: (l) => l.node || "" }, { title: "Virtual host", get: (l) => l.vhost },
      { title: "Type", get: (l) => l.type }, { title: "Local object", get: (l) => l.exchange || l.queue },
      { title: "Upstream object", get: (l) => l.upstream_exchange || l.upstream_queue },
      { title: "URI", get: (l) => l.uri }, { title: "State", get: (l) => h("span", { class: `state ${l.status}` }, l.status) },
      { title: "Error", get: (l) => l.error || "" }, { title: "Since", get: (l) => l.timestamp },
      { title: "", get: (l) => (ctx.me.policymaker ? dangerButton("Restart", null, () => api.del(`/api/federation-links/vhost/${api.seg(l.vhost)}/${api.seg(l.id)}/${api.seg(l.node)}/restart`).then(() => "Restarting.")) : "") },
    ], items, { id: "federation-table", empty: "No federation links." }));
    if (upstreams) await upstreams.refresh();
  });
}
