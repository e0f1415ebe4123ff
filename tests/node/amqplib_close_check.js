// amqplib closing a busy connection: a burst of publishes on several channels, then
// connection.close at once. amqplib's writer interleaves channels, so frames of channel
// 1..n may follow the close on channel 0 on the wire; the broker must answer close-ok and
// let the client finish (no ECONNRESET, the callback API's close callback is called).
// Usage: node amqplib_close_check.js amqp://guest:guest@127.0.0.1:PORT/ PREFIX ROUNDS
// Prints one JSON line with what it saw; exits non-zero on any failure or after 60 s.
"use strict";
const amqpCb = require("amqplib/callback_api");
const amqp = require("amqplib");

const [url, prefix, roundsArg] = process.argv.slice(2);
const ROUNDS = Number(roundsArg || 10);
const BURST = 2000;
const body = Buffer.alloc(512, 120);
const timer = setTimeout(() => { console.error("timeout"); process.exit(3); }, 60000);

function callbackRound(i) {
  return new Promise((resolve, reject) => {
    amqpCb.connect(url, (err, conn) => {
      if (err) { reject(err); return; }
      const errors = [];
      conn.on("error", (e) => errors.push(e.code || e.message));
      conn.createChannel((err1, ch1) => {
        if (err1) { reject(err1); return; }
        conn.createChannel((err2, ch2) => {
          if (err2) { reject(err2); return; }
          for (let n = 0; n < BURST; n++) {
            ch1.publish("amq.direct", `${prefix}-nowhere-${i}`, body);
            ch2.publish("amq.direct", `${prefix}-nowhere-${i}`, body);
          }
          conn.close((closeErr) => {
            if (closeErr) reject(closeErr);
            else resolve(errors);
          });
        });
      });
    });
  });
}

async function promiseRound(i) {
  const conn = await amqp.connect(url);
  const errors = [];
  conn.on("error", (e) => errors.push(e.code || e.message));
  const chans = [await conn.createChannel(), await conn.createChannel()];
  for (let n = 0; n < BURST; n++) {
    for (const ch of chans) ch.publish("amq.direct", `${prefix}-nowhere-${i}`, body);
  }
  await conn.close();
  return errors;
}

async function main() {
  const result = { callbackClosed: 0, promiseClosed: 0, errors: [] };
  for (let i = 0; i < ROUNDS; i++) {
    result.errors.push(...await callbackRound(i));
    result.callbackClosed += 1;
    result.errors.push(...await promiseRound(i));
    result.promiseClosed += 1;
  }
  return result;
}

main().then((result) => {
  clearTimeout(timer);
  console.log(JSON.stringify(result));
}, (err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
