// A closed-loop Arrow Flight DoPut load generator against a running weir
// (docs/benchmarks.md, "Arrow Flight DoPut"): CLIENTS calls, each a DoPut
// stream keeping INFLIGHT batches of ROWS rows of ROW_BYTES-byte values
// unanswered, into a table's bucket (one per client, round robin). One batch
// is encoded once by Apache Arrow and sent again and again, so the client
// costs little. Prints one JSON line: batches/s, rows/s, MB/s acknowledged,
// and the batch ack latency p50/p99 (from write to its PutResult).
//   node bench.mjs --flight HOST:PORT --kafka HOST:PORT [--clients 8] [--inflight 4]
//        [--rows 900] [--row-bytes 1024] [--duration 10] [--partitions 8]
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as A from "apache-arrow";
import { Kafka, logLevel } from "kafkajs";

const { values: o } = parseArgs({
  options: {
    flight: { type: "string" }, kafka: { type: "string" },
    clients: { type: "string", default: "8" }, inflight: { type: "string", default: "4" },
    rows: { type: "string", default: "900" }, "row-bytes": { type: "string", default: "1024" },
    duration: { type: "string", default: "10" }, partitions: { type: "string", default: "8" },
  },
});
if (!o.flight || !o.kafka) {
  console.error("usage: node bench.mjs --flight HOST:PORT --kafka HOST:PORT [options]");
  process.exit(2);
}
const clients = Number(o.clients), inflight = Number(o.inflight), rows = Number(o.rows);
const rowBytes = Number(o["row-bytes"]), seconds = Number(o.duration), partitions = Number(o.partitions);

const here = dirname(fileURLToPath(import.meta.url));
const FlightService = grpc.loadPackageDefinition(
  protoLoader.loadSync(join(here, "../../../src/flight/flight.proto"), { keepCase: true, longs: String, defaults: true }),
).arrow.flight.protocol.FlightService;

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
const deadline = Date.now() + seconds * 1000;

function runClient(i) {
  return new Promise((resolve) => {
    const c = new FlightService(o.flight, grpc.credentials.createInsecure());
    const call = c.DoPut();
    const sent = [];
    const send = () => {
      sent.push(process.hrtime.bigint());
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
latencies.sort((a, b) => a - b);
const q = (p) => (latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] : 0);
console.log(JSON.stringify({
  batches_per_s: +(acked / elapsed).toFixed(1),
  rows_per_s: Math.round((acked * rows) / elapsed),
  mb_per_s: +((acked * rows * rowBytes) / elapsed / 1e6).toFixed(1),
  p50_ms: +q(0.5).toFixed(2), p99_ms: +q(0.99).toFixed(2), errors,
}));
