// A closed-loop Arrow Flight DoPut load generator against a running weir
// (docs/benchmarks.md, "Arrow Flight DoPut"): CLIENTS calls, each a DoPut
// stream keeping INFLIGHT batches of ROWS rows of ROW_BYTES-byte values
// unanswered, into a table's bucket (one per client, round robin). One batch
// is encoded once by Apache Arrow and sent again and again, so the client
// costs little. Prints one JSON line: batches/s, rows/s, MB/s acknowledged,
// and the batch ack latency p50/p99 (from write to its PutResult). With
// --follow, a DoGet following each bucket's tail also measures end-to-end
// latency: from a batch's write to the arrival of its last row at the
// follower (at most one client per bucket, so a bucket's rows arrive in the
// order they were sent). The followers run on a worker thread of their own,
// so reading does not wait behind writing on one event loop.
//   node bench.mjs --flight HOST:PORT --kafka HOST:PORT [--clients 8] [--inflight 4]
//        [--rows 900] [--row-bytes 1024] [--duration 10] [--partitions 8] [--follow]
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as A from "apache-arrow";
import { Kafka, logLevel } from "kafkajs";

const here = dirname(fileURLToPath(import.meta.url));
const FlightService = grpc.loadPackageDefinition(
  protoLoader.loadSync(join(here, "../../../src/flight/flight.proto"), { keepCase: true, longs: String, defaults: true }),
).arrow.flight.protocol.FlightService;

// The followers' thread: a DoGet following each of `buckets`, posting
// { ready: true } once each has its schema (the writers start then), then
// { bucket, seen (rows so far), t (arrival, hrtime ns) } per record batch;
// "stop" cancels them.
if (!isMainThread) {
  const { flight, topic, buckets } = workerData;
  const calls = [];
  let schemas = 0;
  for (let bucket = 0; bucket < buckets; bucket++) {
    // grpc-js keeps HTTP/2's 64 KiB receive window unless told otherwise,
    // which caps one call near 160 MB/s here; gRPC's C++ and Java clients
    // grow theirs as they go (BDP probing).
    const c = new FlightService(flight, grpc.credentials.createInsecure(), { "grpc-node.flow_control_window": 16 << 20 });
    const call = c.DoGet({ ticket: Buffer.from(JSON.stringify({ table: topic, bucket, follow: true })) });
    let seen = 0;
    call.on("data", (d) => {
      const m = A.Message.decode(Buffer.from(d.data_header));
      if (!m.isRecordBatch()) {
        if (++schemas === buckets) parentPort.postMessage({ ready: true });
        return;
      }
      seen += Number(m.header().length);
      parentPort.postMessage({ bucket, seen, t: process.hrtime.bigint() });
    });
    call.on("error", () => {});  // cancelled at the end
    calls.push(new Promise((resolve) => call.on("status", () => { c.close(); resolve(); })));
    parentPort.on("message", (msg) => { if (msg === "stop") call.cancel(); });
  }
  await Promise.all(calls);
  process.exit(0);
}

const { values: o } = parseArgs({
  options: {
    flight: { type: "string" }, kafka: { type: "string" },
    clients: { type: "string", default: "8" }, inflight: { type: "string", default: "4" },
    rows: { type: "string", default: "900" }, "row-bytes": { type: "string", default: "1024" },
    duration: { type: "string", default: "10" }, partitions: { type: "string", default: "8" },
    follow: { type: "boolean", default: false },
  },
});
if (!o.flight || !o.kafka) {
  console.error("usage: node bench.mjs --flight HOST:PORT --kafka HOST:PORT [options]");
  process.exit(2);
}
const clients = Number(o.clients), inflight = Number(o.inflight), rows = Number(o.rows);
const rowBytes = Number(o["row-bytes"]), seconds = Number(o.duration), partitions = Number(o.partitions);
if (o.follow && clients > partitions) {
  console.error("--follow needs --clients at most --partitions (one writer per bucket)");
  process.exit(2);
}

const topic = `flight-bench-${randomBytes(4).toString("hex")}`;
const admin = new Kafka({ clientId: "flight-bench", brokers: [o.kafka], logLevel: logLevel.NOTHING }).admin();
await admin.connect();
await admin.createTopics({ topics: [{ topic, numPartitions: partitions }], waitForLeaders: true });
await admin.disconnect();

const value = randomBytes(rowBytes);
const table = new A.Table({ value: A.vectorFromArray(Array.from({ length: rows }, () => value), new A.Binary()) });
const stream = Buffer.from(A.tableToIPC(table, "stream"));
const messages = [];
for (let pos = 0; pos + 8 <= stream.length;) {
  const len = stream.readInt32LE(pos + 4);
  if (len === 0) break;
  const header = stream.subarray(pos + 8, pos + 8 + len);
  const bodyLength = Number(A.Message.decode(header).bodyLength);
  messages.push({ header, body: stream.subarray(pos + 8 + len, pos + 8 + len + bodyLength) });
  pos += 8 + len + bodyLength;
}
const [schema, batch] = messages;

const latencies = [];
let acked = 0, errors = 0;

// --follow: per bucket, the batches written and not yet seen by its
// follower ({ t: write time, end: rows written up to and with it }).
const followLatencies = [];
const written = Array.from({ length: partitions }, () => ({ rows: 0, pending: [] }));
let followers = null;
if (o.follow) {
  followers = new Worker(new URL(import.meta.url), { workerData: { flight: o.flight, topic, buckets: clients } });
  let ready;
  const following = new Promise((resolve) => { ready = resolve; });
  followers.on("message", ({ ready: isReady, bucket, seen, t }) => {
    if (isReady) return ready();
    const w = written[bucket];
    while (w.pending.length && w.pending[0].end <= seen) followLatencies.push(Number(t - w.pending.shift().t) / 1e6);
  });
  await following;
}
const deadline = Date.now() + seconds * 1000;

function runClient(i) {
  return new Promise((resolve) => {
    const c = new FlightService(o.flight, grpc.credentials.createInsecure());
    const call = c.DoPut();
    const sent = [];
    const send = () => {
      const t = process.hrtime.bigint();
      sent.push(t);
      if (o.follow) {
        const w = written[i % partitions];
        w.rows += rows;
        w.pending.push({ t, end: w.rows });
      }
      call.write({ data_header: batch.header, data_body: batch.body });
    };
    call.write({
      flight_descriptor: { type: "CMD", cmd: Buffer.from(JSON.stringify({ append: { table: topic, bucket: i % partitions } })) },
      data_header: schema.header,
    });
    for (let k = 0; k < inflight; k++) send();
    call.on("data", () => {
      latencies.push(Number(process.hrtime.bigint() - sent.shift()) / 1e6);
      acked++;
      if (Date.now() < deadline) send();
      else if (sent.length === 0) call.end();
    });
    call.on("error", () => { errors++; });
    call.on("status", () => { c.close(); resolve(); });
  });
}

const start = Date.now();
await Promise.all(Array.from({ length: clients }, (_, i) => runClient(i)));
const elapsed = (Date.now() - start) / 1000;
// Followers get up to 10 s to see the last batches, then are cancelled.
for (let k = 0; k < 1000 && written.some((w) => w.pending.length); k++) await new Promise((r) => setTimeout(r, 10));
const unseen = written.reduce((n, w) => n + w.pending.length, 0);
if (followers) {
  const exited = new Promise((resolve) => followers.on("exit", resolve));
  followers.postMessage("stop");
  await exited;
}
const q = (xs, p) => {
  xs.sort((a, b) => a - b);
  return xs.length ? +xs[Math.min(xs.length - 1, Math.floor(p * xs.length))].toFixed(2) : 0;
};
console.log(JSON.stringify({
  batches_per_s: +(acked / elapsed).toFixed(1),
  rows_per_s: Math.round((acked * rows) / elapsed),
  mb_per_s: +((acked * rows * rowBytes) / elapsed / 1e6).toFixed(1),
  p50_ms: q(latencies, 0.5), p99_ms: q(latencies, 0.99), errors,
  ...(o.follow ? { follow_p50_ms: q(followLatencies, 0.5), follow_p90_ms: q(followLatencies, 0.9), follow_p99_ms: q(followLatencies, 0.99), follow_max_ms: q(followLatencies, 1), unseen } : {}),
}));
