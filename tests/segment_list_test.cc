// A stream's segment list: its lookup by time agrees with a scan of the
// segments after every kind of change.
#include "log/segment_list.h"

#include <gtest/gtest.h>

#include <random>

namespace weir::log {
namespace {

using metastore::SegmentInfo;

SegmentInfo Seg(uint64_t start, uint64_t end, int64_t last_ms) {
  SegmentInfo s;
  s.start_offset = start;
  s.end_offset = end;
  s.last_timestamp_ms = last_ms;
  s.object_key = "seg/" + std::to_string(start);
  return s;
}

// What the lookup must find: the first segment whose newest record reaches the time.
SegmentList::const_iterator Scan(const SegmentList& list, int64_t time_ms) {
  for (auto it = list.begin(); it != list.end(); ++it) {
    if (it->last_timestamp_ms >= time_ms) return it;
  }
  return list.end();
}

void ExpectLookupsAgree(const SegmentList& list, int64_t lo, int64_t hi) {
  for (int64_t t = lo; t <= hi; ++t) {
    ASSERT_EQ(list.FirstReaching(t) - list.begin(), Scan(list, t) - list.begin()) << "time " << t;
  }
}

TEST(SegmentList, EmptyFindsNothing) {
  SegmentList list;
  EXPECT_EQ(list.FirstReaching(0), list.end());
  EXPECT_EQ(list.FirstReaching(INT64_MIN), list.end());
}

TEST(SegmentList, TimesThatGoBackAreFoundAsAScanWouldFindThem) {
  SegmentList list;
  list.Assign({Seg(0, 1, 50), Seg(1, 2, 10), Seg(2, 3, 70), Seg(3, 4, 60), Seg(4, 5, 90)});
  EXPECT_EQ(list.FirstReaching(5)->start_offset, 0u);
  EXPECT_EQ(list.FirstReaching(50)->start_offset, 0u);
  EXPECT_EQ(list.FirstReaching(51)->start_offset, 2u);  // not 1 (10) nor 3 (60): 2 holds 70
  EXPECT_EQ(list.FirstReaching(70)->start_offset, 2u);
  EXPECT_EQ(list.FirstReaching(71)->start_offset, 4u);
  EXPECT_EQ(list.FirstReaching(91), list.end());
  list.EraseFront(1);  // the 50 goes: 10 no longer hides behind it
  EXPECT_EQ(list.FirstReaching(5)->start_offset, 1u);
  EXPECT_EQ(list.FirstReaching(11)->start_offset, 2u);
  list.ReplaceRun(list.begin() + 1, 2, Seg(2, 4, 65));  // a merge lowers the run's newest time
  EXPECT_EQ(list.FirstReaching(66)->start_offset, 4u);
  list.Append(Seg(5, 6, 95));
  EXPECT_EQ(list.FirstReaching(92)->start_offset, 5u);
  list.EraseFront(10);
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(list.FirstReaching(0), list.end());
}

TEST(SegmentList, RandomChangesKeepTheIndexWhole) {
  std::mt19937_64 rng(7);
  SegmentList list;
  uint64_t next = 0;
  for (int step = 0; step < 2000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 6 || list.size() < 2) {
      list.Append(Seg(next, next + 1, static_cast<int64_t>(rng() % 200)));
      ++next;
    } else if (op < 8) {
      list.EraseFront(1 + rng() % 3);
    } else if (op < 9) {
      const size_t at = rng() % (list.size() - 1);
      const size_t n = 2 + rng() % std::min<size_t>(list.size() - at - 1, 4);
      const auto first = list.begin() + static_cast<std::ptrdiff_t>(at);
      list.ReplaceRun(first, n,
                      Seg(first->start_offset, (first + static_cast<std::ptrdiff_t>(n) - 1)->end_offset,
                          static_cast<int64_t>(rng() % 200)));
    } else {
      std::vector<SegmentInfo> rows(list.begin(), list.end());
      if (!rows.empty()) rows.back().last_timestamp_ms = static_cast<int64_t>(rng() % 200);
      list.Assign(std::move(rows));
    }
    ExpectLookupsAgree(list, -1, 201);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace weir::log
