// @cloudamqp/amqp-client against a running broker (amqpd or RabbitMQ).
// Usage: node amqp_client_check.mjs MODE amqp://guest:guest@127.0.0.1:PORT/ PREFIX
//   rpc        session rpcServer + rpcClient + rpcCall, on one connection and on two
//   heartbeat  heartbeat=1, idle for 5 s (the client only echoes the broker's heartbeats
//              and drops a socket silent for 1 s), then a round trip on the same connection
// Prints one JSON line with what it saw; exits non-zero on any failure or after 30 s.
import { AMQPClient, AMQPSession } from "@cloudamqp/amqp-client"

const [mode, url, prefix] = process.argv.slice(2)
const timer = setTimeout(() => { console.error("timeout"); process.exit(3) }, 30000)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function rpc() {
  const result = {}
  const queue = `${prefix}-rpc`
  const server = await AMQPSession.connect(url)
  try {
    await server.rpcServer(queue, (msg) => `processed:${msg.bodyString()}`)
    // the client on the server's own connection
    const rpcClient = await server.rpcClient()
    result.sameConnection = []
    for (const body of ["a", "b", "c"]) {
      const reply = await rpcClient.call(queue, body, { timeout: 5000 })
      result.sameConnection.push(reply.bodyString())
    }
    await rpcClient.close()
    result.rpcCall = (await server.rpcCall(queue, "once", { timeout: 5000 })).bodyString()
    // each rpcCall opens and closes a channel of its own: numbers are reused
    result.sequentialCalls = 0
    for (let i = 0; i < 10; i++) {
      const reply = await server.rpcCall(queue, `n${i}`, { timeout: 5000 })
      if (reply.bodyString() === `processed:n${i}`) result.sequentialCalls += 1
    }
    // a client on a connection of its own
    const other = await AMQPSession.connect(url)
    try {
      const replies = await Promise.all(["x", "y"].map(
        (body) => other.rpcCall(queue, body, { timeout: 5000 })))
      result.otherConnection = replies.map((reply) => reply.bodyString())
    } finally {
      await other.stop()
    }
  } finally {
    const conn = await new AMQPClient(url).connect()
    const ch = await conn.channel()
    await ch.queueDelete(queue)
    await conn.close()
    await server.stop()
  }
  return result
}

async function heartbeat() {
  const u = new URL(url)
  u.searchParams.set("heartbeat", "1")
  const client = new AMQPClient(u.toString())
  const conn = await client.connect()
  let closedEarly = null
  conn.onerror = (err) => { closedEarly = String(err && err.message) }
  const result = { negotiated: conn.heartbeat }
  await sleep(5000)
  result.closedWhileIdle = closedEarly
  const ch = await conn.channel()
  const q = await ch.queueDeclare("", { exclusive: true })
  await ch.basicPublish("", q.name, "still here")
  let msg = null
  for (let i = 0; i < 50 && !msg; i++) msg = await ch.basicGet(q.name, { noAck: true })
  result.body = msg && msg.bodyString()
  await conn.close()
  return result
}

const modes = { rpc, heartbeat }
modes[mode]().then((result) => {
  clearTimeout(timer)
  console.log(JSON.stringify(result))
}, (err) => {
  console.error(err && err.stack ? err.stack : String(err))
  process.exit(1)
})
