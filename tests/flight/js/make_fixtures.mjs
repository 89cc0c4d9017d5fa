// Writes the Arrow IPC streams that tests/flight_ipc_test.cc and the
// arrow_ipc fuzzer's seed corpus read (tests/flight/fixtures/*.arrows), made
// by Apache Arrow's own JavaScript library so the reader is checked against
// real Arrow output. Run again after changing them: node make_fixtures.mjs
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import * as A from "apache-arrow";

const out = join(dirname(fileURLToPath(import.meta.url)), "../fixtures");
const enc = new TextEncoder();
const HEADERS = new A.Map_(new A.Field("entries", new A.Struct([
  new A.Field("key", new A.Utf8(), false),
  new A.Field("value", new A.Binary(), true),
]), false));

function write(name, batches) {
  // One IPC stream: the schema, then each batch.
  const writer = new A.RecordBatchStreamWriter();
  for (const t of batches) for (const b of t.batches) writer.write(b);
  writer.finish();
  writeFileSync(join(out, name), writer.toUint8Array(true));
}

// Every log column, with nulls in each; two batches.
const logRows = (rows) => new A.Table({
  key: A.vectorFromArray(rows.map((r) => r[0]), new A.Utf8()),
  value: A.vectorFromArray(rows.map((r) => (r[1] == null ? null : enc.encode(r[1]))), new A.Binary()),
  timestamp: A.vectorFromArray(rows.map((r) => r[2]), new A.TimestampMillisecond()),
  headers: A.vectorFromArray(rows.map((r) => (r[3] == null ? null
    : new Map(Object.entries(r[3]).map(([k, v]) => [k, v == null ? null : enc.encode(v)])))), HEADERS),
});
write("log_rows.arrows", [
  logRows([["k1", "one", 1700000000001, { trace: "t1", empty: null }], [null, "two", null, null],
    ["k3", null, 1700000000003, { a: "x", b: "y" }]]),
  logRows([["k4", "four", -1500, {}]]),
]);

// Large offsets, a nanosecond timestamp, the value first.
write("large_ns.arrows", [new A.Table({
  value: A.vectorFromArray(["alpha", "", "gamma"], new A.LargeUtf8()),
  key: A.vectorFromArray([enc.encode("a"), null, enc.encode("c")], new A.LargeBinary()),
  timestamp: A.vectorFromArray([1700000000123, -2500, null], new A.TimestampNanosecond()),
})]);

// Timestamps as int64 milliseconds.
write("int64_ts.arrows", [new A.Table({
  value: A.vectorFromArray(["x", "y"], new A.Utf8()),
  timestamp: A.vectorFromArray([1700000000000n, 1700000000001n], new A.Int64()),
})]);

// Not a log table: a float column (the reader must refuse it by name).
write("float_value.arrows", [new A.Table({ value: A.vectorFromArray([1.5, 2.5], new A.Float64()) })]);
