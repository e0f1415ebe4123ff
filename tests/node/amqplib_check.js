// amqplib against a running amqpd: publish with confirms, consume with acks, get, cancel.
// Usage: node amqplib_check.js amqp://guest:guest@127.0.0.1:PORT/ QUEUE_PREFIX
// Prints one JSON line with what it saw; exits non-zero on any failure or after 15 s.
"use strict";
const amqp = require("amqplib");

const [url, prefix] = process.argv.slice(2);
const N = 50;
const timer = setTimeout(() => { console.error("timeout"); process.exit(3); }, 15000);

async function main() {
  const conn = await amqp.connect(url);
  const result = { serverProperties: conn.connection.serverProperties.product };

  // publisher confirms
  const confirm = await conn.createConfirmChannel();
  const q = (await confirm.assertQueue(`${prefix}-confirm`, { exclusive: true })).queue;
  for (let i = 0; i < N; i++) {
    confirm.sendToQueue(q, Buffer.from(String(i)), { persistent: i % 2 === 0 });
  }
  await confirm.waitForConfirms();
  result.confirmed = N;
  let unroutableReturned = false;
  confirm.on("return", () => { unroutableReturned = true; });
  await new Promise((resolve, reject) => confirm.publish(
    "amq.direct", `${prefix}-nowhere`, Buffer.from("r"), { mandatory: true },
    (err) => (err ? reject(err) : resolve())));

  // consume with prefetch and acks
  const ch = await conn.createChannel();
  await ch.prefetch(5);
  const got = [];
  await new Promise((resolve, reject) => {
    ch.consume(q, (msg) => {
      if (msg === null) { reject(new Error("cancelled")); return; }
      got.push(msg.content.toString());
      ch.ack(msg);
      if (got.length === N) resolve();
    }).then((ok) => { result.consumerTag = ok.consumerTag; }, reject);
  });
  result.inOrder = got.every((body, i) => body === String(i));
  await ch.cancel(result.consumerTag);

  // get / nack / redelivered
  await ch.sendToQueue(q, Buffer.from("again"));
  let msg = false;
  for (let i = 0; i < 100 && !msg; i++) msg = await ch.get(q);
  ch.nack(msg, false, true);
  msg = false;
  for (let i = 0; i < 100 && !msg; i++) msg = await ch.get(q);
  result.redelivered = msg.fields.redelivered;
  ch.ack(msg);
  result.returned = unroutableReturned;

  // a channel error (404) closes the channel, not the connection
  const bad = await conn.createChannel();
  bad.on("error", () => {});
  try {
    await bad.checkQueue(`${prefix}-missing`);
    result.notFound = false;
  } catch (err) {
    result.notFound = err.code;
  }
  const still = await conn.createChannel();
  await still.checkQueue(q);
  await conn.close();
  clearTimeout(timer);
  console.log(JSON.stringify(result));
}

main().catch((err) => { console.error(err && err.stack || err); process.exit(1); });
