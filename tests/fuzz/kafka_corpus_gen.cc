// Writes the Kafka request fuzzer's seed corpus: one valid frame body per
// supported API and version (from tests/kafka_samples.h), plus a flexible
// ApiVersions v3 frame for the unsupported-version path.
// Usage: kafka_corpus_gen DIR
#include <cstdio>
#include <fstream>
#include <string>

#include "kafka_samples.h"

int main(int argc, char** argv) {
  using namespace weir::kafka;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  int written = 0;
  bool ok = true;
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ok = ok && out.good();
    ++written;
  };
  samples::ForEachApiVersion([&](ApiKey key, int16_t v) {
    write(std::string(FindApi(static_cast<int16_t>(key))->name) + "_v" + std::to_string(v),
          samples::RequestFrame(key, v));
  });
  // ApiVersions v3 as librdkafka sends it: header v2, compact strings, tags.
  static const char kApiVersionsV3[] =
      "\x00\x12\x00\x03\x00\x00\x00\x01\x00\x07rdkafka\x00"
      "\x0blibrdkafka\x06"
      "2.0.0\x00";
  write("ApiVersions_v3_flexible", std::string(kApiVersionsV3, sizeof(kApiVersionsV3) - 1));
  if (!ok) {
    std::fprintf(stderr, "kafka_corpus_gen: writing to %s failed\n", dir.c_str());
    return 1;
  }
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
