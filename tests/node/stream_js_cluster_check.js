// rabbitmq-stream-js-client (npm) unchanged against a three-node amqpd cluster
// (tests/node/test_stream_js_cluster.py drives it and says what is checked). argv[2]:
// JSON {phase, nodes: [{host, port}], stream, n, k}. Every step is bounded; each result
// is one JSON line on stdout ({"event": ...}); the driver answers "killed" on stdin once
// it has killed the stream's leader.
//
// cluster() (nodes: node-a first): create the stream on node-a; wait until the metadata
//   names a leader and two replicas; a named producer (the client puts it on the
//   leader) publishes n messages with confirms; a consumer from `first` (the client
//   puts it on a replica) gets them and stores offset n/2 - 1, which a client on a
//   node not leading the stream reads back; a consumer from the offset after it gets
//   the rest. k/2 more are confirmed, k/2 sent, and the driver kills the leader. Then
//   what the client does by itself (0.4.2 has no automatic reconnection), and what a
//   user does: a new client on a surviving node declares the producer again where
//   the metadata names the new leader and re-sends every id not confirmed.
// replay() (nodes: the surviving replica's, the new leader's): a consumer from
//   `first` counts every id; the stored offset is queried; the stream is deleted
//   through the replica's node.
const rabbit = require("rabbitmq-stream-js-client");
const readline = require("readline");

const cfg = JSON.parse(process.argv[2]);
const {stream, n, k} = cfg;
const REF = "js-producer", CONSUMER_REF = "js-consumer";
const emit = (event, fields = {}) => console.log(JSON.stringify({event, ...fields}));
const body = (i) => "m" + i;

function within(ms, what, promise) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`not within ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function waitFor(ms, what, cond) {
  const deadline = Date.now() + ms;
  let last = "";
  for (;;) {
    try {
      if (await cond()) return;
    } catch (e) {
      last = String(e);
    }
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what} ${last}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function connect(node) {
  return within(10000, `connect to ${node.host}:${node.port}`, rabbit.connect({
    hostname: node.host, port: node.port, username: "guest", password: "guest", vhost: "/",
    heartbeat: 0}));
}

const where = (x) => { const i = x.getConnectionInfo(); return {host: i.host, port: i.port}; };
const ids = (msgs) => msgs.map((m) => parseInt(m.slice(1)));

const lines = readline.createInterface({input: process.stdin});
const stdinLines = [];
let stdinWaiter = null;
lines.on("line", (l) => { stdinLines.push(l); if (stdinWaiter) stdinWaiter(); });
const nextLine = () => within(60000, "the driver's answer", new Promise((resolve) => {
  const take = () => { if (stdinLines.length) { stdinWaiter = null; resolve(stdinLines.shift()); } };
  stdinWaiter = take; take();
}));

async function metadataOf(client) {
  const [md] = await client.queryMetadata({streams: [stream]});
  return md;
}

async function consumeAll(client, offset, count, ref, connectionClosedListener) {
  const got = [];
  const consumer = await within(10000, "declare consumer", client.declareConsumer(
    {stream, offset, consumerRef: ref, connectionClosedListener},
    (msg) => got.push(msg.content.toString())));
  await waitFor(20000, `${count} messages for consumer at ${JSON.stringify(where(consumer))}`,
                () => got.length >= count);
  return {consumer, got};
}

async function cluster() {
  const [a] = cfg.nodes;
  const onA = await connect(a);
  await within(10000, "create stream", onA.createStream({stream, arguments: {}}));
  let md;
  await waitFor(20000, "metadata with a leader and two replicas", async () => {
    md = await metadataOf(onA);
    return md.leader !== undefined && md.replicas.length === 2;
  });
  emit("metadata", {leader: md.leader, replicas: md.replicas});
  const leader = md.leader;
  const other = cfg.nodes.find((x) => x.host !== leader.host || x.port !== leader.port);

  // publish n with confirms
  const confirmed = new Set(), errored = [];
  let publisherClosed = false;
  const publisher = await within(10000, "declare publisher", onA.declarePublisher(
    {stream, publisherRef: REF, connectionClosedListener: () => { publisherClosed = true; }}));
  publisher.on("publish_confirm", (err, pids) => {
    if (err) errored.push([err, pids.map(Number)]);
    else pids.forEach((p) => confirmed.add(Number(p)));
  });
  for (let i = 1; i <= n; i++) await publisher.send(Buffer.from(body(i)));
  await publisher.flush();
  await waitFor(20000, `${n} confirms`, () => confirmed.size === n || errored.length > 0);
  emit("published", {publisher: where(publisher), confirmed: confirmed.size, errored});

  // consume from first (on a replica), store an offset, query it through a non-leader
  // the client calls connectionClosedListener when its connection's socket closes, and
  // with false when a metadata-update for the stream ends the consumer
  const firstClosed = [];
  const first = await consumeAll(onA, rabbit.Offset.first(), n, CONSUMER_REF,
                                 (hadError) => firstClosed.push(hadError));
  const stored = BigInt(n / 2 - 1);
  first.consumer.storeOffset(stored);
  const onOther = await connect(other);
  let queried = null;
  await waitFor(10000, "the stored offset read back on a non-leader", async () => {
    queried = await onOther.queryOffset({stream, reference: CONSUMER_REF});
    return queried === stored;
  });
  const fromConsumer = await first.consumer.queryOffset();
  // on the same client as the first consumer (see replay() for why)
  const resumed = await consumeAll(onA, rabbit.Offset.offset(queried + 1n), n - Number(stored) - 1,
                                   "js-resumed");
  emit("consumed", {first: first.got, firstAt: where(first.consumer),
                    queried: Number(queried), queriedAt: other,
                    fromConsumer: Number(fromConsumer),
                    resumed: resumed.got, resumedAt: where(resumed.consumer)});

  // k more, then the leader is killed
  const rejections = [];
  // the client ends a consumer on a metadata-update by unsubscribing, from an event
  // listener: the broker has ended the subscription already (as RabbitMQ does) and
  // answers 0x04, which the client throws there -- without this handler Node would
  // end the process on that unhandled rejection
  process.on("unhandledRejection", (e) => rejections.push(String(e)));
  const before = first.got.length;
  // the first half confirmed, the second in flight when the leader dies
  const half = n + k / 2;
  for (let i = n + 1; i <= half; i++) await publisher.send(Buffer.from(body(i)));
  await publisher.flush();
  await waitFor(20000, `${half} confirms`, () => confirmed.size === half);
  for (let i = half + 1; i <= n + k; i++) await publisher.send(Buffer.from(body(i)));
  await publisher.flush();
  emit("kill-now", {confirmed: confirmed.size});
  const killed = await nextLine();
  if (killed !== "killed") throw new Error(`driver said ${killed}`);
  await waitFor(20000, "the publisher's connection closes", () => publisherClosed);
  await waitFor(20000, "the consumer closed by a metadata-update", () => firstClosed.length > 0);
  await waitFor(10000, "the client's unsubscribe answered", () => rejections.length > 0);
  const confirmedBeforeKill = [...confirmed].sort((x, y) => x - y);

  // a user's recovery: a new client on a surviving node finds the new leader
  const recovery = await connect(other);
  let newMd;
  await waitFor(30000, "metadata names a new leader", async () => {
    newMd = await metadataOf(recovery);
    return newMd.leader !== undefined && newMd.leader.port !== leader.port;
  });
  const again = await within(10000, "declare the producer again", recovery.declarePublisher(
    {stream, publisherRef: REF}));
  const confirmedAgain = new Set(), erroredAgain = [];
  again.on("publish_confirm", (err, pids) => {
    if (err) erroredAgain.push([err, pids.map(Number)]);
    else pids.forEach((p) => confirmedAgain.add(Number(p)));
  });
  const sequence = Number(await within(10000, "query-publisher-sequence",
                                       again.getLastPublishingId()));
  // re-send every id not confirmed before the kill, with its own publishing id: those
  // the new leader holds are confirmed and not stored again
  const resend = [];
  for (let i = 1; i <= n + k; i++) if (!confirmed.has(i)) resend.push(i);
  for (const i of resend) await again.basicSend(BigInt(i), Buffer.from(body(i)));
  await again.flush();
  await waitFor(20000, `${resend.length} re-sent ids confirmed`,
                () => confirmedAgain.size === resend.length || erroredAgain.length > 0);
  emit("recovered", {
    newLeader: newMd.leader, newReplicas: newMd.replicas, publisherAt: where(again),
    publisherClosed, firstClosed,
    rejections, firstGotAfterKill: first.got.length - before,
    confirmedBeforeKill: confirmedBeforeKill.length,
    maxConfirmedBeforeKill: confirmedBeforeKill.at(-1) ?? 0, sequence, resent: resend.length,
    confirmedAgain: confirmedAgain.size, erroredAgain,
    sequenceAfter: Number(await again.getLastPublishingId())});
  await within(5000, "close", recovery.close());
}

// a new process (an application started again): 0.4.2 keeps its consumer connections
// in a pool shared by every client of the process, keyed by stream and host, so a new
// client's consumer would be handed the connection of the old client's consumer on
// that host, whose deliveries that old client takes (and drops: "no consumer found")
async function replay() {
  const node = cfg.nodes[0];
  const client = await connect(node);
  const all = await consumeAll(client, rabbit.Offset.first(), n + k, "js-replay");
  // a moment for a duplicate to show
  await new Promise((r) => setTimeout(r, 500));
  const queried = Number(await client.queryOffset({stream, reference: CONSUMER_REF}));
  // deleted through this node (it does not lead the stream); the leader's node says so
  await within(10000, "unsubscribe", client.closeConsumer(all.consumer.extendedId));
  const deleted = await within(10000, "delete stream", client.deleteStream({stream}));
  const onLeader = await connect(cfg.nodes[1]);
  let code = null;
  await waitFor(20000, "the leader's node knows the stream no more", async () => {
    code = (await metadataOf(onLeader)).responseCode;
    return code === 2;
  });
  emit("replayed", {replay: ids(all.got), replayAt: where(all.consumer), queried, deleted,
                    metadataAfterDelete: code});
  for (const c of [client, onLeader]) await within(5000, "close", c.close());
}

(cfg.phase === "replay" ? replay() : cluster()).then(() => process.exit(0))
  .catch((e) => { console.error(e); process.exit(1); });
