// The rows of a log table as Arrow columns (docs/flight.md): each row is one
// record, as a Kafka record is: `value` (binary or utf8, null = a tombstone),
// and optionally `key` (binary or utf8), `timestamp` (timestamp of any unit,
// or int64 milliseconds; null = the time the node took the batch) and
// `headers` (a map of utf8 or binary names to binary or utf8 values). Any
// other column is refused, so nothing a writer sends is dropped unseen.
// Stateless functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "flight/arrow_ipc.h"
#include "wal/record_batch.h"

namespace weir::flight {

// Where each log column is in a schema (-1: absent).
struct LogColumns {
  int key = -1;
  int value = -1;
  int timestamp = -1;
  int headers = -1;
};

// kInvalidArgument naming the column for a schema that is not a log table's.
Result<LogColumns> CheckLogSchema(const ArrowSchema& schema);

// One record per row of a resolved batch (ResolveBatch), viewing the
// batch's buffers (the body, or ResolveBatch's storage: they must outlive
// the records). A row shaped like an S2 command record (one header, with an
// empty name) is refused, as it is from Kafka producers. `now_ms` stands in
// for null or missing timestamps.
Result<std::vector<wal::RecordView>> LogRecords(const LogColumns& cols, const std::vector<ArrayView>& columns,
                                                int64_t now_ms);

// The other way, for DoGet: records as Arrow IPC messages of the log-table
// read schema: offset (int64), timestamp (timestamp[ms]), key and value
// (binary, nullable) and headers (map of binary to nullable binary; empty
// for none), all little-endian, version V5, uncompressed.
struct ReadRow {
  uint64_t offset = 0;
  const wal::Record* record = nullptr;
};
struct IpcBytes {
  std::string header;  // a Message flatbuffer (FlightData.data_header)
  std::string body;    // FlightData.data_body
};
// The Schema message.
std::string LogReadSchemaMessage();
// One RecordBatch message of `rows`.
IpcBytes LogReadBatchMessage(const std::vector<ReadRow>& rows);
// A Message as a stream carries it (SchemaResult.schema, FlightInfo.schema):
// 0xFFFFFFFF, its length (int32 LE, padded to 8), the flatbuffer, padding.
std::string EncapsulatedMessage(std::string_view header);

// The bytes of keys, values and header names and values the rows of a
// resolved batch hold: what their Kafka batches would copy.
uint64_t LogRecordsBytes(const LogColumns& cols, const std::vector<ArrayView>& columns);
// The header entries the rows of a resolved batch hold, all rows together
// (empty names and values cost no bytes, so LogRecordsBytes does not bound them).
uint64_t LogRecordsHeaderCount(const LogColumns& cols, const std::vector<ArrayView>& columns);

// Kafka's default partitioner: murmur2 of the key bytes, made positive,
// modulo the partitions. AppendTable routes keyed rows with it, so a key lands
// in the bucket a Kafka producer would send it to.
uint32_t KafkaPartitionOf(std::string_view key, uint32_t partitions);

}  // namespace weir::flight
