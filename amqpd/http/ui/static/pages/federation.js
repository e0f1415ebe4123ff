// Federation (the federation plugin): upstreams and the status of every link of the cluster,
// each with the node that runs it.

import * as api from "../api.js";
import { clear, dangerButton, fmtJson, h, section, table } from "../ui.js";

// passwords in upstream URIs stay in the API, off the screen
const redact = (text) => text.replace(/(amqps?:\/\/[^:/@"]*):[^@/"]*@/g, "$1:***@");

export async function render(ctx) {
  const links = h("div", { id: "federation-links" }), upstreams = h("div", { id: "federation-upstreams" });
  ctx.root.append(h("h1", {}, "Federation"), section("Links", links), ctx.me.policymaker ? section("Upstreams", upstreams) : null);
  await ctx.every(5000, async () => {
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
    if (ctx.me.policymaker) {
      const ups = await api.get("/api/parameters/federation-upstream");
      if (!ctx.live()) return;
      clear(upstreams, table([{ title: "Name", get: (u) => u.name }, { title: "Virtual host", get: (u) => u.vhost },
        { title: "Definition", get: (u) => redact(fmtJson(u.value)) }], ups, { empty: "No upstreams." }));
    }
  });
}
