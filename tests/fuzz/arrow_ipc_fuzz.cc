// libFuzzer target for what a Flight DoPut's messages go through before their
// rows are appended (src/flight): ParseMessage on every message, then, on an
// IPC stream (continuation marker, length, flatbuffer, body), the log schema
// check of the first message and ResolveBatch and LogRecords on the rest.
// Checked: no crash, leak or undefined behaviour; every refusal is
// kInvalidArgument or kNotSupported; a batch LogRecords accepts gives one
// record per row. Seeds: the Arrow-written streams of tests/flight/fixtures.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include "base/bytes.h"
#include "flight/arrow_ipc.h"
#include "flight/log_rows.h"

namespace {

using weir::Code;
using weir::Status;

void CheckRefusal(const char* what, const Status& st) {
  if (st.ok() || st.code() == Code::kInvalidArgument || st.code() == Code::kNotSupported) return;
  std::fprintf(stderr, "arrow_ipc_fuzz: %s: unexpected %s\n", what, st.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weir::flight;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  CheckRefusal("whole input", ParseMessage(in).status());
  std::optional<ArrowSchema> schema;
  std::optional<LogColumns> cols;
  size_t pos = 0;
  for (int n = 0; n < 16 && pos + 8 <= in.size(); ++n) {
    if (weir::LoadLE32(in.data() + pos) != 0xffffffffu) return 0;
    const uint32_t len = weir::LoadLE32(in.data() + pos + 4);
    if (len == 0 || len > in.size() - pos - 8) return 0;
    const std::string_view header = in.substr(pos + 8, len);
    auto m = ParseMessage(header);
    CheckRefusal("message", m.status());
    if (!m.ok()) return 0;
    const size_t body_at = pos + 8 + len;
    const size_t body_len = std::min<uint64_t>(static_cast<uint64_t>(m->body_length), in.size() - body_at);
    const std::string_view body = in.substr(body_at, body_len);
    pos = body_at + body_len;
    if (m->kind == MessageKind::kSchema) {
      if (schema) return 0;
      auto c = CheckLogSchema(*m->schema);
      CheckRefusal("schema", c.status());
      if (!c.ok()) return 0;
      schema = std::move(m->schema);
      cols = *c;
      continue;
    }
    if (!schema || m->kind != MessageKind::kRecordBatch) return 0;
    std::deque<std::string> storage;
    auto arrays = ResolveBatch(*schema, *m->batch, body, &storage);
    CheckRefusal("batch", arrays.status());
    if (!arrays.ok()) continue;
    auto records = LogRecords(*cols, *arrays, 0);
    CheckRefusal("rows", records.status());
    if (records.ok() && records->size() != static_cast<size_t>(m->batch->length)) {
      std::fprintf(stderr, "arrow_ipc_fuzz: %zu records from %lld rows\n", records->size(),
                   static_cast<long long>(m->batch->length));
      std::abort();
    }
  }
  return 0;
}
