// libFuzzer target for what an S2S append session and a protobuf append
// parse from a client (src/http/s2_proto.h): S2S frames, and AppendInput
// messages. Any input: the frame decoder must take a whole frame or ask for
// more, and fail only with InvalidArgument; the AppendInput decoder must fail
// only with InvalidArgument (malformed) or OutOfRange (over the append
// limits), on the whole input and on every frame's payload.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "http/s2_proto.h"

namespace {

[[noreturn]] void Fail(const char* what, const weir::Status& st) {
  std::fprintf(stderr, "s2s_input_fuzz: %s: %s\n", what, st.ToString().c_str());
  std::abort();
}

void DecodeInput(std::string_view message) {
  auto in = weir::http::DecodeProtoAppendInput(message, weir::http::AppendLimits{});
  if (!in.ok() && in.status().code() != weir::Code::kInvalidArgument && in.status().code() != weir::Code::kOutOfRange) {
    Fail("AppendInput: unexpected error class", in.status());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view buf(reinterpret_cast<const char*>(data), size);
  DecodeInput(buf);
  while (!buf.empty()) {
    weir::http::S2sFrame frame;
    auto n = weir::http::DecodeS2sFrame(buf, &frame);
    if (!n.ok()) {
      if (n.status().code() != weir::Code::kInvalidArgument) Fail("frame: unexpected error class", n.status());
      break;
    }
    if (*n == 0) break;  // a partial frame
    if (*n > buf.size() || *n < 4 || frame.payload.size() != *n - 4) Fail("frame: bad size", weir::Status::Ok());
    if (!frame.terminal && frame.compression == 0) DecodeInput(frame.payload);
    buf.remove_prefix(*n);
  }
  return 0;
}
