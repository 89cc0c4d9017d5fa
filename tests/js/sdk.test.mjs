// S2's TypeScript SDK (@s2-dev/streamstore, pinned) against a real weir
// server, over the fetch transport (HTTP/1.1, JSON, protobuf and SSE), and
// over S2S (HTTP/2), the SDK's default for sessions in Node.
// Run: WEIR_BIN=/path/to/weir node --test sdk.test.mjs  (or ./run.sh WEIR)
// The tests in the first suite share one server and build on each other;
// halfway, the server is killed (SIGKILL, no drain) and started again on the
// same data dir, and everything is read back; the S2S suite restarts it with
// SIGTERM and reads everything back too.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  AppendInput,
  AppendRecord,
  FencingTokenMismatchError,
  RangeNotSatisfiableError,
  S2,
  S2Error,
  SeqNumMismatchError,
} from "@s2-dev/streamstore";

import { WeirServer } from "./weir_server.mjs";

const BIN = process.env.WEIR_BIN;
const T = { timeout: 180_000 };
const BASIN = "js-sdk-basin";
const AUTO_BASIN = "js-auto-basin"; // a basin config that creates streams
const STREAM = "js/sdk stream?#1"; // needs URL encoding in paths
const TOKEN = "js-secret-token";

function client(server, accessToken = "ignored-when-auth-is-off") {
  return new S2({
    accessToken,
    endpoints: { account: `${server.url}/v1`, basin: `${server.url}/v1` },
    requestTimeoutMillis: 60_000, // generous: CI is a loaded 2-core machine
    connectionTimeoutMillis: 30_000,
  });
}

const text = (s) => new TextEncoder().encode(s);
const bodies = (records) => records.map((r) => r.body);
const seqs = (records) => records.map((r) => r.seqNum);
// What the append-session test writes to js-append-session, in order.
const SESSION_BODIES = [...Array(40).keys()].flatMap((i) => [`batch-${i}-a`, `batch-${i}-b`]);
// What the S2S append test writes to s2s-append, in order.
const S2S_BODIES = [...Array(100).keys()].flatMap((i) => [`s2s-${i}-a`, `s2s-${i}-b`]);

// How many reads and read sessions the server has begun (a counter).
async function readsBegun(server) {
  const metrics = await (await fetch(`${server.url}/metrics`)).text();
  return Number(/^weir_reads_total (\d+)$/m.exec(metrics)?.[1] ?? NaN);
}

// Waits until the server has begun read number n, then a little longer for
// the session to reach the tail, so that an append after it comes live.
async function untilReadBegun(server, n) {
  const deadline = Date.now() + 60_000;
  while ((await readsBegun(server)) < n) {
    if (Date.now() > deadline) throw new Error(`fewer than ${n} reads begun after 60 s`);
    await new Promise((r) => setTimeout(r, 50));
  }
  await new Promise((r) => setTimeout(r, 200));
}

async function collect(session, n) {
  const out = [];
  for await (const record of session) {
    out.push(record);
    if (out.length >= n) break;
  }
  return out;
}

describe("S2 SDK against weir", () => {
  let server;
  let s2;
  let stream; // STREAM in BASIN, fetch transport
  let snapshot; // what was read before the restart

  const open = () => {
    s2 = client(server);
    stream = s2.basin(BASIN).stream(STREAM, { forceTransport: "fetch" });
  };

  before(async () => {
    // Retention, and delete_on_empty with it, checked every second.
    server = new WeirServer(BIN, { args: ["--retention-interval-s", "1"] });
    await server.start();
    open();
  });

  after(async () => {
    try {
      await stream?.close();
      await server.stop();
    } finally {
      server.cleanup();
    }
  });

  it("creates a basin and a stream; weir-default exists", T, async () => {
    const info = await s2.basins.create({ basin: BASIN });
    assert.equal(info.name, BASIN);
    const names = (await s2.basins.list()).basins.map((b) => b.name);
    assert.ok(names.includes("weir-default"), names.join(","));
    assert.ok(names.includes(BASIN), names.join(","));

    const created = await s2.basin(BASIN).streams.create({ stream: STREAM });
    assert.equal(created.name, STREAM);
    const listed = await s2.basin(BASIN).streams.list({ prefix: "js/" });
    assert.deepEqual(listed.streams.map((s) => s.name), [STREAM]);
    // Routing: the default basin does not see the stream.
    const inDefault = await s2.basin("weir-default").streams.list({ prefix: "js/" });
    assert.deepEqual(inDefault.streams.map((s) => s.name), []);
    const cfg = await s2.basin(BASIN).streams.getConfig({ stream: STREAM });
    assert.equal(cfg.storageClass, "standard");
  });

  it("appends string records (JSON) and bytes records (protobuf)", T, async () => {
    const ack1 = await stream.append(AppendInput.create([
      AppendRecord.string({ body: "hello", headers: [["k", "v"]] }),
      AppendRecord.string({ body: "world" }),
    ]));
    assert.equal(ack1.start.seqNum, 0);
    assert.equal(ack1.end.seqNum, 2);
    assert.equal(ack1.tail.seqNum, 2);
    assert.ok(ack1.start.timestamp instanceof Date);

    const ack2 = await stream.append(AppendInput.create([
      AppendRecord.bytes({ body: new Uint8Array([0, 1, 2, 255]), headers: [[text("bin"), new Uint8Array([254])]] }),
    ]));
    assert.equal(ack2.start.seqNum, 2);
    assert.equal(ack2.end.seqNum, 3);

    // An older client timestamp is raised: timestamps never go backwards.
    const past = Date.now() - 3_600_000;
    const ack3 = await stream.append(AppendInput.create([AppendRecord.string({ body: "dated", timestamp: past })]));
    assert.equal(ack3.start.seqNum, 3);
    assert.ok(ack3.start.timestamp.getTime() >= ack2.end.timestamp.getTime());
  });

  it("reads as strings (JSON) and as bytes (protobuf)", T, async () => {
    const strings = await stream.read({ start: { from: { seqNum: 0 } }, stop: { limits: { count: 2 } } });
    assert.deepEqual(seqs(strings.records), [0, 1]);
    assert.deepEqual(bodies(strings.records), ["hello", "world"]);
    assert.deepEqual(strings.records[0].headers, [["k", "v"]]);

    const bytes = await stream.read({ start: { from: { seqNum: 0 } } }, { as: "bytes" });
    assert.deepEqual(seqs(bytes.records), [0, 1, 2, 3]);
    assert.deepEqual(bytes.records[0].body, text("hello"));
    assert.deepEqual(bytes.records[2].body, new Uint8Array([0, 1, 2, 255]));
    assert.deepEqual(bytes.records[2].headers, [[text("bin"), new Uint8Array([254])]]);

    const fromTail = await stream.read({ start: { from: { tailOffset: 1 } } });
    assert.deepEqual(bodies(fromTail.records), ["dated"]);

    await assert.rejects(stream.read({ start: { from: { seqNum: 100 } } }), (e) => {
      assert.ok(e instanceof RangeNotSatisfiableError, String(e));
      assert.equal(e.tail?.seqNum, 4);
      return true;
    });
    // Clamped to the tail: with nothing to wait for still a 416 (as on S2),
    // with waitSecs a long poll that ends empty.
    await assert.rejects(stream.read({ start: { from: { seqNum: 100 }, clamp: true } }), RangeNotSatisfiableError);
    const clamped = await stream.read({ start: { from: { seqNum: 100 }, clamp: true }, stop: { waitSecs: 1 } });
    assert.deepEqual(clamped.records, []);
  });

  it("checks the tail", T, async () => {
    const { tail } = await stream.checkTail();
    assert.equal(tail.seqNum, 4);
    assert.ok(tail.timestamp instanceof Date);
  });

  it("reads through an SSE session (strings, bytes, live tail)", T, async () => {
    const first = await collect(await stream.readSession({
      start: { from: { seqNum: 0 } }, stop: { limits: { count: 2 } },
    }), 2);
    assert.deepEqual(bodies(first), ["hello", "world"]);

    const all = await collect(await stream.readSession({
      start: { from: { seqNum: 0 } }, stop: { limits: { count: 4 } },
    }, { as: "bytes" }), 4);
    assert.deepEqual(seqs(all), [0, 1, 2, 3]);
    assert.deepEqual(all[2].body, new Uint8Array([0, 1, 2, 255]));

    // A session at the tail, then an append: the session delivers it.
    const readsBefore = await readsBegun(server);
    const live = await stream.readSession({ start: { from: { seqNum: 4 } } });
    const next = collect(live, 1);
    await untilReadBegun(server, readsBefore + 1); // the record then comes live
    await stream.append(AppendInput.create([AppendRecord.string({ body: "live" })]));
    const got = await next;
    assert.deepEqual(seqs(got), [4]);
    assert.deepEqual(bodies(got), ["live"]);
  });

  it("rejects a matchSeqNum miss (412)", T, async () => {
    await assert.rejects(
      stream.append(AppendInput.create([AppendRecord.string({ body: "nope" })], { matchSeqNum: 1 })),
      (e) => {
        assert.ok(e instanceof SeqNumMismatchError, String(e));
        assert.equal(e.status, 412);
        assert.equal(e.expectedSeqNum, 5);
        return true;
      });
    const ok = await stream.append(AppendInput.create([AppendRecord.string({ body: "matched" })], { matchSeqNum: 5 }));
    assert.equal(ok.start.seqNum, 5);
  });

  it("fences and rejects a fencing-token miss (412), JSON and protobuf", T, async () => {
    await stream.append(AppendInput.create([AppendRecord.fence("js-token")]));
    const miss = (e) => {
      assert.ok(e instanceof FencingTokenMismatchError, String(e));
      assert.equal(e.status, 412);
      assert.equal(e.expectedFencingToken, "js-token");
      return true;
    };
    await assert.rejects(
      stream.append(AppendInput.create([AppendRecord.string({ body: "x" })], { fencingToken: "wrong" })), miss);
    await assert.rejects(
      stream.append(AppendInput.create([AppendRecord.bytes({ body: new Uint8Array([1]) })], { fencingToken: "wrong" })),
      miss);
    const ok = await stream.append(
      AppendInput.create([AppendRecord.string({ body: "fenced" })], { fencingToken: "js-token" }));
    assert.equal(ok.start.seqNum, 7);
  });

  it("trims (a protobuf command record) in the default basin", T, async () => {
    const other = s2.basin("weir-default").stream("js-trimmed", { forceTransport: "fetch" });
    await s2.basin("weir-default").streams.create({ stream: "js-trimmed" });
    await other.append(AppendInput.create(["a", "b", "c"].map((body) => AppendRecord.string({ body }))));
    await other.append(AppendInput.create([AppendRecord.trim(2)]));
    const rest = await other.read({ start: { from: { seqNum: 0 } } }, { as: "bytes" });
    assert.deepEqual(seqs(rest.records), [2, 3]);
    await other.close();
  });

  it("stores deleteOnEmpty, and the server deletes a stream trimmed to its tail", T, async () => {
    const streams = s2.basin("weir-default").streams;
    await streams.create({ stream: "js-doe", config: { deleteOnEmpty: { minAgeSecs: 1 } } });
    assert.equal((await streams.getConfig({ stream: "js-doe" })).deleteOnEmpty?.minAgeSecs, 1);
    await streams.create({ stream: "js-doe-cfg" });
    assert.equal((await streams.getConfig({ stream: "js-doe-cfg" })).deleteOnEmpty ?? null, null);
    await streams.reconfigure({ stream: "js-doe-cfg", deleteOnEmpty: { minAgeSecs: 3600 } });
    assert.equal((await streams.getConfig({ stream: "js-doe-cfg" })).deleteOnEmpty?.minAgeSecs, 3600);
    await streams.reconfigure({ stream: "js-doe-cfg", deleteOnEmpty: { minAgeSecs: 0 } });
    assert.equal((await streams.getConfig({ stream: "js-doe-cfg" })).deleteOnEmpty ?? null, null);

    const doe = s2.basin("weir-default").stream("js-doe", { forceTransport: "fetch" });
    await doe.append(AppendInput.create(["x", "y"].map((body) => AppendRecord.string({ body }))));
    await doe.append(AppendInput.create([AppendRecord.trim(1000)])); // through itself: now empty
    await doe.close();
    const deadline = Date.now() + 30000;
    let status = 200;
    while (status !== 404 && Date.now() < deadline) {
      try {
        await streams.getConfig({ stream: "js-doe" });
        await new Promise((r) => setTimeout(r, 200));
      } catch (e) {
        status = e.status;
      }
    }
    assert.equal(status, 404);
    assert.ok((await streams.getConfig({ stream: "js-doe-cfg" })).storageClass); // the other one stays
  });

  it("pipelines batches through an append session (fetch transport) and acks them in order", T, async () => {
    const basin = s2.basin(BASIN);
    await basin.streams.create({ stream: "js-append-session" });
    const target = basin.stream("js-append-session", { forceTransport: "fetch" });
    const session = await target.appendSession({ maxInflightBatches: 8 });
    try {
      const tickets = [];
      for (let i = 0; i < 40; i++) {
        tickets.push(await session.submit(AppendInput.create([
          AppendRecord.string({ body: `batch-${i}-a` }),
          AppendRecord.string({ body: `batch-${i}-b` }),
        ])));
      }
      const acks = await Promise.all(tickets.map((t) => t.ack()));
      acks.forEach((ack, i) => {
        assert.equal(ack.start.seqNum, 2 * i);
        assert.equal(ack.end.seqNum, 2 * i + 2);
      });
      assert.equal(session.lastAckedPosition().end.seqNum, 80);
    } finally {
      await session.close();
    }
    const back = await target.read({ start: { from: { seqNum: 0 } } });
    assert.deepEqual(bodies(back.records), SESSION_BODIES);
    await target.close();
  });

  it("creates streams on append and on read as the basin's config says, with its defaults", T, async () => {
    await s2.basins.create({
      basin: AUTO_BASIN,
      config: { createStreamOnAppend: true, defaultStreamConfig: { storageClass: "express", retentionPolicy: { ageSecs: 86400 } } },
    });
    const cfg = await s2.basins.getConfig({ basin: AUTO_BASIN });
    assert.equal(cfg.createStreamOnAppend, true);
    assert.equal(cfg.createStreamOnRead ?? false, false);
    assert.equal(cfg.defaultStreamConfig?.storageClass, "express");

    const made = s2.basin(AUTO_BASIN).stream("made-on-append", { forceTransport: "fetch" });
    const ack = await made.append(AppendInput.create([AppendRecord.string({ body: "first" })]));
    assert.equal(ack.end.seqNum, 1);
    await made.close();
    const scfg = await s2.basin(AUTO_BASIN).streams.getConfig({ stream: "made-on-append" });
    assert.equal(scfg.storageClass, "express");
    assert.equal(scfg.retentionPolicy?.ageSecs, 86400);

    const reader = s2.basin(AUTO_BASIN).stream("made-on-read", { forceTransport: "fetch" });
    await assert.rejects(reader.checkTail(), (e) => e instanceof S2Error && e.status === 404);
    const re = await s2.basins.reconfigure({ basin: AUTO_BASIN, createStreamOnRead: true });
    assert.equal(re.createStreamOnRead, true);
    assert.equal(re.createStreamOnAppend, true);
    assert.equal((await reader.checkTail()).tail.seqNum, 0);
    await reader.close();
    const names = (await s2.basin(AUTO_BASIN).streams.list()).streams.map((s) => s.name);
    assert.deepEqual(names, ["made-on-append", "made-on-read"]);
  });

  it("reports a session at the tail as caught up (SSE: a ping with the tail)", T, async () => {
    const tail = (await stream.checkTail()).tail;
    const session = await stream.readSession({ start: { from: { tailOffset: 0 } }, stop: { waitSecs: 3 } });
    const caught = session.caughtUp();
    for await (const record of session) assert.fail(`no record was appended, got ${record.seqNum}`);
    assert.equal((await caught).seqNum, tail.seqNum);
  });

  it("kills the server mid-suite (SIGKILL, same data dir) and starts it again", T, async () => {
    const bytes = await stream.read({ start: { from: { seqNum: 0 } } }, { as: "bytes" });
    const tail = (await stream.checkTail()).tail;
    snapshot = { bytes, tail };
    assert.equal(tail.seqNum, 8);
    await stream.close();
    await server.crash(); // no drain: what was acknowledged must already be durable
    await server.start(); // a new port: new clients
    open();
  });

  it("reads everything back after the restart", T, async () => {
    const bytes = await stream.read({ start: { from: { seqNum: 0 } } }, { as: "bytes" });
    assert.deepEqual(bytes, snapshot.bytes);
    assert.deepEqual((await stream.checkTail()).tail, snapshot.tail);

    const strings = await stream.read({ start: { from: { seqNum: 0 } }, stop: { limits: { count: 2 } } });
    assert.deepEqual(bodies(strings.records), ["hello", "world"]);

    const session = await collect(await stream.readSession({
      start: { from: { seqNum: 0 } }, stop: { limits: { count: 8 } },
    }, { as: "bytes" }), 8);
    assert.deepEqual(seqs(session), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert.deepEqual(session.map((r) => r.body), snapshot.bytes.records.map((r) => r.body));

    const names = (await s2.basins.list({ prefix: BASIN })).basins.map((b) => b.name);
    assert.deepEqual(names, [BASIN]);
    const autoCfg = await s2.basins.getConfig({ basin: AUTO_BASIN });
    assert.equal(autoCfg.createStreamOnRead, true);
    assert.equal(autoCfg.defaultStreamConfig?.retentionPolicy?.ageSecs, 86400);
    const trimmed = await s2.basin("weir-default").stream("js-trimmed", { forceTransport: "fetch" })
      .read({ start: { from: { seqNum: 0 } } }, { as: "bytes" });
    assert.deepEqual(seqs(trimmed.records), [2, 3]);

    const piped = await s2.basin(BASIN).stream("js-append-session", { forceTransport: "fetch" })
      .read({ start: { from: { seqNum: 0 } } });
    assert.deepEqual(seqs(piped.records), [...Array(80).keys()]);
    assert.deepEqual(bodies(piped.records), SESSION_BODIES);
    const made = await s2.basin(AUTO_BASIN).stream("made-on-append", { forceTransport: "fetch" })
      .read({ start: { from: { seqNum: 0 } } });
    assert.deepEqual(bodies(made.records), ["first"]);
  });

  it("still enforces the fencing token and match_seq_num after the restart", T, async () => {
    await assert.rejects(
      stream.append(AppendInput.create([AppendRecord.string({ body: "x" })], { fencingToken: "wrong" })),
      FencingTokenMismatchError);
    await assert.rejects(
      stream.append(AppendInput.create([AppendRecord.string({ body: "x" })], { matchSeqNum: 0 })),
      SeqNumMismatchError);
    const ack = await stream.append(AppendInput.create([AppendRecord.string({ body: "after" })],
      { fencingToken: "js-token", matchSeqNum: 8 }));
    assert.equal(ack.start.seqNum, 8);
  });
});

describe("S2 SDK sessions over S2S (HTTP/2, the default transport)", () => {
  let server;
  let s2;
  const basin = () => s2.basin("weir-default");

  before(async () => {
    server = new WeirServer(BIN);
    await server.start();
    s2 = client(server);
  });

  after(async () => {
    try {
      await server.stop();
    } finally {
      server.cleanup();
    }
  });

  it("pipelines an append session and acks every batch in order", T, async () => {
    await basin().streams.create({ stream: "s2s-append" });
    const target = basin().stream("s2s-append"); // no forceTransport: S2S in Node
    const session = await target.appendSession({ maxInflightBatches: 16 });
    try {
      const tickets = [];
      for (let i = 0; i < 100; i++) {
        tickets.push(await session.submit(AppendInput.create([
          AppendRecord.string({ body: `s2s-${i}-a`, headers: [["k", `${i}`]] }),
          AppendRecord.string({ body: `s2s-${i}-b` }),
        ])));
      }
      const acks = await Promise.all(tickets.map((t) => t.ack()));
      acks.forEach((ack, i) => {
        assert.equal(ack.start.seqNum, 2 * i);
        assert.equal(ack.end.seqNum, 2 * i + 2);
      });
      assert.equal(session.lastAckedPosition().end.seqNum, 200);
    } finally {
      await session.close();
    }
    // Read back through an S2S read session, bounded by count.
    const all = await collect(await target.readSession({
      start: { from: { seqNum: 0 } }, stop: { limits: { count: 200 } },
    }), 200);
    assert.deepEqual(seqs(all), [...Array(200).keys()]);
    assert.equal(all[4].body, "s2s-2-a");
    assert.deepEqual(all[4].headers, [["k", "2"]]);
    assert.equal(all[199].body, "s2s-99-b");
    await target.close();
    // The sessions went over HTTP/2, not the fetch fallback.
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const h2 = Number(/^weir_http2_connections_total (\d+)$/m.exec(metrics)?.[1]);
    assert.ok(h2 >= 1, `weir_http2_connections_total is ${h2}`);
  });

  it("appends and reads gzip-compressed frames when the client asks for them", T, async () => {
    const gz = new S2({
      accessToken: "ignored-when-auth-is-off",
      endpoints: { account: `${server.url}/v1`, basin: `${server.url}/v1` },
      compression: "gzip",
      requestTimeoutMillis: 60_000,
      connectionTimeoutMillis: 30_000,
    });
    await gz.basin("weir-default").streams.create({ stream: "s2s-gzip" });
    const target = gz.basin("weir-default").stream("s2s-gzip");
    const big = "g".repeat(4000); // frames over 1 KiB are compressed
    const session = await target.appendSession();
    const acks = [];
    for (let i = 0; i < 5; i++) {
      acks.push(await session.submit(AppendInput.create([AppendRecord.string({ body: `${i}:${big}` })])));
    }
    assert.deepEqual((await Promise.all(acks.map((t) => t.ack()))).map((a) => a.start.seqNum), [0, 1, 2, 3, 4]);
    await session.close();
    const back = await collect(await target.readSession({
      start: { from: { seqNum: 0 } }, stop: { limits: { count: 5 } },
    }), 5);
    assert.deepEqual(bodies(back), [0, 1, 2, 3, 4].map((i) => `${i}:${big}`));
    await target.close();
  });

  it("follows the tail in a read session", T, async () => {
    await basin().streams.create({ stream: "s2s-live" });
    const target = basin().stream("s2s-live");
    const readsBefore = await readsBegun(server);
    const live = await target.readSession({ start: { from: { seqNum: 0 } } }, { as: "bytes" });
    const next = collect(live, 2);
    // Append only once the session is open, so the records come live.
    await untilReadBegun(server, readsBefore + 1);
    await target.append(AppendInput.create([
      AppendRecord.bytes({ body: new Uint8Array([0, 1, 255]) }),
      AppendRecord.string({ body: "two" }),
    ]));
    const got = await next;
    assert.deepEqual(seqs(got), [0, 1]);
    assert.deepEqual(got[0].body, new Uint8Array([0, 1, 255]));
    await target.close();
  });

  it("ends an append session at a matchSeqNum miss (412), after acking what came before", T, async () => {
    await basin().streams.create({ stream: "s2s-match" });
    const target = basin().stream("s2s-match");
    const session = await target.appendSession();
    const first = await session.submit(AppendInput.create([AppendRecord.string({ body: "a" })], { matchSeqNum: 0 }));
    const second = await session.submit(AppendInput.create([AppendRecord.string({ body: "b" })], { matchSeqNum: 7 }));
    assert.equal((await first.ack()).start.seqNum, 0);
    await assert.rejects(second.ack(), (e) => {
      assert.ok(e instanceof SeqNumMismatchError, String(e));
      assert.equal(e.expectedSeqNum, 1);
      return true;
    });
    await session.close().catch(() => {});
    assert.equal((await target.checkTail()).tail.seqNum, 1);
    await target.close();
  });

  it("ends an append session at a fencing-token miss (412)", T, async () => {
    await basin().streams.create({ stream: "s2s-fence" });
    const target = basin().stream("s2s-fence");
    await target.append(AppendInput.create([AppendRecord.fence("s2s-token")]));
    const session = await target.appendSession();
    const ok = await session.submit(AppendInput.create([AppendRecord.string({ body: "x" })], { fencingToken: "s2s-token" }));
    assert.equal((await ok.ack()).start.seqNum, 1);
    const bad = await session.submit(AppendInput.create([AppendRecord.string({ body: "y" })], { fencingToken: "wrong" }));
    await assert.rejects(bad.ack(), (e) => {
      assert.ok(e instanceof FencingTokenMismatchError, String(e));
      assert.equal(e.expectedFencingToken, "s2s-token");
      return true;
    });
    await session.close().catch(() => {});
    await target.close();
  });

  it("reports a missing stream (404) and a start past the tail (416)", T, async () => {
    const missing = basin().stream("s2s-no-such-stream");
    const session = await missing.appendSession();
    const t = await session.submit(AppendInput.create([AppendRecord.string({ body: "x" })])).catch((e) => e);
    const err = t instanceof Error ? t : await t.ack().catch((e) => e);
    assert.ok(err instanceof S2Error, String(err));
    assert.equal(err.status, 404);
    await session.close().catch(() => {});

    const target = basin().stream("s2s-append");
    const past = await target.readSession({ start: { from: { seqNum: 1000 } }, stop: { limits: { count: 1 } } });
    await assert.rejects(collect(past, 1), (e) => {
      assert.ok(e instanceof RangeNotSatisfiableError, String(e));
      assert.equal(e.status, 416);
      return true;
    });
    await missing.close();
    await target.close();
  });

  it("reports a session at the tail as caught up (S2S: a heartbeat batch with the tail)", T, async () => {
    const target = basin().stream("s2s-append");
    const tail = (await target.checkTail()).tail;
    const session = await target.readSession({ start: { from: { tailOffset: 0 } }, stop: { waitSecs: 3 } });
    const caught = session.caughtUp();
    for await (const record of session) assert.fail(`no record was appended, got ${record.seqNum}`);
    assert.equal((await caught).seqNum, tail.seqNum);
    await target.close();
  });

  it("reads everything back over S2S after a restart", T, async () => {
    await server.stop();
    await server.start();
    s2 = client(server);
    const target = basin().stream("s2s-append");
    const all = await collect(await target.readSession({
      start: { from: { seqNum: 0 } }, stop: { limits: { count: 200 } },
    }), 200);
    assert.deepEqual(seqs(all), [...Array(200).keys()]);
    assert.deepEqual(bodies(all), S2S_BODIES);
    assert.deepEqual(all[4].headers, [["k", "2"]]);
    const gz = await collect(await s2.basin("weir-default").stream("s2s-gzip").readSession({
      start: { from: { seqNum: 0 } }, stop: { limits: { count: 5 } },
    }), 5);
    assert.deepEqual(bodies(gz), [0, 1, 2, 3, 4].map((i) => `${i}:${"g".repeat(4000)}`));
    const session = await target.appendSession();
    const ack = await (await session.submit(AppendInput.create([AppendRecord.string({ body: "after" })]))).ack();
    assert.equal(ack.start.seqNum, 200);
    await session.close();
    await target.close();
  });
});

describe("S2 SDK with bearer auth", () => {
  let server;

  before(async () => {
    // The token file lives outside the data dir; WeirServer gives a fresh temp dir.
    const probe = new WeirServer(BIN);
    const tokenFile = join(probe.tmp, "token");
    writeFileSync(tokenFile, `${TOKEN}\n`);
    probe.args = ["--auth-token-file", tokenFile];
    server = probe;
    await server.start();
  });

  after(async () => {
    try {
      await server.stop();
    } finally {
      server.cleanup();
    }
  });

  it("accepts the right token and refuses a wrong one (401)", T, async () => {
    const good = client(server, TOKEN);
    const names = (await good.basins.list()).basins.map((b) => b.name);
    assert.ok(names.includes("weir-default"));
    const s = good.basin("weir-default").stream("authed", { forceTransport: "fetch" });
    await good.basin("weir-default").streams.create({ stream: "authed" });
    await s.append(AppendInput.create([AppendRecord.string({ body: "x" })]));
    assert.equal((await s.checkTail()).tail.seqNum, 1);
    await s.close();

    const bad = client(server, "wrong-token");
    await assert.rejects(bad.basins.list(), (e) => {
      assert.ok(e instanceof S2Error, String(e));
      assert.equal(e.status, 401);
      return true;
    });
  });
});
