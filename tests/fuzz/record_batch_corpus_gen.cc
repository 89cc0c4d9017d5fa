// Writes the record batch fuzzer's seed corpus: small batches with keys,
// null values, headers, and each compression codec.
// Usage: record_batch_corpus_gen DIR
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "wal/record_batch.h"

int main(int argc, char** argv) {
  using namespace weir::wal;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  std::vector<Record> records(3);
  records[0].timestamp = 1700000000000;
  records[0].key = "k";
  records[0].value = "hello";
  records[1].timestamp = 1700000000005;
  records[1].value = std::nullopt;
  records[1].headers.push_back({"h", std::string("v")});
  records[1].headers.push_back({"n", std::nullopt});
  records[2].timestamp = 1700000000001;
  records[2].value = std::string(300, 'x');
  int written = 0;
  for (int16_t codec = 0; codec <= 4; ++codec) {
    EncodeOptions eo;
    eo.base_offset = 0;
    eo.attributes = codec;
    if (codec == 2) {
      eo.producer_id = 7;
      eo.producer_epoch = 0;
      eo.base_sequence = 0;
    }
    std::string batch;
    if (!EncodeRecordBatch(records, eo, &batch).ok()) {
      std::fprintf(stderr, "record_batch_corpus_gen: encoding with codec %d failed\n", codec);
      return 1;
    }
    std::ofstream out(dir + "/batch_codec" + std::to_string(codec), std::ios::binary | std::ios::trunc);
    out.write(batch.data(), static_cast<std::streamsize>(batch.size()));
    if (!out.good()) {
      std::fprintf(stderr, "record_batch_corpus_gen: writing to %s failed\n", dir.c_str());
      return 1;
    }
    ++written;
  }
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
