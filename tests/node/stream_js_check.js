// rabbitmq-stream-js-client (npm) unchanged on the stream port given as argv[2]: create a
// stream, publish five messages (send queues them; the client flushes them in the
// background), consume them from first; prints the bodies as JSON.
const rabbit = require("rabbitmq-stream-js-client");
(async () => {
  const port = parseInt(process.argv[2]);
  const client = await rabbit.connect({hostname: "127.0.0.1", port, username: "guest", password: "guest", vhost: "/", heartbeat: 0});
  const stream = "js-" + Date.now();
  await client.createStream({stream, arguments: {}});
  const publisher = await client.declarePublisher({stream, publisherRef: "js-pub"});
  for (let i = 0; i < 5; i++) await publisher.send(Buffer.from("j" + i));
  const got = [];
  await new Promise(async (resolve) => {
    await client.declareConsumer({stream, offset: rabbit.Offset.first()}, (msg) => {
      got.push(msg.content.toString()); if (got.length === 5) resolve();
    });
  });
  console.log(JSON.stringify(got));
  await client.close();
})().catch((e) => { console.error(e); process.exit(1); });
