// The publish form used by the exchange and queue pages (POST .../publish).

import * as api from "../api.js";
import { form, parseArgs } from "../ui.js";

export function publishForm(vhost, exchange, { routingKey = "", fixedKey = false, after } = {}) {
  const fields = [];
  if (!fixedKey) fields.push({ name: "routing_key", label: "Routing key", value: routingKey });
  fields.push(
    { name: "delivery_mode", label: "Delivery mode", type: "select", options: [["1", "1 - non-persistent"], ["2", "2 - persistent"]], value: "2" },
    { name: "headers", label: "Headers", type: "textarea", rows: 2, placeholder: "key=value lines or JSON" },
    { name: "properties", label: "Properties", type: "textarea", rows: 2, placeholder: "content_type=text/plain\npriority=5 (key=value lines or JSON)" },
    { name: "payload_encoding", label: "Payload encoding", type: "select", options: [["string", "String"], ["base64", "base64"]] },
    { name: "payload", label: "Payload", type: "textarea", rows: 4 },
  );
  return form(fields, "Publish message", async (v) => {
    const properties = { ...parseArgs(v.properties), delivery_mode: Number(v.delivery_mode) };
    const headers = parseArgs(v.headers);
    if (Object.keys(headers).length) properties.headers = headers;
    for (const k of ["content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id", "type", "user_id", "app_id"]) {
      if (k in properties) properties[k] = String(properties[k]);
    }
    const res = await api.post(`/api/exchanges/${api.seg(vhost)}/${api.seg(exchange || "amq.default")}/publish`, {
      routing_key: fixedKey ? routingKey : v.routing_key, payload: v.payload, payload_encoding: v.payload_encoding, properties,
    });
    if (after) after();
    return res.routed ? "Message published." : "Message published, but not routed to any queue.";
  }, { id: "publish-message" });
}
