// Producer windows: Kafka idempotence rules and their serialized form.
#include "log/producer_window.h"

#include <gtest/gtest.h>

namespace weir::log {
namespace {

ProducerBatch B(int32_t first, int32_t last, uint64_t start) {
  return ProducerBatch{first, last, start, start + static_cast<uint64_t>(last - first + 1), 10, 20};
}

TEST(ProducerWindows, NewProducerStartsAtZero) {
  ProducerWindows w;
  EXPECT_EQ(w.Check(1, 0, 0, 3)->kind, ProducerCheck::kNew);
  EXPECT_EQ(w.Check(1, 0, 4, 3).status().code(), Code::kOutOfRange);
  EXPECT_EQ(w.Check(1, -1, 0, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(w.Check(1, 0, 0, 0).status().code(), Code::kInvalidArgument);
}

TEST(ProducerWindows, SequenceDuplicateGapAndEpochs) {
  ProducerWindows w;
  w.Record(1, 0, B(0, 2, 100));
  EXPECT_EQ(w.Check(1, 0, 3, 1)->kind, ProducerCheck::kNew);
  auto dup = w.Check(1, 0, 0, 3);
  ASSERT_TRUE(dup.ok());
  EXPECT_EQ(dup->kind, ProducerCheck::kDuplicate);
  EXPECT_EQ(dup->original.start_offset, 100u);
  EXPECT_EQ(w.Check(1, 0, 0, 2).status().code(), Code::kOutOfRange);  // same seq, other count
  EXPECT_EQ(w.Check(1, 0, 4, 1).status().code(), Code::kOutOfRange);  // gap
  EXPECT_EQ(w.Check(1, 1, 0, 1)->kind, ProducerCheck::kNew);           // new epoch
  EXPECT_EQ(w.Check(1, 1, 3, 1).status().code(), Code::kOutOfRange);  // new epoch must start at 0
  w.Record(1, 1, B(0, 0, 103));
  EXPECT_EQ(w.Check(1, 0, 3, 1).status().code(), Code::kFenced);
  EXPECT_EQ(w.Check(2, 0, 0, 1)->kind, ProducerCheck::kNew);  // producers are independent
}

TEST(ProducerWindows, KeepsTheLastFiveBatches) {
  ProducerWindows w;
  for (int32_t i = 0; i < 7; ++i) w.Record(1, 0, B(i, i, static_cast<uint64_t>(i)));
  for (int32_t i = 2; i < 7; ++i) EXPECT_EQ(w.Check(1, 0, i, 1)->kind, ProducerCheck::kDuplicate) << i;
  EXPECT_EQ(w.Check(1, 0, 1, 1).status().code(), Code::kOutOfRange);
  EXPECT_EQ(w.Check(1, 0, 7, 1)->kind, ProducerCheck::kNew);
}

TEST(ProducerWindows, ForgetsTheLeastRecentProducersPastTheBound) {
  // Producer i appends at offset i; producer 0 appends again at the end, so
  // it is recent however early it started. All of it longer ago than
  // kProducerRecentWindow, but for the last two appends.
  ProducerWindows w;
  uint64_t offset = 0;
  const TimePoint then = Now();
  TimePoint now = then;
  auto append = [&](uint64_t id, int32_t seq) {
    w.Record(id, 0, ProducerBatch{seq, seq, offset, offset + 1, 0, 0}, now);
    ++offset;
  };
  for (uint64_t id = 0; id < kMaxProducersPerStream; ++id) append(id, 0);
  now = then + kProducerRecentWindow;
  append(0, 1);
  EXPECT_EQ(w.size(), kMaxProducersPerStream);
  append(kMaxProducersPerStream, 0);  // one too many: an eighth goes
  const size_t kept = kMaxProducersPerStream * 7 / 8;
  EXPECT_EQ(w.size(), kept);
  EXPECT_TRUE(w.Knows(0));                        // appended recently
  EXPECT_TRUE(w.Knows(kMaxProducersPerStream));   // the newest
  EXPECT_FALSE(w.Knows(1));                       // the least recent
  // 1025 producers, 896 kept: 1..129 went, 130 on stayed.
  EXPECT_FALSE(w.Knows(kMaxProducersPerStream + 1 - kept));
  EXPECT_TRUE(w.Knows(kMaxProducersPerStream + 2 - kept));
  // A forgotten producer starts over, as a new one.
  EXPECT_EQ(w.Check(1, 0, 0, 1)->kind, ProducerCheck::kNew);
  EXPECT_EQ(w.Check(1, 0, 1, 1).status().code(), Code::kOutOfRange);
  // The same state replayed forgets the same producers.
  auto copy = ProducerWindows::Deserialize(w.Serialize());
  ASSERT_TRUE(copy.ok());
  EXPECT_TRUE(*copy == w);
}

// Producers that appended within kProducerRecentWindow are not forgotten
// past the bound (their retries may still come), up to the hard bound.
TEST(ProducerWindows, KeepsProducersThatAppendedRecentlyPastTheBound) {
  ProducerWindows w;
  uint64_t offset = 0;
  const TimePoint start = Now();
  auto append = [&](uint64_t id, TimePoint at) {
    w.Record(id, 0, ProducerBatch{0, 0, offset, offset + 1, 0, 0}, at);
    ++offset;
  };
  // 2,000 producers within a minute: all kept, each retry a duplicate.
  for (uint64_t id = 0; id < 2000; ++id) append(id, start + std::chrono::milliseconds(id * 30));
  EXPECT_EQ(w.size(), 2000u);
  EXPECT_EQ(w.Check(0, 0, 0, 1)->kind, ProducerCheck::kDuplicate);
  // Once the first 1,500 have been idle past the window (the last 500
  // appended within it), the next append forgets down to 7/8 of the bound
  // among the idle ones, those that appended earliest first.
  const TimePoint later = start + std::chrono::milliseconds(1499 * 30) + kProducerRecentWindow;
  append(2000, later);
  EXPECT_EQ(w.size(), kMaxProducersPerStream * 7 / 8);  // 2,001 - 1,105
  EXPECT_FALSE(w.Knows(1104));
  EXPECT_TRUE(w.Knows(1105));
  EXPECT_TRUE(w.Knows(1999));
  EXPECT_TRUE(w.Knows(1500));
  EXPECT_TRUE(w.Knows(2000));
  EXPECT_FALSE(w.Knows(0));
  EXPECT_TRUE(w.Knows(1499)) << "the idle ones that appended last stay";
  // The hard bound holds even if every producer appended just now.
  ProducerWindows busy;
  const TimePoint now = Now();
  for (uint64_t id = 0; id <= kMaxRecentProducersPerStream; ++id) {
    busy.Record(id, 0, ProducerBatch{0, 0, id, id + 1, 0, 0}, now);
  }
  EXPECT_EQ(busy.size(), kMaxRecentProducersPerStream * 7 / 8);
  EXPECT_FALSE(busy.Knows(0));
  EXPECT_TRUE(busy.Knows(kMaxRecentProducersPerStream));
}

TEST(ProducerWindows, SequencesWrapAtInt32Max) {
  ProducerWindows w;
  w.Record(1, 0, B(INT32_MAX - 1, INT32_MAX, 0));
  EXPECT_EQ(w.Check(1, 0, 0, 1)->kind, ProducerCheck::kNew);
}

TEST(ProducerWindows, SerializeRoundTripAndCorruption) {
  ProducerWindows w;
  for (int32_t i = 0; i < 7; ++i) w.Record(static_cast<uint64_t>(i % 3), static_cast<int16_t>(i % 2), B(i, i, 5));
  std::string bytes = w.Serialize();
  auto back = ProducerWindows::Deserialize(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == w);
  EXPECT_TRUE(ProducerWindows::Deserialize("")->empty());
  for (size_t n = 1; n < bytes.size(); ++n) {
    EXPECT_FALSE(ProducerWindows::Deserialize(bytes.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(ProducerWindows::Deserialize(bytes + "x").ok());
}

}  // namespace
}  // namespace weir::log
