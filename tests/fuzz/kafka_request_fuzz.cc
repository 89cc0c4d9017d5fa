// libFuzzer target for the Kafka request decoder (src/kafka/api_table.h).
// Any input: DecodeRequest must fail cleanly (InvalidArgument or NotSupported)
// or succeed; whatever decodes must encode again, decode to an equal request,
// and encode to the same bytes a second time.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kafka/api_table.h"

namespace {

[[noreturn]] void Fail(const char* what, const weir::Status& st) {
  std::fprintf(stderr, "kafka_request_fuzz: %s: %s\n", what, st.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weir::kafka;
  std::string_view frame(reinterpret_cast<const char*>(data), size);
  auto first = DecodeRequest(frame);
  if (!first.ok()) {
    weir::Code code = first.status().code();
    if (code != weir::Code::kInvalidArgument && code != weir::Code::kNotSupported) {
      Fail("unexpected error class", first.status());
    }
    return 0;
  }
  auto bytes = EncodeRequest(first->header, first->body);
  if (!bytes.ok()) Fail("a decoded request does not encode", bytes.status());
  auto second = DecodeRequest(*bytes);
  if (!second.ok()) Fail("a re-encoded request does not decode", second.status());
  if (!(*second == *first)) Fail("decode(encode(request)) differs from request", weir::Status::Ok());
  auto again = EncodeRequest(second->header, second->body);
  if (!again.ok() || *again != *bytes) Fail("encoding is not stable", again.status());
  return 0;
}
