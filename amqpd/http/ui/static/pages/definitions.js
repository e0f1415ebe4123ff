// Definitions: export (download or view) and import from a file or pasted JSON.

import * as api from "../api.js";
import { add, form, h, section } from "../ui.js";
import { vhostNames } from "./common.js";

export async function render(ctx) {
  const names = await vhostNames();
  const vhostPath = (v) => (v ? `/api/definitions/${api.seg(v)}` : "/api/definitions");
  // the file input keeps its file after an import: pasting next would import the file
  // again, so an import forgets the chosen file, and so does typing in the paste box
  let importForm = null;
  const forgetFile = () => { importForm.querySelector("input[type=file]").value = ""; };
  add(ctx.root, h("h1", {}, "Definitions"),
    section("Export", h("p", { class: "muted" }, "Users, vhosts, permissions, policies, parameters, exchanges, queues and bindings, in RabbitMQ's JSON format."),
      h("p", {}, h("a", { href: "/api/definitions?download=amqpd-definitions.json", id: "export-link", download: "amqpd-definitions.json" }, "Download the broker's definitions"),
        " · ", names.map((v, i) => [i ? ", " : "", h("a", { href: `${vhostPath(v)}?download=${encodeURIComponent(`amqpd-${v}.json`)}` }, `vhost ${v}`)]))),
    section("Import", h("p", { class: "muted" }, "Choose a definitions file (from amqpd or RabbitMQ), or paste its JSON. Existing objects with the same names are updated."),
      form([
        { name: "file", label: "Definitions file", type: "file", accept: ".json,application/json" },
        { name: "text", label: "or paste JSON", type: "textarea", rows: 6 },
        { name: "vhost", label: "Into", type: "select", options: [["", "the whole broker"], ...names.map((v) => [v, `vhost ${v} only`])] },
      ], "Import definitions", async (v) => {
        const text = v.file ? await v.file.text() : v.text;
        forgetFile();
        if (!text || !text.trim()) throw new Error("choose a file or paste the definitions first");
        let parsed;
        try { parsed = JSON.parse(text); } catch (exc) { throw new Error(`the file is not valid JSON: ${exc.message}`); }
        await api.post(vhostPath(v.vhost), parsed);
        const counts = ["users", "vhosts", "queues", "exchanges", "bindings", "policies"].filter((k) => Array.isArray(parsed[k]) && parsed[k].length)
          .map((k) => `${parsed[k].length} ${k}`).join(", ");
        return `Definitions imported${counts ? ` (${counts})` : ""}.`;
      }, { id: "import-definitions" })));
  importForm = ctx.root.querySelector("#import-definitions");
  importForm.querySelector("textarea[name=text]").addEventListener("input", forgetFile);
}
