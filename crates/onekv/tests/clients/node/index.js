// ioredis against a onekv cluster, with the library's default options.
//
//     npm ci && node index.js ADDR_A [ADDR_B]
//
// ADDR_A and ADDR_B are the RESP addresses (host:port) of two different nodes. Checks PING,
// SET/GET, INCR, a multi() (MULTI/EXEC) transaction, an error inside EXEC, WATCH aborting EXEC
// after another client's write, hashes (HSET, HGETALL, HMGET, HINCRBY, HDEL, WRONGTYPE), and two
// connections on two nodes incrementing one counter 200 times each with WATCH/GET/MULTI/SET/EXEC,
// which must end at exactly 400; a defineCommand() script run 50 times from each node (every run
// counted once), and a BLPOP woken by an RPUSH through the other node.
// Prints one line of what it checked; exits 1 with a message on any mismatch.
"use strict";

const assert = require("node:assert/strict");
const Redis = require("ioredis");

const INCREMENTS = 200;

function connect(address) {
  const [host, port] = address.split(":");
  const client = new Redis(Number(port), host);
  // A connection error would otherwise be retried (and logged) for a minute: stop at the first.
  client.on("error", (error) => {
    console.error(`ioredis: FAIL: ${address}: ${error.message}`);
    process.exit(1);
  });
  return client;
}

// Adds 1 to key with an optimistic WATCH transaction, retrying on conflict; returns the retries.
async function incrementWatched(client, key) {
  for (let retries = 0; retries < 10000; retries++) {
    await client.watch(key);
    const value = Number((await client.get(key)) ?? 0);
    const replies = await client.multi().set(key, value + 1).exec();
    if (replies !== null) {
      assert.deepEqual(replies, [[null, "OK"]], "EXEC of the WATCH increment");
      return retries;
    }
  }
  throw new Error("gave up after 10000 conflicts");
}

async function main() {
  const args = process.argv.slice(2);
  if (args.length < 1 || args.length > 2) throw new Error("usage: node index.js ADDR_A [ADDR_B]");
  const a = connect(args[0]);
  const b = connect(args[args.length - 1]);
  // Fresh keys on every run, all in one shard: onekv refuses (CROSSSLOT) a transaction whose keys
  // span shards, so they share a {hash tag}.
  const p = `{ioredis:${Date.now()}}:`;
  try {
    assert.equal(await a.ping(), "PONG", "PING");
    assert.equal(await a.set(p + "k", "v"), "OK", "SET");
    assert.equal(await a.get(p + "k"), "v", "GET");
    assert.equal(await b.get(p + "k"), "v", "GET through node B");
    assert.equal(await a.incr(p + "n"), 1, "INCR");

    let replies = await a.multi().incr(p + "n").incr(p + "n").set(p + "a", "1").get(p + "n").exec();
    assert.deepEqual(replies, [[null, 2], [null, 3], [null, "OK"], [null, "3"]], "multi().exec()");
    assert.equal(await a.get(p + "a"), "1", "GET after EXEC");

    // A command failing at run time inside EXEC is its own error; the others still apply.
    await a.set(p + "s", "text");
    replies = await a.multi().set(p + "b", "x").incr(p + "s").set(p + "c", "y").exec();
    assert.equal(replies.length, 3, "replies of EXEC with a failing INCR");
    assert.deepEqual([replies[0], replies[2]], [[null, "OK"], [null, "OK"]], "EXEC with a failing INCR");
    assert.match(String(replies[1][0]), /not an integer/, "the failing INCR's error");
    assert.equal(await a.get(p + "c"), "y", "GET after EXEC with an error");

    // WATCH aborts EXEC (null) when another client, on the other node, writes the key first.
    await a.set(p + "w", "0");
    await a.watch(p + "w");
    assert.equal(await a.get(p + "w"), "0", "GET under WATCH");
    await b.set(p + "w", "changed");
    assert.equal(await a.multi().set(p + "w", "mine").exec(), null, "EXEC after a watched key changed");
    assert.equal(await a.get(p + "w"), "changed", "GET after aborted EXEC");

    // Hashes: HSET of an object, HGETALL (an object), HMGET, HINCRBY, HDEL, WRONGTYPE.
    assert.equal(await a.hset(p + "h", { name: "ada", age: 36 }), 2, "HSET");
    assert.deepEqual(await b.hgetall(p + "h"), { age: "36", name: "ada" }, "HGETALL through node B");
    assert.deepEqual(await a.hmget(p + "h", "name", "nope"), ["ada", null], "HMGET");
    assert.equal(await a.hincrby(p + "h", "age", 1), 37, "HINCRBY");
    await assert.rejects(a.get(p + "h"), /^ReplyError: WRONGTYPE/, "GET of a hash");
    assert.equal(await a.hdel(p + "h", "name", "age"), 2, "HDEL");
    assert.equal(await a.exists(p + "h"), 0, "EXISTS after the last field's HDEL");

    // Two connections on two nodes, 200 optimistic increments each: exactly 400, none lost.
    const retries = await Promise.all(
      [a, b].map(async (client) => {
        let total = 0;
        for (let i = 0; i < INCREMENTS; i++) total += await incrementWatched(client, p + "counter");
        return total;
      }),
    );
    assert.equal(await a.get(p + "counter"), String(2 * INCREMENTS), "counter after both clients' WATCH increments");

    // A script defined as a command (EVALSHA, then EVAL after NOSCRIPT), run from both nodes at
    // once: every run counted once.
    for (const client of [a, b]) {
      client.defineCommand("bump", {
        numberOfKeys: 1,
        lua: "local n = tonumber(redis.call('GET', KEYS[1]) or '0') + ARGV[1] redis.call('SET', KEYS[1], n) return n",
      });
    }
    const seen = (
      await Promise.all(
        [a, b].map(async (client) => {
          const mine = [];
          for (let i = 0; i < 50; i++) mine.push(await client.bump(p + "scripted", 1));
          return mine;
        }),
      )
    ).flat();
    assert.deepEqual(seen.sort((x, y) => x - y), Array.from({ length: 100 }, (_, i) => i + 1), "script runs");

    // BLPOP through node A, woken by an RPUSH through node B.
    const blocked = a.blpop(p + "queue", 10);
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(await b.rpush(p + "queue", "job"), 1, "RPUSH");
    assert.deepEqual(await blocked, [p + "queue", "job"], "BLPOP woken by a push through another node");

    await a.del(p + "k", p + "n", p + "a", p + "s", p + "b", p + "c", p + "w", p + "counter", p + "scripted");
    const version = require("ioredis/package.json").version;
    console.log(
      `ioredis ${version}: PING, SET/GET, INCR, multi().exec(), error in EXEC, WATCH abort, hashes, scripts, BLPOP, ` +
        `WATCH counter ${2 * INCREMENTS} (conflicts retried: ${retries[0]} + ${retries[1]}) OK`,
    );
  } finally {
    a.disconnect();
    b.disconnect();
  }
}

// Bound the whole run, whatever happens.
setTimeout(() => {
  console.error("ioredis: FAIL: not done after 120 s");
  process.exit(1);
}, 120_000).unref();

main().catch((error) => {
  console.error(`ioredis: FAIL: ${error.message}`);
  process.exit(1);
});
