// Slot format: keys, envelope, bundle/footer layout and the verifying reader.
#include "wal/slot_format.h"

#include <gtest/gtest.h>

#include "base/bytes.h"
#include "base/crc32c.h"
#include "test_util.h"
#include "wal/record_batch.h"

namespace weir::wal {
namespace {

using testing::OneRecordBatch;
using testing::ValueOf;

TEST(SlotKey, ZeroPaddedSoKeysSortBySeq) {
  EXPECT_EQ(SlotKey("n1", 3, 42), "wal/n1/00000000000000000003/00000000000000000042");
  EXPECT_EQ(SlotPrefix("n1", 3), "wal/n1/00000000000000000003/");
  EXPECT_LT(SlotKey("n", 1, 9), SlotKey("n", 1, 10));
  EXPECT_LT(SlotKey("n", 9, 99), SlotKey("n", 10, 0));
  EXPECT_EQ(SlotKey("n", UINT64_MAX, UINT64_MAX).size(), std::string("wal/n//").size() + 40);
}

TEST(SlotKey, NodeIdValidation) {
  EXPECT_TRUE(ValidateNodeId("node-1.a_b").ok());
  for (const std::string& bad : std::vector<std::string>{"", ".", "..", "a/b", "a b", std::string(65, 'x'), std::string("a\0b", 3)}) {
    Status st = ValidateNodeId(bad);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
  }
}

TEST(Envelope, RoundTripAndEveryByteIsChecked) {
  Envelope env;
  env.kind = SlotKind::kFlight;
  env.epoch = 7;
  env.seq = 123456789;
  env.nonce = 0xdeadbeefcafef00dull;
  env.total_size = 1000;
  env.footer_offset = 900;
  env.footer_length = 100;
  std::string buf(kEnvelopeSize, '\0');
  EncodeEnvelope(env, buf.data());
  auto back = DecodeEnvelope(buf);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->epoch, 7u);
  EXPECT_EQ(back->seq, 123456789u);
  EXPECT_EQ(back->nonce, env.nonce);
  EXPECT_EQ(back->footer_offset, 900u);
  for (size_t i = 0; i < kEnvelopeSize; ++i) {
    std::string bad = buf;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    EXPECT_EQ(DecodeEnvelope(bad).status().code(), Code::kCorruption) << "byte " << i;
  }
  EXPECT_EQ(DecodeEnvelope(buf.substr(0, 59)).status().code(), Code::kCorruption);
}

// A newer version is named as such, before the CRC (whose range a later
// layout may move); reserved fields must be 0 under a CRC that holds.
TEST(Envelope, ANewerVersionIsNamedAndReservedFieldsAreZero) {
  Envelope env;
  env.kind = SlotKind::kFlight;
  env.total_size = 1000;
  env.footer_offset = 900;
  env.footer_length = 100;
  std::string buf(kEnvelopeSize, '\0');
  EncodeEnvelope(env, buf.data());
  std::string newer = buf;
  newer[4] = 2;  // version 2, the CRC left as version 1's
  auto v = DecodeEnvelope(newer);
  EXPECT_EQ(v.status().code(), Code::kCorruption);
  EXPECT_NE(v.status().message().find("unknown version 2"), std::string::npos) << v.status().ToString();
  for (size_t at : {size_t{7}, size_t{52}, size_t{55}}) {
    std::string bad = buf;
    bad[at] = 1;
    StoreLE32(bad.data() + 56, Crc32c(bad.data(), 56));  // a CRC that holds
    auto r = DecodeEnvelope(bad);
    EXPECT_EQ(r.status().code(), Code::kCorruption) << at;
    EXPECT_NE(r.status().message().find("reserved"), std::string::npos) << at << ": " << r.status().ToString();
  }
}

// A footer offset near 2^64 made offset + length wrap to the object's size:
// DecodeSlot then read past the end (std::out_of_range, an abort in recovery).
TEST(Envelope, AFooterOffsetThatWrapsIsCorruption) {
  Envelope env;
  env.kind = SlotKind::kFlight;
  env.epoch = 1;
  env.total_size = 100;
  env.footer_length = 104;
  env.footer_offset = ~uint64_t{0} - 3;  // + 104 wraps to 100
  std::string buf(100, '\0');
  EncodeEnvelope(env, buf.data());
  EXPECT_EQ(DecodeEnvelope(buf).status().code(), Code::kCorruption);
  EXPECT_EQ(DecodeSlot("k", buf).status().code(), Code::kCorruption);
}

TEST(Envelope, Poison) {
  std::string p = EncodePoison(4, 9, 77);
  ASSERT_EQ(p.size(), kEnvelopeSize);
  auto index = DecodeSlot("k", p);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->envelope.kind, SlotKind::kPoison);
  EXPECT_EQ(index->envelope.nonce, 77u);
  EXPECT_TRUE(index->chunks.empty());
}

std::string BuildThreeStreamSlot(SlotBuilder* b, std::vector<std::string>* batches) {
  // Arrival order: s5 a, s9 b, s5 c, s1 d, s9 e -> chunks s5[a c] s9[b e] s1[d].
  const std::vector<std::pair<uint64_t, std::string>> in = {{5, "a"}, {9, "b"}, {5, "c"}, {1, "d"}, {9, "e"}};
  for (const auto& [stream, v] : in) batches->push_back(OneRecordBatch(v));
  for (size_t i = 0; i < in.size(); ++i) b->Add(in[i].first, (*batches)[i], 1, 1);
  size_t predicted = b->EncodedSize();
  std::string slot = b->Finish(2, 3, 99);
  EXPECT_EQ(slot.size(), predicted);
  return slot;
}

TEST(SlotBuilder, GroupsByStreamKeepingArrivalOrder) {
  SlotBuilder b;
  std::vector<std::string> batches;
  std::string slot = BuildThreeStreamSlot(&b, &batches);
  auto index = DecodeSlot("k", slot);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->envelope.epoch, 2u);
  EXPECT_EQ(index->envelope.seq, 3u);
  ASSERT_EQ(index->chunks.size(), 3u);
  EXPECT_EQ(index->chunks[0].stream_id, 5u);
  EXPECT_EQ(index->chunks[1].stream_id, 9u);
  EXPECT_EQ(index->chunks[2].stream_id, 1u);
  EXPECT_EQ(index->chunks[0].offset, kEnvelopeSize);
  EXPECT_EQ(index->chunks[0].batch_count, 2u);
  EXPECT_EQ(index->chunks[0].record_count, 2u);
  // Positions point at each piece, object-absolute.
  const std::vector<std::string> values = {"a", "b", "c", "d", "e"};
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(ValueOf(std::string_view(slot).substr(b.position(i), batches[i].size())), values[i]);
  }
  EXPECT_LT(b.position(0), b.position(2));  // a before c in stream 5
  EXPECT_LT(b.position(2), b.position(1));  // stream 5's chunk precedes stream 9's
}

TEST(DecodeSlot, ReportsWhereCorruptionIs) {
  SlotBuilder b;
  std::vector<std::string> batches;
  std::string slot = BuildThreeStreamSlot(&b, &batches);
  auto index = DecodeSlot("k", slot);
  ASSERT_TRUE(index.ok());
  // Every single-byte flip anywhere is detected.
  for (size_t i = 0; i < slot.size(); ++i) {
    std::string bad = slot;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    auto r = DecodeSlot("wal/x", bad);
    ASSERT_FALSE(r.ok()) << "flip at byte " << i << " not detected";
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_NE(r.status().message().find("slot wal/x"), std::string::npos);
  }
  // A flip inside the second chunk names that chunk and its stream.
  std::string bad = slot;
  size_t at = index->chunks[1].offset + 30;
  bad[at] = static_cast<char>(bad[at] ^ 1);
  auto r = DecodeSlot("wal/x", bad);
  EXPECT_NE(r.status().message().find("chunk 1 (stream 9)"), std::string::npos) << r.status().message();
  // A flip in the footer names the footer.
  bad = slot;
  bad[slot.size() - 10] = static_cast<char>(bad[slot.size() - 10] ^ 1);
  r = DecodeSlot("wal/x", bad);
  EXPECT_NE(r.status().message().find("footer"), std::string::npos) << r.status().message();
  // Truncation.
  r = DecodeSlot("wal/x", slot.substr(0, slot.size() - 1));
  EXPECT_NE(r.status().message().find("envelope says"), std::string::npos) << r.status().message();
  for (size_t n = 0; n < slot.size(); n += 7) EXPECT_FALSE(DecodeSlot("k", slot.substr(0, n)).ok());
}

TEST(DecodeSlot, ChecksRecordBatchesInsideAChunk) {
  // A chunk whose CRC matches but whose batch CRC does not: the batch check catches it.
  std::string batch = OneRecordBatch("payload");
  batch[40] = static_cast<char>(batch[40] ^ 1);  // inside the CRC-covered area
  SlotBuilder b;
  b.Add(1, batch, 1, 1);
  std::string slot = b.Finish(1, 0, 1);
  auto r = DecodeSlot("k", slot);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("CRC"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("chunk 0 (stream 1)"), std::string::npos) << r.status().message();
}

TEST(DecodeSlot, FooterCountsMustMatch) {
  std::string batch = OneRecordBatch("p");
  SlotBuilder b;
  b.Add(1, batch, 2, 1);  // claims two batches
  auto r = DecodeSlot("k", b.Finish(1, 0, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("footer says 2 batches"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace weir::wal
