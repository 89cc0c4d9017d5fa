// Consumer-group coordinator: the classic Kafka membership protocol driven
// with a fake clock (every call takes `now`), scenario by scenario, then a
// randomized simulation of several clients that checks invariants.
#include "kafka/group_coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "base/utf8.h"

namespace weir::kafka {
namespace {

using Assignments = std::vector<std::pair<std::string, std::string>>;

TimePoint T(int64_t ms) { return TimePoint{} + std::chrono::milliseconds(ms); }

GroupOptions TestOptions() {
  GroupOptions o;
  o.initial_rebalance_delay = Duration::zero();
  o.member_id_seed = 42;
  return o;
}

// Captures a callback's result and counts its invocations.
template <typename R>
class Reply {
 public:
  std::function<void(R)> Callback() const {
    return [s = s_](R r) {
      ++s->calls;
      s->value = std::move(r);
    };
  }
  bool done() const { return s_->calls > 0; }
  int calls() const { return s_->calls; }
  const R& operator*() const { return s_->value; }
  const R* operator->() const { return &s_->value; }

 private:
  struct State {
    int calls = 0;
    R value{};
  };
  std::shared_ptr<State> s_ = std::make_shared<State>();
};
using JoinReply = Reply<JoinGroupResult>;
using SyncReply = Reply<SyncGroupResult>;

std::vector<std::string> Ids(const std::vector<JoinGroupMember>& members) {
  std::vector<std::string> ids;
  for (const auto& m : members) ids.push_back(m.member_id);
  return ids;
}

class GroupTest : public ::testing::Test {
 protected:
  void Reset(GroupOptions o) { c_ = std::make_unique<GroupCoordinator>(o); }

  static JoinGroupInput In(std::string member_id, std::string meta = "m", int16_t version = 3) {
    JoinGroupInput in;
    in.group_id = "g";
    in.session_timeout_ms = 10000;
    in.rebalance_timeout_ms = 30000;
    in.member_id = std::move(member_id);
    in.protocol_type = "consumer";
    in.protocols = {{"range", std::move(meta)}};
    in.version = version;
    in.client_id = "client";
    in.client_host = "/10.0.0.1";
    return in;
  }
  static JoinGroupInput Static(std::string member_id, std::string instance, std::string meta = "m") {
    JoinGroupInput in = In(std::move(member_id), std::move(meta), 5);
    in.group_instance_id = std::move(instance);
    return in;
  }
  JoinReply Join(const JoinGroupInput& in, int64_t t) {
    JoinReply r;
    c_->JoinGroup(in, T(t), r.Callback());
    return r;
  }
  JoinReply Join(std::string member_id, int64_t t, std::string meta = "m") {
    return Join(In(std::move(member_id), std::move(meta)), t);
  }
  SyncReply Sync(std::string member_id, int32_t generation, Assignments assignments, int64_t t,
                 std::optional<std::string> instance = std::nullopt) {
    SyncGroupInput in;
    in.group_id = "g";
    in.generation_id = generation;
    in.member_id = std::move(member_id);
    in.group_instance_id = std::move(instance);
    in.assignments = std::move(assignments);
    SyncReply r;
    c_->SyncGroup(in, T(t), r.Callback());
    return r;
  }
  int16_t Hb(const std::string& member_id, int32_t generation, int64_t t,
             std::optional<std::string> instance = std::nullopt) {
    return c_->Heartbeat("g", generation, member_id, instance, T(t));
  }
  LeaveGroupResult Leave(std::string member_id, int64_t t, int16_t version = 1) {
    LeaveGroupInput in;
    in.group_id = "g";
    in.members = {LeaveGroupMember{std::move(member_id), std::nullopt}};
    in.version = version;
    return c_->LeaveGroup(in, T(t));
  }
  GroupDescription Describe(std::string_view group = "g") {
    auto d = c_->DescribeGroup(group);
    EXPECT_TRUE(d.has_value()) << group;
    return d ? *d : GroupDescription{};
  }

  // A (leader) and B in a Stable group at generation 2, both synced at `t`.
  std::pair<std::string, std::string> StableTwo(int64_t t) {
    auto a = Join("", t, "ma");
    EXPECT_EQ(a->error_code, kErrNone);
    std::string A = a->member_id;
    EXPECT_EQ(Sync(A, 1, {{A, "a-only"}}, t)->error_code, kErrNone);
    auto b = Join("", t, "mb");
    auto a2 = Join(A, t, "ma");
    EXPECT_TRUE(b.done() && a2.done());
    EXPECT_EQ(b->generation_id, 2);
    std::string B = b->member_id;
    auto sb = Sync(B, 2, {}, t);
    EXPECT_EQ(Sync(A, 2, {{A, "pa"}, {B, "pb"}}, t)->assignment, "pa");
    EXPECT_EQ(sb->assignment, "pb");
    EXPECT_EQ(Describe().state, GroupState::kStable);
    return {A, B};
  }

  std::unique_ptr<GroupCoordinator> c_ = std::make_unique<GroupCoordinator>(TestOptions());
};

// ---- The main flow -------------------------------------------------------------

TEST_F(GroupTest, TwoMembersSyncHeartbeatThenAThirdJoinRebalancesEveryone) {
  auto a = Join("", 0, "ma");
  ASSERT_TRUE(a.done());  // initial delay 0: the first rebalance completes at once
  EXPECT_EQ(a->error_code, kErrNone);
  EXPECT_EQ(a->generation_id, 1);
  EXPECT_EQ(a->protocol_name, "range");
  EXPECT_EQ(a->protocol_type, "consumer");
  EXPECT_EQ(a->leader, a->member_id);
  EXPECT_EQ(a->member_id.rfind("client-", 0), 0u) << a->member_id;
  const std::string A = a->member_id;
  ASSERT_EQ(a->members.size(), 1u);
  EXPECT_EQ(a->members[0].metadata, "ma");
  EXPECT_EQ(Describe().state, GroupState::kCompletingRebalance);
  EXPECT_EQ(Hb(A, 1, 50), kErrNone);  // as Kafka: heartbeats between JoinGroup and SyncGroup are fine

  auto sa = Sync(A, 1, {{A, "everything"}}, 100);
  ASSERT_TRUE(sa.done());
  EXPECT_EQ(sa->error_code, kErrNone);
  EXPECT_EQ(sa->assignment, "everything");
  EXPECT_EQ(Describe().state, GroupState::kStable);

  // B joins: a rebalance starts and waits for A.
  auto b = Join("", 200, "mb");
  EXPECT_FALSE(b.done());
  EXPECT_EQ(Describe().state, GroupState::kPreparingRebalance);
  EXPECT_EQ(Hb(A, 1, 300), kErrRebalanceInProgress);
  auto a2 = Join(A, 400, "ma");
  ASSERT_TRUE(a2.done() && b.done());
  const std::string B = b->member_id;
  EXPECT_NE(A, B);
  for (const auto* r : {&*a2, &*b}) {
    EXPECT_EQ(r->error_code, kErrNone);
    EXPECT_EQ(r->generation_id, 2);
    EXPECT_EQ(r->leader, A);
  }
  EXPECT_EQ(Ids(a2->members), (std::vector<std::string>{A, B}));
  EXPECT_EQ(a2->members[1].metadata, "mb");
  EXPECT_TRUE(b->members.empty());

  // The follower syncs first and waits for the leader's assignment.
  auto sb = Sync(B, 2, {}, 500);
  EXPECT_FALSE(sb.done());
  EXPECT_EQ(Hb(B, 2, 550), kErrNone);
  auto sa2 = Sync(A, 2, {{A, "p0"}, {B, "p1"}}, 600);
  ASSERT_TRUE(sa2.done() && sb.done());
  EXPECT_EQ(sa2->assignment, "p0");
  EXPECT_EQ(sb->assignment, "p1");
  EXPECT_EQ(sb->protocol_name, "range");
  EXPECT_EQ(Hb(A, 2, 700), kErrNone);
  EXPECT_EQ(Hb(B, 2, 700), kErrNone);
  EXPECT_EQ(Hb(B, 1, 700), kErrIllegalGeneration);

  // A third member: both heartbeats say rejoin; everyone does; generation 3.
  auto cj = Join("", 800, "mc");
  EXPECT_FALSE(cj.done());
  EXPECT_EQ(Hb(A, 2, 900), kErrRebalanceInProgress);
  EXPECT_EQ(Hb(B, 2, 900), kErrRebalanceInProgress);
  auto a3 = Join(A, 1000, "ma");
  EXPECT_FALSE(a3.done());
  auto b3 = Join(B, 1000, "mb");
  ASSERT_TRUE(a3.done() && b3.done() && cj.done());
  EXPECT_EQ(a3->generation_id, 3);
  EXPECT_EQ(b3->generation_id, 3);
  EXPECT_EQ(cj->generation_id, 3);
  EXPECT_EQ(Ids(a3->members), (std::vector<std::string>{A, B, cj->member_id}));
  for (int calls : {a.calls(), a2.calls(), a3.calls(), b.calls(), b3.calls(), cj.calls(), sa.calls(), sa2.calls(),
                    sb.calls()}) {
    EXPECT_EQ(calls, 1);
  }
  EXPECT_EQ(c_->Stats().rebalances_completed, 3u);
}

TEST_F(GroupTest, InitialDelayIsExtendedWhileMembersArriveWithinTheRebalanceTimeout) {
  GroupOptions o = TestOptions();
  o.initial_rebalance_delay = std::chrono::seconds(3);
  Reset(o);
  JoinGroupInput in = In("");
  in.rebalance_timeout_ms = 10000;
  auto a = Join(in, 0);
  auto b = Join(in, 1000);
  c_->Tick(T(2999));
  EXPECT_FALSE(a.done());
  c_->Tick(T(3000));  // B arrived during the delay: wait another 3 s
  EXPECT_FALSE(a.done());
  EXPECT_EQ(Describe().state, GroupState::kPreparingRebalance);
  auto cj = Join(in, 5000);
  c_->Tick(T(6000));  // and again for C
  EXPECT_FALSE(a.done());
  c_->Tick(T(8999));
  EXPECT_FALSE(a.done());
  c_->Tick(T(9000));  // nobody new since 6000: complete
  ASSERT_TRUE(a.done() && b.done() && cj.done());
  EXPECT_EQ(a->generation_id, 1);
  EXPECT_EQ(a->members.size(), 3u);

  // Members arriving every 2 s cannot hold it past the rebalance timeout.
  JoinGroupInput in2 = in;
  in2.group_id = "h";
  std::vector<JoinReply> joins;
  int64_t t = 100000;
  joins.push_back(Join(in2, t));
  for (int64_t at = t + 2000; at <= t + 12000; at += 2000) {
    c_->Tick(T(at - 1));
    if (joins.front().done()) break;
    joins.push_back(Join(in2, at));
  }
  ASSERT_TRUE(joins.front().done());
  EXPECT_EQ(joins.front()->generation_id, 1);
  // Joined at t, +2, ..., +10 s; the one arriving at the deadline (+10 s) completes it.
  EXPECT_EQ(joins.size(), 6u);
  EXPECT_EQ(joins.front()->members.size(), 6u);
  for (auto& j : joins) EXPECT_TRUE(j.done());
}

TEST_F(GroupTest, AGroupReformingFromEmptyWaitsTheInitialDelayOnce) {
  GroupOptions o = TestOptions();
  o.initial_rebalance_delay = std::chrono::seconds(3);
  Reset(o);
  auto a = Join("", 0);
  c_->Tick(T(3000));
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a->generation_id, 1);
  EXPECT_EQ(Leave(a->member_id, 4000).error_code, kErrNone);
  ASSERT_EQ(Describe().state, GroupState::kEmpty);
  // As in Kafka, only a new group (generation 0) extends the delay per
  // arrival; here the second member's arrival does not push it to 105 s.
  auto a2 = Join("", 100000);
  auto b = Join("", 102000);
  c_->Tick(T(102999));
  EXPECT_FALSE(a2.done());
  c_->Tick(T(103000));
  ASSERT_TRUE(a2.done() && b.done());
  EXPECT_EQ(a2->members.size(), 2u);
}

TEST_F(GroupTest, MemberIdRequiredFlow) {
  // v4+: a first join gets an id and must come back with it.
  auto first = Join(In("", "m", 4), 0);
  ASSERT_TRUE(first.done());
  EXPECT_EQ(first->error_code, kErrMemberIdRequired);
  EXPECT_EQ(first->generation_id, -1);
  const std::string A = first->member_id;
  EXPECT_EQ(A.rfind("client-", 0), 0u) << A;
  EXPECT_EQ(A.size(), std::string("client-").size() + 36);  // a UUID
  auto d = Describe();
  EXPECT_EQ(d.state, GroupState::kEmpty);
  EXPECT_EQ(d.pending_member_ids, 1u);
  EXPECT_TRUE(d.members.empty());
  EXPECT_EQ(Hb(A, 0, 10), kErrUnknownMemberId);  // not a member yet

  auto again = Join(In(A, "m", 4), 20);
  ASSERT_TRUE(again.done());
  EXPECT_EQ(again->error_code, kErrNone);
  EXPECT_EQ(again->member_id, A);
  EXPECT_EQ(again->leader, A);
  EXPECT_EQ(again->generation_id, 1);
  EXPECT_EQ(Sync(A, 1, {{A, "x"}}, 30)->error_code, kErrNone);

  // v0-3 are added at once.
  JoinGroupInput old = In("", "m", 3);
  old.group_id = "old";
  auto o = Join(old, 0);
  EXPECT_EQ(o->error_code, kErrNone);
  EXPECT_FALSE(o->member_id.empty());

  // A pending id holds a rebalance until it is used...
  auto b = Join(In("", "m", 5), 40);
  ASSERT_EQ(b->error_code, kErrMemberIdRequired);
  EXPECT_EQ(Describe().state, GroupState::kStable);  // a pending id alone starts nothing
  auto a2 = Join(In(A, "m", 5), 50);                 // the leader rejoins: rebalance
  EXPECT_FALSE(a2.done());
  auto b2 = Join(In(b->member_id, "m", 5), 60);
  ASSERT_TRUE(a2.done() && b2.done());
  EXPECT_EQ(a2->generation_id, 2);
  EXPECT_EQ(a2->members.size(), 2u);

  // ...and expires after the session timeout if never used.
  auto lost = Join(In("", "m", 4), 100);
  ASSERT_EQ(lost->error_code, kErrMemberIdRequired);
  EXPECT_EQ(Describe().pending_member_ids, 1u);
  c_->Tick(T(100 + 9999));
  EXPECT_EQ(Describe().pending_member_ids, 1u);
  c_->Tick(T(100 + 10000));
  EXPECT_EQ(Describe().pending_member_ids, 0u);
  auto late = Join(In(lost->member_id, "m", 4), 20000);
  EXPECT_EQ(late->error_code, kErrUnknownMemberId);

  // A member id for a group that does not exist.
  JoinGroupInput ghost = In("client-1234", "m", 4);
  ghost.group_id = "nope";
  EXPECT_EQ(Join(ghost, 0)->error_code, kErrUnknownMemberId);
  EXPECT_FALSE(c_->DescribeGroup("nope").has_value());
}

// ---- Membership changes ----------------------------------------------------------

TEST_F(GroupTest, SessionExpiryRemovesTheMemberAndRebalances) {
  auto [A, B] = StableTwo(0);
  EXPECT_EQ(Hb(A, 2, 5000), kErrNone);
  EXPECT_EQ(Hb(A, 2, 9000), kErrNone);
  c_->Tick(T(9999));
  EXPECT_EQ(Describe().members.size(), 2u);
  c_->Tick(T(10000));  // B's session (10 s since its sync) ran out
  auto d = Describe();
  EXPECT_EQ(d.state, GroupState::kPreparingRebalance);
  ASSERT_EQ(d.members.size(), 1u);
  EXPECT_EQ(d.members[0].member_id, A);
  EXPECT_EQ(c_->Stats().members_expired, 1u);
  EXPECT_EQ(Hb(B, 2, 10001), kErrUnknownMemberId);
  EXPECT_EQ(Hb(A, 2, 10001), kErrRebalanceInProgress);
  auto a = Join(A, 10002, "ma");
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a->generation_id, 3);
  EXPECT_EQ(Ids(a->members), std::vector<std::string>{A});

  // The last member expiring empties the group.
  EXPECT_EQ(Sync(A, 3, {}, 10003)->error_code, kErrNone);
  c_->Tick(T(20003));
  d = Describe();
  EXPECT_EQ(d.state, GroupState::kEmpty);
  EXPECT_EQ(d.generation_id, 4);
  EXPECT_TRUE(d.leader.empty());
  EXPECT_TRUE(d.protocol_name.empty());
}

// librdkafka and kafkajs send no heartbeat while waiting in SyncGroup: a
// follower answered REBALANCE_IN_PROGRESS there (the leader expired or left
// before it synced) starts a new session, as in Kafka, instead of being
// removed with the leader in the same tick.
TEST_F(GroupTest, FollowersWaitingInSyncOutliveALeaderThatNeverSyncs) {
  auto [A, B] = StableTwo(0);
  auto a = Join(A, 1000, "ma");
  auto b = Join(B, 1000, "mb");
  ASSERT_TRUE(a.done() && b.done());
  ASSERT_EQ(b->generation_id, 3);
  auto sb = Sync(B, 3, {}, 1100);  // waits for the leader, which never syncs
  EXPECT_FALSE(sb.done());
  c_->Tick(T(11000));  // A's session (10 s since the join) ran out
  ASSERT_TRUE(sb.done());
  EXPECT_EQ(sb->error_code, kErrRebalanceInProgress);
  auto d = Describe();
  ASSERT_EQ(d.members.size(), 1u);
  EXPECT_EQ(d.members[0].member_id, B);
  auto b2 = Join(B, 11050, "mb");
  ASSERT_TRUE(b2.done());
  EXPECT_EQ(b2->error_code, kErrNone);
  EXPECT_EQ(b2->generation_id, 4);
}

TEST_F(GroupTest, FollowersWaitingInSyncOutliveALeaderThatLeaves) {
  auto [A, B] = StableTwo(0);
  auto a = Join(A, 1000, "ma");
  auto b = Join(B, 1000, "mb");
  ASSERT_TRUE(a.done() && b.done());
  auto sb = Sync(B, 3, {}, 1100);
  for (int64_t t = 5000; t < 20000; t += 5000) EXPECT_EQ(Hb(A, 3, t), kErrNone);  // A alive, not syncing
  EXPECT_FALSE(sb.done());
  EXPECT_EQ(Leave(A, 20000).error_code, kErrNone);
  ASSERT_TRUE(sb.done());
  EXPECT_EQ(sb->error_code, kErrRebalanceInProgress);
  c_->Tick(T(20001));
  ASSERT_EQ(Describe().members.size(), 1u);
  EXPECT_EQ(Join(B, 20050, "mb")->error_code, kErrNone);
}

TEST_F(GroupTest, RemovedMembersGetUnknownMemberIdOnPendingCallbacks) {
  auto [A, B] = StableTwo(0);
  // B waits in JoinGroup for a rebalance (A has not rejoined) and then leaves.
  auto b = Join(B, 100, "mb2");
  EXPECT_FALSE(b.done());
  EXPECT_EQ(Leave(B, 200).error_code, kErrNone);
  ASSERT_TRUE(b.done());
  EXPECT_EQ(b->error_code, kErrUnknownMemberId);

  // A new member whose JoinGroup waits past new_member_join_timeout is dropped.
  GroupOptions o = TestOptions();
  o.new_member_join_timeout = std::chrono::seconds(20);
  Reset(o);
  auto a = Join("", 0);
  const std::string A2 = a->member_id;
  EXPECT_EQ(Sync(A2, 1, {}, 0)->error_code, kErrNone);
  JoinGroupInput slow = In("");
  slow.rebalance_timeout_ms = 60000;
  auto n = Join(slow, 1000);  // A never rejoins; the rebalance may wait 60 s
  for (int64_t t = 2000; t < 21000; t += 2000) EXPECT_EQ(Hb(A2, 1, t), kErrRebalanceInProgress);
  c_->Tick(T(20999));
  EXPECT_FALSE(n.done());
  c_->Tick(T(21000));
  ASSERT_TRUE(n.done());
  EXPECT_EQ(n->error_code, kErrUnknownMemberId);
  EXPECT_EQ(n.calls(), 1);
}

TEST_F(GroupTest, LeaveGroupRebalancesOrEmptiesTheGroup) {
  auto [A, B] = StableTwo(0);
  LeaveGroupResult r = Leave(B, 100);
  EXPECT_EQ(r.error_code, kErrNone);
  ASSERT_EQ(r.members.size(), 1u);
  EXPECT_EQ(r.members[0].error_code, kErrNone);
  EXPECT_EQ(Describe().state, GroupState::kPreparingRebalance);
  EXPECT_EQ(Hb(A, 2, 150), kErrRebalanceInProgress);
  auto a = Join(A, 200, "ma");
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a->generation_id, 3);
  EXPECT_EQ(a->members.size(), 1u);

  EXPECT_EQ(Leave(B, 300).error_code, kErrUnknownMemberId);  // v0-2: the member's error on top
  EXPECT_EQ(Leave("", 300).error_code, kErrUnknownMemberId);
  EXPECT_EQ(Leave(A, 400).error_code, kErrNone);  // the last one: Empty, next generation
  auto d = Describe();
  EXPECT_EQ(d.state, GroupState::kEmpty);
  EXPECT_EQ(d.generation_id, 4);

  LeaveGroupInput nogroup{"nope", {{"x", std::nullopt}}, 3};
  r = c_->LeaveGroup(nogroup, T(500));
  EXPECT_EQ(r.error_code, kErrNone);  // v3: per member
  EXPECT_EQ(r.members.at(0).error_code, kErrUnknownMemberId);
  LeaveGroupInput noid{"", {{"x", std::nullopt}}, 1};
  EXPECT_EQ(c_->LeaveGroup(noid, T(500)).error_code, kErrInvalidGroupId);
}

TEST_F(GroupTest, LeaveGroupV3RemovesSeveralMembersByIdOrInstance) {
  auto s1 = Join(Static("", "i1"), 0);
  ASSERT_EQ(s1->error_code, kErrNone);
  auto s2 = Join(Static("", "i2"), 0);
  auto s1b = Join(Static(s1->member_id, "i1"), 0);
  ASSERT_TRUE(s2.done() && s1b.done());
  auto dyn = Join("", 0);
  auto s1c = Join(Static(s1->member_id, "i1"), 0);
  auto s2c = Join(Static(s2->member_id, "i2"), 0);
  ASSERT_TRUE(dyn.done() && s1c.done() && s2c.done());
  ASSERT_EQ(Describe().members.size(), 3u);

  LeaveGroupInput in{"g",
                     {{"", std::string("i1")},                  // by instance id
                      {dyn->member_id, std::nullopt},           // by member id
                      {"someone-else", std::string("i2")},      // i2 is another member id: fenced
                      {"", std::string("i9")},                  // unknown instance
                      {"ghost", std::nullopt}},                 // unknown member
                     3};
  LeaveGroupResult r = c_->LeaveGroup(in, T(100));
  EXPECT_EQ(r.error_code, kErrNone);
  ASSERT_EQ(r.members.size(), 5u);
  EXPECT_EQ(r.members[0].error_code, kErrNone);
  EXPECT_EQ(r.members[0].group_instance_id, "i1");
  EXPECT_EQ(r.members[1].error_code, kErrNone);
  EXPECT_EQ(r.members[2].error_code, kErrFencedInstanceId);
  EXPECT_EQ(r.members[3].error_code, kErrUnknownMemberId);
  EXPECT_EQ(r.members[4].error_code, kErrUnknownMemberId);
  auto d = Describe();
  ASSERT_EQ(d.members.size(), 1u);
  EXPECT_EQ(d.members[0].group_instance_id, "i2");
}

TEST_F(GroupTest, RebalanceTimeoutDropsAMemberThatDoesNotRejoin) {
  auto [A, B] = StableTwo(0);
  auto cj = Join("", 1000, "mc");  // rebalance timeout: the largest of the members', 30 s
  auto a = Join(A, 1100, "ma");
  EXPECT_FALSE(a.done());
  // B keeps heartbeating (so its session is fine) but never rejoins.
  for (int64_t t = 2000; t < 31000; t += 3000) EXPECT_EQ(Hb(B, 2, t), kErrRebalanceInProgress);
  c_->Tick(T(30999));
  EXPECT_FALSE(a.done());
  c_->Tick(T(31000));
  ASSERT_TRUE(a.done() && cj.done());
  EXPECT_EQ(a->generation_id, 3);
  EXPECT_EQ(Ids(a->members), (std::vector<std::string>{A, cj->member_id}));
  EXPECT_EQ(Hb(B, 2, 31001), kErrUnknownMemberId);
  EXPECT_EQ(Hb(B, 3, 31001), kErrUnknownMemberId);
}

TEST_F(GroupTest, TheLeaderIsReelectedWhenItDoesNotRejoin) {
  auto [A, B] = StableTwo(0);
  auto cj = Join("", 1000);
  auto b = Join(B, 1000, "mb");
  c_->Tick(T(31000));  // A never came back
  ASSERT_TRUE(b.done() && cj.done());
  EXPECT_EQ(b->leader, B);
  EXPECT_EQ(Ids(b->members), (std::vector<std::string>{B, cj->member_id}));
  EXPECT_EQ(cj->leader, B);
}

TEST_F(GroupTest, MembersThatNeverSyncAreRemovedAfterTheRebalanceTimeout) {
  auto [A, B] = StableTwo(0);
  auto cj = Join("", 1000);
  auto a = Join(A, 1000, "ma");
  auto b = Join(B, 1000, "mb");
  ASSERT_TRUE(cj.done() && a.done() && b.done());
  const std::string C = cj->member_id;
  // The leader and B sync; C heartbeats but never syncs.
  auto sb = Sync(B, 3, {}, 1100);
  EXPECT_EQ(Sync(A, 3, {{A, "1"}, {B, "2"}, {C, "3"}}, 1200)->error_code, kErrNone);
  EXPECT_EQ(sb->assignment, "2");
  for (int64_t t = 2000; t <= 31000; t += 3000) {
    EXPECT_EQ(Hb(A, 3, t), kErrNone);
    EXPECT_EQ(Hb(B, 3, t), kErrNone);
    EXPECT_EQ(Hb(C, 3, t), kErrNone);
  }
  c_->Tick(T(30999));
  EXPECT_EQ(Describe().state, GroupState::kStable);
  c_->Tick(T(31000));  // 30 s after the join completed
  auto d = Describe();
  EXPECT_EQ(d.state, GroupState::kPreparingRebalance);
  EXPECT_EQ(d.members.size(), 2u);
  EXPECT_EQ(Hb(C, 3, 31001), kErrUnknownMemberId);
}

// ---- Static membership ---------------------------------------------------------------

TEST_F(GroupTest, StaticMemberRestartTakesItsOldPlaceWithoutARebalance) {
  auto s1 = Join(Static("", "i1", "m1"), 0);
  ASSERT_EQ(s1->error_code, kErrNone);  // static members skip MEMBER_ID_REQUIRED
  const std::string S1 = s1->member_id;
  EXPECT_EQ(S1.rfind("i1-", 0), 0u) << S1;
  auto s2 = Join(Static("", "i2", "m2"), 0);
  auto s1b = Join(Static(S1, "i1", "m1"), 0);
  ASSERT_TRUE(s2.done() && s1b.done());
  const std::string S2 = s2->member_id;
  ASSERT_EQ(s1b->leader, S1);
  ASSERT_EQ(s1b->generation_id, 2);
  EXPECT_EQ(s1b->members.at(1).group_instance_id, "i2");
  auto sync2 = Sync(S2, 2, {}, 0, "i2");
  EXPECT_EQ(Sync(S1, 2, {{S1, "a1"}, {S2, "a2"}}, 0, "i1")->assignment, "a1");
  EXPECT_EQ(sync2->assignment, "a2");

  // The leader's process restarts: same instance id, no member id.
  auto r = Join(Static("", "i1", "m1"), 1000);
  ASSERT_TRUE(r.done());
  EXPECT_EQ(r->error_code, kErrNone);
  EXPECT_EQ(r->generation_id, 2);  // no rebalance
  const std::string S1new = r->member_id;
  EXPECT_NE(S1new, S1);
  EXPECT_EQ(r->leader, S1);  // the old id: the new incarnation does not reassign
  EXPECT_TRUE(r->members.empty());
  auto d = Describe();
  EXPECT_EQ(d.state, GroupState::kStable);
  EXPECT_EQ(d.leader, S1new);
  auto again = Sync(S1new, 2, {}, 1100, "i1");
  EXPECT_EQ(again->error_code, kErrNone);
  EXPECT_EQ(again->assignment, "a1");  // its old assignment

  // The old incarnation is fenced everywhere.
  EXPECT_EQ(Hb(S1, 2, 1200, "i1"), kErrFencedInstanceId);
  EXPECT_EQ(Join(Static(S1, "i1", "m1"), 1200)->error_code, kErrFencedInstanceId);
  EXPECT_EQ(Sync(S1, 2, {}, 1200, "i1")->error_code, kErrFencedInstanceId);
  EXPECT_EQ(c_->ValidateCommit("g", 2, S1, std::string("i1"), T(1200)), kErrFencedInstanceId);
  EXPECT_EQ(Hb(S1, 2, 1200), kErrUnknownMemberId);  // without the instance id: just unknown
  EXPECT_EQ(Hb(S1new, 2, 1200, "i1"), kErrNone);
  EXPECT_EQ(Hb(S2, 2, 1200, "i9"), kErrUnknownMemberId);  // an instance id the group does not know
}

TEST_F(GroupTest, StaticMemberRestartRebalancesWhenTheProtocolWouldChangeOrDuringSync) {
  JoinGroupInput i1 = Static("", "i1");
  i1.protocols = {{"range", "r"}, {"roundrobin", "rr"}};
  JoinGroupInput i2 = Static("", "i2");
  i2.protocols = {{"roundrobin", "rr"}, {"range", "r"}};
  auto s1 = Join(i1, 0);
  auto s2 = Join(i2, 0);
  i1.member_id = s1->member_id;
  auto s1b = Join(i1, 0);
  ASSERT_TRUE(s2.done() && s1b.done());
  EXPECT_EQ(s1b->protocol_name, "range");  // a tie: the earliest member's preference
  EXPECT_EQ(Sync(s1->member_id, 2, {}, 0, "i1")->error_code, kErrNone);

  // i1 restarts offering only roundrobin: the group's protocol must change.
  JoinGroupInput restart = Static("", "i1");
  restart.protocols = {{"roundrobin", "rr"}};
  auto r = Join(restart, 100);
  EXPECT_FALSE(r.done());
  EXPECT_EQ(Describe().state, GroupState::kPreparingRebalance);
  i2.member_id = s2->member_id;
  auto s2b = Join(i2, 200);
  ASSERT_TRUE(r.done() && s2b.done());
  EXPECT_EQ(r->generation_id, 3);
  EXPECT_EQ(r->protocol_name, "roundrobin");

  // A restart during CompletingRebalance: the pending sync of the old id is
  // fenced, the others must rejoin.
  auto follower_sync = Sync(s2b->member_id, 3, {}, 300, "i2");
  EXPECT_FALSE(follower_sync.done());
  JoinGroupInput restart2 = Static("", "i2");
  restart2.protocols = {{"roundrobin", "rr"}};
  auto r2 = Join(restart2, 400);
  ASSERT_TRUE(follower_sync.done());
  EXPECT_EQ(follower_sync->error_code, kErrFencedInstanceId);
  EXPECT_EQ(Describe().state, GroupState::kPreparingRebalance);
  EXPECT_FALSE(r2.done());
  restart.member_id = r->member_id;
  auto r1 = Join(restart, 500);
  ASSERT_TRUE(r1.done() && r2.done());
  EXPECT_EQ(r1->generation_id, 4);
}

TEST_F(GroupTest, StaticMembersThatDoNotRejoinKeepTheirPlaceInTheRebalance) {
  auto s1 = Join(Static("", "i1"), 0);
  auto s2 = Join(Static("", "i2"), 0);
  auto s1b = Join(Static(s1->member_id, "i1"), 0);
  ASSERT_TRUE(s1b.done());
  auto dyn = Join("", 100);
  auto s1c = Join(Static(s1->member_id, "i1"), 100);
  c_->Tick(T(100 + 30000));  // i2 never rejoined: it stays, dynamic members would not
  ASSERT_TRUE(dyn.done() && s1c.done());
  EXPECT_EQ(s1c->generation_id, 3);
  EXPECT_EQ(s1c->members.size(), 3u);
  EXPECT_EQ(Describe().members.size(), 3u);
}

// ---- Protocols -------------------------------------------------------------------------

TEST_F(GroupTest, ProtocolTypeAndProtocolsMustMatchTheGroup) {
  JoinGroupInput empty_type = In("");
  empty_type.protocol_type = "";
  EXPECT_EQ(Join(empty_type, 0)->error_code, kErrInconsistentGroupProtocol);
  JoinGroupInput no_protocols = In("");
  no_protocols.protocols.clear();
  EXPECT_EQ(Join(no_protocols, 0)->error_code, kErrInconsistentGroupProtocol);
  EXPECT_TRUE(c_->ListGroups().empty());  // a failed first join leaves no group behind

  auto a = Join("", 0);
  ASSERT_EQ(a->error_code, kErrNone);
  JoinGroupInput connect = In("");
  connect.protocol_type = "connect";
  auto x = Join(connect, 10);
  EXPECT_EQ(x->error_code, kErrInconsistentGroupProtocol);
  EXPECT_TRUE(x->member_id.empty());
  JoinGroupInput other = In("");
  other.protocols = {{"roundrobin", "m"}};
  EXPECT_EQ(Join(other, 10)->error_code, kErrInconsistentGroupProtocol);
  other.protocols = {{"roundrobin", "m"}, {"range", "m"}};
  auto ok = Join(other, 10);  // shares "range"
  EXPECT_FALSE(ok.done());
  EXPECT_EQ(Describe().members.size(), 2u);

  // A known member changing to a protocol the others lack is refused too.
  JoinGroupInput a_bad = In(a->member_id);
  a_bad.protocols = {{"sticky", "m"}};
  EXPECT_EQ(Join(a_bad, 20)->error_code, kErrInconsistentGroupProtocol);
  // A sole member may change protocol (Kafka refuses this; we need not).
  JoinGroupInput solo = In("");
  solo.group_id = "solo";
  auto s = Join(solo, 0);
  solo.member_id = s->member_id;
  solo.protocols = {{"sticky", "m"}};
  auto s2 = Join(solo, 10);
  ASSERT_TRUE(s2.done());
  EXPECT_EQ(s2->error_code, kErrNone);
  EXPECT_EQ(s2->protocol_name, "sticky");
}

TEST_F(GroupTest, TheProtocolIsChosenByVoteAmongThoseEveryMemberSupports) {
  auto join3 = [&](std::string group, std::vector<Assignments> protos) {
    std::vector<JoinReply> r;
    std::vector<std::string> ids;
    for (auto& p : protos) {
      JoinGroupInput in = In("");
      in.group_id = group;
      in.protocols = p;
      r.push_back(Join(in, 0));
    }
    // Everyone rejoins with its id; the last rejoin completes the rebalance.
    std::vector<JoinReply> again;
    for (size_t i = 0; i < protos.size(); ++i) {
      JoinGroupInput in = In(r[i]->member_id);
      in.group_id = group;
      in.protocols = protos[i];
      again.push_back(Join(in, 1));
    }
    EXPECT_TRUE(again.back().done());
    return *again.back();
  };
  // Only roundrobin is supported by all.
  auto r = join3("g1", {{{"range", "a"}, {"roundrobin", "a"}}, {{"roundrobin", "b"}, {"range", "b"}},
                        {{"roundrobin", "c"}}});
  EXPECT_EQ(r.protocol_name, "roundrobin");
  // Both are supported; roundrobin has two first-choice votes of three.
  r = join3("g2", {{{"range", "a"}, {"roundrobin", "a"}}, {{"roundrobin", "b"}, {"range", "b"}},
                   {{"roundrobin", "c"}, {"range", "c"}}});
  EXPECT_EQ(r.protocol_name, "roundrobin");
  // The leader sees each member's metadata for the chosen protocol.
  auto d = Describe("g2");
  ASSERT_EQ(d.members.size(), 3u);
  EXPECT_EQ(d.members[0].metadata, "a");
  EXPECT_EQ(d.members[2].metadata, "c");
}

// ---- SyncGroup, Heartbeat and commits ---------------------------------------------------

TEST_F(GroupTest, SyncGroupErrorsAndEmptyAssignments) {
  EXPECT_EQ(Sync("x", 1, {}, 0)->error_code, kErrUnknownMemberId);  // no such group
  auto a = Join("", 0);
  const std::string A = a->member_id;
  EXPECT_EQ(Sync("x", 1, {}, 0)->error_code, kErrUnknownMemberId);
  EXPECT_EQ(Sync(A, 2, {}, 0)->error_code, kErrIllegalGeneration);
  SyncGroupInput bad_name{"g", 1, A, std::nullopt, std::string("consumer"), std::string("roundrobin"), {}};
  SyncReply bn;
  c_->SyncGroup(bad_name, T(0), bn.Callback());
  EXPECT_EQ(bn->error_code, kErrInconsistentGroupProtocol);
  SyncGroupInput no_group{"", 1, A, std::nullopt, std::nullopt, std::nullopt, {}};
  SyncReply ng;
  c_->SyncGroup(no_group, T(0), ng.Callback());
  EXPECT_EQ(ng->error_code, kErrInvalidGroupId);

  // The leader leaves B out and names a member that does not exist.
  auto b = Join("", 10);
  auto a2 = Join(A, 10);
  ASSERT_TRUE(b.done() && a2.done());
  const std::string B = b->member_id;
  auto sb1 = Sync(B, 2, {}, 20);
  auto sb2 = Sync(B, 2, {}, 21);  // a retry supersedes the first
  ASSERT_TRUE(sb1.done());
  EXPECT_EQ(sb1->error_code, kErrRebalanceInProgress);
  EXPECT_FALSE(sb2.done());
  auto sa = Sync(A, 2, {{A, "mine"}, {"nobody", "x"}}, 30);
  ASSERT_TRUE(sb2.done());
  EXPECT_EQ(sb2->error_code, kErrNone);
  EXPECT_EQ(sb2->assignment, "");
  EXPECT_EQ(sa->assignment, "mine");
  EXPECT_EQ(Sync(B, 2, {}, 40)->assignment, "");   // Stable: the stored assignment
  EXPECT_EQ(Sync(A, 2, {}, 40)->assignment, "mine");  // a second leader sync changes nothing

  // During PreparingRebalance.
  auto cj = Join("", 50);
  EXPECT_EQ(Sync(A, 2, {}, 60)->error_code, kErrRebalanceInProgress);
  EXPECT_FALSE(cj.done());

  // A rebalance starting while a follower waits for the leader answers it.
  auto a3 = Join(A, 70);
  auto b3 = Join(B, 70);
  ASSERT_TRUE(cj.done());
  auto wait = Sync(B, 3, {}, 80);
  EXPECT_FALSE(wait.done());
  auto dj = Join("", 90);
  ASSERT_TRUE(wait.done());
  EXPECT_EQ(wait->error_code, kErrRebalanceInProgress);
}

TEST_F(GroupTest, HeartbeatErrors) {
  EXPECT_EQ(c_->Heartbeat("", 1, "x", std::nullopt, T(0)), kErrInvalidGroupId);
  EXPECT_EQ(Hb("x", 1, 0), kErrUnknownMemberId);  // no such group
  auto [A, B] = StableTwo(0);
  EXPECT_EQ(Hb(A, 2, 1), kErrNone);
  EXPECT_EQ(Hb(A, 1, 1), kErrIllegalGeneration);
  EXPECT_EQ(Hb(A, 3, 1), kErrIllegalGeneration);
  EXPECT_EQ(Hb("stranger", 2, 1), kErrUnknownMemberId);
  EXPECT_EQ(Hb(A, 2, 1, "i1"), kErrUnknownMemberId);  // A is not static
}

TEST_F(GroupTest, KnownMembersRejoiningAStableGroup) {
  auto [A, B] = StableTwo(0);
  // A follower with unchanged metadata gets the current generation back.
  auto b = Join(B, 100, "mb");
  ASSERT_TRUE(b.done());
  EXPECT_EQ(b->error_code, kErrNone);
  EXPECT_EQ(b->generation_id, 2);
  EXPECT_EQ(b->leader, A);
  EXPECT_TRUE(b->members.empty());
  EXPECT_EQ(Describe().state, GroupState::kStable);
  EXPECT_EQ(Sync(B, 2, {}, 110)->assignment, "pb");

  // Changed metadata: a rebalance.
  auto b2 = Join(B, 200, "mb-new");
  EXPECT_FALSE(b2.done());
  auto a2 = Join(A, 210, "ma");
  ASSERT_TRUE(b2.done() && a2.done());
  EXPECT_EQ(a2->generation_id, 3);
  EXPECT_EQ(a2->members.at(1).metadata, "mb-new");

  // In CompletingRebalance, the same metadata gets this generation again
  // (the leader with every member's metadata).
  auto a3 = Join(A, 220, "ma");
  ASSERT_TRUE(a3.done());
  EXPECT_EQ(a3->generation_id, 3);
  EXPECT_EQ(a3->members.size(), 2u);
  EXPECT_EQ(Describe().state, GroupState::kCompletingRebalance);
  auto sb = Sync(B, 3, {}, 230);
  EXPECT_EQ(Sync(A, 3, {}, 230)->error_code, kErrNone);

  // The leader rejoining a stable group forces a rebalance even with the same metadata.
  auto a4 = Join(A, 300, "ma");
  EXPECT_FALSE(a4.done());
  EXPECT_EQ(Describe().state, GroupState::kPreparingRebalance);
  auto b4 = Join(B, 310, "mb-new");
  ASSERT_TRUE(a4.done() && b4.done());
  EXPECT_EQ(a4->generation_id, 4);

  // A JoinGroup retried while the first still waits: the first gets REBALANCE_IN_PROGRESS.
  auto cj = Join("", 400);
  auto w1 = Join(A, 410, "ma");
  auto w2 = Join(A, 420, "ma");
  ASSERT_TRUE(w1.done());
  EXPECT_EQ(w1->error_code, kErrRebalanceInProgress);
  EXPECT_FALSE(w2.done());
  auto b5 = Join(B, 430, "mb-new");
  ASSERT_TRUE(w2.done() && cj.done() && b5.done());
  EXPECT_EQ(w2->generation_id, 5);
  EXPECT_EQ(w1.calls(), 1);
  EXPECT_EQ(w2.calls(), 1);
}

TEST_F(GroupTest, ValidateCommit) {
  // No group: standalone commits pass, a generation we never had does not.
  EXPECT_EQ(c_->ValidateCommit("solo", -1, "", std::nullopt, T(0)), kErrNone);
  EXPECT_EQ(c_->ValidateCommit("", -1, "", std::nullopt, T(0)), kErrNone);  // Kafka allows "" here
  EXPECT_EQ(c_->ValidateCommit("solo", 1, "m", std::nullopt, T(0)), kErrIllegalGeneration);
  // Generation -1 is a self-managed consumer, whatever ids it sends (as Kafka).
  EXPECT_EQ(c_->ValidateCommit("solo", -1, "m", std::string("i"), T(0)), kErrNone);
  EXPECT_FALSE(c_->DescribeGroup("solo").has_value());

  auto a = Join("", 0);
  const std::string A = a->member_id;
  EXPECT_EQ(c_->ValidateCommit("g", 1, A, std::nullopt, T(1)), kErrRebalanceInProgress);  // no assignment yet
  EXPECT_EQ(Sync(A, 1, {}, 2)->error_code, kErrNone);
  EXPECT_EQ(c_->ValidateCommit("g", 1, A, std::nullopt, T(3)), kErrNone);
  EXPECT_EQ(c_->ValidateCommit("g", 0, A, std::nullopt, T(3)), kErrIllegalGeneration);
  EXPECT_EQ(c_->ValidateCommit("g", 1, "other", std::nullopt, T(3)), kErrUnknownMemberId);
  EXPECT_EQ(c_->ValidateCommit("g", -1, "", std::nullopt, T(3)), kErrUnknownMemberId);  // group has members

  // A commit renews the session, as a heartbeat does.
  EXPECT_EQ(c_->ValidateCommit("g", 1, A, std::nullopt, T(8000)), kErrNone);
  c_->Tick(T(12000));
  EXPECT_EQ(Describe().members.size(), 1u);

  // During PreparingRebalance the current generation may still commit.
  auto b = Join("", 12100);
  EXPECT_EQ(c_->ValidateCommit("g", 1, A, std::nullopt, T(12200)), kErrNone);
  auto a2 = Join(A, 12300);
  ASSERT_TRUE(a2.done() && b.done());
  EXPECT_EQ(Leave(A, 12400).error_code, kErrNone);
  EXPECT_EQ(Leave(b->member_id, 12400).error_code, kErrNone);
  ASSERT_EQ(Describe().state, GroupState::kEmpty);
  EXPECT_EQ(c_->ValidateCommit("g", -1, "", std::nullopt, T(12500)), kErrNone);
  EXPECT_EQ(c_->ValidateCommit("g", 2, A, std::nullopt, T(12500)), kErrUnknownMemberId);
}

// ---- Limits, input checks, lifecycle ---------------------------------------------------

TEST_F(GroupTest, InvalidGroupIdAndSessionTimeout) {
  JoinGroupInput in = In("");
  in.group_id = "";
  EXPECT_EQ(Join(in, 0)->error_code, kErrInvalidGroupId);
  in = In("");
  in.session_timeout_ms = 5999;
  EXPECT_EQ(Join(in, 0)->error_code, kErrInvalidSessionTimeout);
  in.session_timeout_ms = 30 * 60 * 1000 + 1;
  EXPECT_EQ(Join(in, 0)->error_code, kErrInvalidSessionTimeout);
  in.session_timeout_ms = 6000;
  EXPECT_EQ(Join(in, 0)->error_code, kErrNone);
  // v0 has no rebalance timeout: the session timeout stands in.
  JoinGroupInput v0 = In("", "m", 0);
  v0.group_id = "v0";
  v0.rebalance_timeout_ms = 999999;
  auto a = Join(v0, 0);
  EXPECT_EQ(Sync(a->member_id, 1, {}, 0)->error_code, kErrUnknownMemberId);  // another group: "g"
  SyncGroupInput s{"v0", 1, a->member_id, std::nullopt, std::nullopt, std::nullopt, {}};
  bool synced = false;
  c_->SyncGroup(s, T(0), [&synced](SyncGroupResult r) {
    synced = true;
    EXPECT_EQ(r.error_code, kErrNone);
  });
  EXPECT_TRUE(synced) << "the leader's SyncGroup was not answered at once";
  auto b = Join(v0, 100);  // waits for a, at most 10 s (the session timeout)
  for (int64_t t : {3000, 6000, 9000}) {
    EXPECT_EQ(c_->Heartbeat("v0", 1, a->member_id, std::nullopt, T(t)), kErrRebalanceInProgress);
  }
  c_->Tick(T(100 + 9999));
  EXPECT_FALSE(b.done());
  c_->Tick(T(100 + 10000));
  EXPECT_TRUE(b.done());
}

// Kafka's acceptJoiningMember: ids handed out with MEMBER_ID_REQUIRED do not
// count; in a rebalance only the members that rejoined do, and a member
// rejoining after newer ones filled the rebalance is dropped.
TEST_F(GroupTest, MembersPerGroupLimit) {
  GroupOptions o = TestOptions();
  o.max_members_per_group = 2;
  Reset(o);
  auto a = Join("", 0);
  ASSERT_EQ(a->error_code, kErrNone);
  const std::string A = a->member_id;
  ASSERT_EQ(Sync(A, 1, {{A, "x"}}, 0)->error_code, kErrNone);
  // Two new members get ids: pending ids are not members.
  auto p1 = Join(In("", "m", 4), 0);
  auto p2 = Join(In("", "m", 4), 0);
  ASSERT_EQ(p1->error_code, kErrMemberIdRequired);
  ASSERT_EQ(p2->error_code, kErrMemberIdRequired);
  // Ids outstanding are capped too, with a refusal clients retry.
  EXPECT_EQ(Join(In("", "m", 4), 0)->error_code, kErrCoordinatorNotAvailable);
  // Both come back: the rebalance counts only who rejoined, so both fit...
  auto j1 = Join(In(p1->member_id, "m", 4), 0);
  auto j2 = Join(In(p2->member_id, "m", 4), 0);
  EXPECT_FALSE(j1.done() || j2.done());
  EXPECT_EQ(Describe().state, GroupState::kPreparingRebalance);
  // ...and A, rejoining after them, is over the limit: dropped, as on Kafka.
  auto a2 = Join(A, 0);
  ASSERT_TRUE(a2.done());
  EXPECT_EQ(a2->error_code, kErrGroupMaxSizeReached);
  ASSERT_TRUE(j1.done() && j2.done());
  EXPECT_EQ(j1->error_code, kErrNone);
  EXPECT_EQ(j2->error_code, kErrNone);
  EXPECT_EQ(j1->generation_id, 2);
  EXPECT_EQ(Describe().members.size(), 2u);
  // Full: a new member (dynamic or static) is refused, a pending id too.
  EXPECT_EQ(Join("", 0)->error_code, kErrGroupMaxSizeReached);
  EXPECT_EQ(Join(Static("", "i1"), 0)->error_code, kErrGroupMaxSizeReached);
  EXPECT_EQ(Join(In("", "m", 4), 0)->error_code, kErrGroupMaxSizeReached);
  EXPECT_EQ(Describe().members.size(), 2u);
}

// A member that died without leaving stays until its session runs out;
// new members must still get in (not 81, which is fatal to Java clients):
// the dead one is not waited for, and ids handed out do not count.
TEST_F(GroupTest, NewMembersGetInWhileADeadOneAwaitsItsSessionTimeout) {
  GroupOptions o = TestOptions();
  o.max_members_per_group = 2;
  Reset(o);
  auto a = Join("", 0);
  ASSERT_EQ(a->error_code, kErrNone);
  ASSERT_EQ(Sync(a->member_id, 1, {{a->member_id, "x"}}, 0)->error_code, kErrNone);
  // A dies; its replacements arrive before its session (10 s) runs out.
  auto n1 = Join(In("", "m", 4), 1000);
  auto n2 = Join(In("", "m", 4), 1000);
  ASSERT_EQ(n1->error_code, kErrMemberIdRequired);
  ASSERT_EQ(n2->error_code, kErrMemberIdRequired);
  auto j1 = Join(In(n1->member_id, "m", 4), 1000);
  auto j2 = Join(In(n2->member_id, "m", 4), 1000);
  c_->Tick(T(40000));  // A's session is over, and so is the rebalance's timeout
  ASSERT_TRUE(j1.done() && j2.done());
  EXPECT_EQ(j1->error_code, kErrNone);
  EXPECT_EQ(j2->error_code, kErrNone);
  EXPECT_EQ(j1->generation_id, j2->generation_id);
  EXPECT_EQ(Describe().members.size(), 2u);
}

TEST_F(GroupTest, JoinsPastThePerMemberLimitsAreInvalidAndChangeNothing) {
  GroupOptions o = TestOptions();
  o.max_member_bytes = 4096;
  Reset(o);
  JoinGroupInput many = In("");
  many.protocols.clear();
  for (int i = 0; i < 33; ++i) many.protocols.emplace_back(fmt::format("p{}", i), "m");
  EXPECT_EQ(Join(many, 0)->error_code, kErrInvalidRequest);
  EXPECT_FALSE(c_->DescribeGroup("g").has_value()) << "a refused first join left a group behind";
  EXPECT_EQ(Join("", 0, std::string(4096, 'x'))->error_code, kErrInvalidRequest);
  EXPECT_FALSE(c_->DescribeGroup("g").has_value());
  EXPECT_EQ(c_->Stats().bytes, 0u);
  many.protocols.pop_back();  // 32 protocols are fine
  auto a = Join(many, 0);
  ASSERT_EQ(a->error_code, kErrNone);
  // A leader's assignment over the limit: refused; the group still waits for one.
  EXPECT_EQ(Sync(a->member_id, 1, {{a->member_id, std::string(4097, 'a')}}, 0)->error_code, kErrInvalidRequest);
  EXPECT_EQ(Describe().state, GroupState::kCompletingRebalance);
  EXPECT_EQ(Sync(a->member_id, 1, {{a->member_id, "fits"}}, 0)->assignment, "fits");
}

TEST_F(GroupTest, EveryGroupsMembersShareOneMemoryBudget) {
  GroupOptions o = TestOptions();
  o.max_member_bytes = 48 << 10;
  o.max_total_bytes = 64 << 10;
  Reset(o);
  auto join = [&](std::string group, std::string member_id, size_t meta_bytes, int16_t version = 3) {
    JoinGroupInput in = In(std::move(member_id), std::string(meta_bytes, 'm'), version);
    in.group_id = std::move(group);
    return Join(in, 0);
  };
  auto a = join("g", "", 40 << 10);
  ASSERT_EQ(a->error_code, kErrNone);
  const size_t after_a = c_->Stats().bytes;
  EXPECT_GE(after_a, size_t{40} << 10);
  // Another group's join that would pass the budget is retriable, and leaves nothing.
  EXPECT_EQ(join("other", "", 30 << 10)->error_code, kErrCoordinatorNotAvailable);
  EXPECT_FALSE(c_->DescribeGroup("other").has_value());
  EXPECT_EQ(c_->Stats().bytes, after_a);
  // A member rejoining gives back what it held: the same 40 KiB fit again.
  auto a2 = join("g", a->member_id, 40 << 10);
  ASSERT_EQ(a2->error_code, kErrNone);
  EXPECT_EQ(c_->Stats().bytes, after_a);
  // The leader's assignments count too.
  const int32_t gen = a2->generation_id;
  EXPECT_EQ(Sync(a->member_id, gen, {{a->member_id, std::string(30 << 10, 'a')}}, 0)->error_code,
            kErrCoordinatorNotAvailable);
  EXPECT_EQ(Sync(a->member_id, gen, {{a->member_id, std::string(1 << 10, 'a')}}, 0)->error_code, kErrNone);
  EXPECT_EQ(c_->Stats().bytes, after_a + (1 << 10));
  // A handed-out member id is charged until it expires.
  auto pending = join("third", "", 16, /*version=*/4);
  ASSERT_EQ(pending->error_code, kErrMemberIdRequired);
  EXPECT_GT(c_->Stats().bytes, after_a + (1 << 10));
  c_->Tick(T(10001));  // past the pending id's session timeout; A's session too
  EXPECT_EQ(c_->DescribeGroup("third")->pending_member_ids, 0u);
  EXPECT_EQ(Describe().members.size(), 0u);
  EXPECT_EQ(c_->Stats().bytes, 0u) << "bytes stayed charged after every member and id went";
  EXPECT_EQ(join("other", "", 30 << 10)->error_code, kErrNone);
}

TEST_F(GroupTest, AnUnchangedRejoinFitsABudgetThatIsFull) {
  auto a = Join("", 0, std::string(1000, 'm'));
  ASSERT_EQ(a->error_code, kErrNone);
  GroupOptions o = TestOptions();
  o.max_total_bytes = c_->Stats().bytes;  // exactly what A holds
  Reset(o);
  a = Join("", 0, std::string(1000, 'm'));  // the same seed: the same member id
  ASSERT_EQ(a->error_code, kErrNone);
  ASSERT_EQ(c_->Stats().bytes, o.max_total_bytes);
  auto again = Join(a->member_id, 10, std::string(1000, 'm'));
  EXPECT_EQ(again->error_code, kErrNone) << "an unchanged rejoin was refused at a full budget";
  EXPECT_EQ(Join(a->member_id, 20, std::string(1001, 'm'))->error_code, kErrCoordinatorNotAvailable);
}

TEST_F(GroupTest, LongIdsAreCutOrRefused) {
  // A new member id takes at most 64 bytes of the client id (pending ids are
  // held for a session timeout), cut between UTF-8 characters.
  JoinGroupInput in = In("", "m", 4);
  in.client_id = std::string(63, 'c') + "\xc3\xa9" + std::string(30000, 'c');
  auto pending = Join(in, 0);
  ASSERT_EQ(pending->error_code, kErrMemberIdRequired);
  EXPECT_EQ(pending->member_id.substr(0, 64), std::string(63, 'c') + "-");
  EXPECT_EQ(pending->member_id.size(), 63u + 37u);
  // Group ids and protocol types longer than 255 bytes are refused.
  JoinGroupInput long_group = In("");
  long_group.group_id = std::string(256, 'g');
  EXPECT_EQ(Join(long_group, 0)->error_code, kErrInvalidGroupId);
  JoinGroupInput long_type = In("");
  long_type.group_id = "other";
  long_type.protocol_type = std::string(256, 't');
  EXPECT_EQ(Join(long_type, 0)->error_code, kErrInvalidRequest);
  EXPECT_FALSE(c_->DescribeGroup("other").has_value());
}

TEST_F(GroupTest, AClientIdThatIsNotUtf8MakesAUtf8MemberId) {
  // The header's client id is not checked; the member id is a string the
  // client sends back, which the decoders check (IsValidUtf8).
  JoinGroupInput in = In("", "m", 4);
  in.client_id = "caf\xe9\x01ok";
  auto pending = Join(in, 0);
  ASSERT_EQ(pending->error_code, kErrMemberIdRequired);
  EXPECT_EQ(pending->member_id.substr(0, 7), "caf__ok");
  EXPECT_TRUE(IsValidUtf8(pending->member_id)) << pending->member_id;
  EXPECT_EQ(Join(pending->member_id, 0)->error_code, kErrNone);
}

TEST_F(GroupTest, GroupLimitForgetsEmptyGroupsFirst) {
  GroupOptions o = TestOptions();
  o.max_groups = 2;
  Reset(o);
  auto join = [&](std::string group, int64_t t) {
    JoinGroupInput in = In("");
    in.group_id = std::move(group);
    return Join(in, t);
  };
  auto g1 = join("g1", 0);
  auto g2 = join("g2", 0);
  ASSERT_EQ(g2->error_code, kErrNone);
  EXPECT_EQ(join("g3", 0)->error_code, kErrCoordinatorNotAvailable);  // retriable
  LeaveGroupInput leave{"g2", {{g2->member_id, std::nullopt}}, 1};
  EXPECT_EQ(c_->LeaveGroup(leave, T(10)).error_code, kErrNone);
  EXPECT_EQ(c_->DescribeGroup("g2")->state, GroupState::kEmpty);
  EXPECT_EQ(join("g3", 20)->error_code, kErrNone);  // g2 (empty) is forgotten
  auto groups = c_->ListGroups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].group_id, "g1");
  EXPECT_EQ(groups[1].group_id, "g3");
  EXPECT_EQ(groups[1].protocol_type, "consumer");
}

TEST_F(GroupTest, GroupsHoldingOnlyHandedOutMemberIdsAreForgottenToo) {
  GroupOptions o = TestOptions();
  o.max_groups = 2;
  Reset(o);
  auto join = [&](std::string group, int64_t t) {
    JoinGroupInput in = In("", "m", 4);  // v4: MEMBER_ID_REQUIRED first
    in.session_timeout_ms = 30 * 60 * 1000;
    in.group_id = std::move(group);
    return Join(in, t);
  };
  EXPECT_EQ(join("g1", 0)->error_code, kErrMemberIdRequired);
  EXPECT_EQ(join("g2", 10)->error_code, kErrMemberIdRequired);
  // Two such joins held every slot for the session timeout (30 min).
  EXPECT_EQ(join("g3", 20)->error_code, kErrMemberIdRequired);
  EXPECT_FALSE(c_->DescribeGroup("g1").has_value());  // the longest empty
  EXPECT_TRUE(c_->DescribeGroup("g2").has_value());
}

TEST_F(GroupTest, EmptyGroupsAreForgottenAfterTheRetention) {
  GroupOptions o = TestOptions();
  o.empty_group_retention = std::chrono::minutes(1);
  Reset(o);
  auto a = Join("", 0);
  EXPECT_EQ(Leave(a->member_id, 1000).error_code, kErrNone);
  c_->Tick(T(60999));
  EXPECT_TRUE(c_->DescribeGroup("g").has_value());
  c_->Tick(T(61000));
  EXPECT_FALSE(c_->DescribeGroup("g").has_value());
  EXPECT_EQ(c_->Stats().groups, 0u);
}

TEST_F(GroupTest, DeleteGroup) {
  EXPECT_EQ(c_->DeleteGroup("g"), kErrGroupIdNotFound);
  auto a = Join("", 0);
  EXPECT_EQ(c_->DeleteGroup("g"), kErrNonEmptyGroup);
  EXPECT_EQ(Leave(a->member_id, 10).error_code, kErrNone);
  EXPECT_EQ(c_->DeleteGroup("g"), kErrNone);
  EXPECT_FALSE(c_->DescribeGroup("g").has_value());
}

TEST_F(GroupTest, DescribeAndStats) {
  JoinGroupInput in = In("", "meta-a");
  in.client_id = "app";
  auto a = Join(in, 0);
  EXPECT_EQ(Sync(a->member_id, 1, {{a->member_id, "asg"}}, 0)->error_code, kErrNone);
  auto d = Describe();
  EXPECT_EQ(d.group_id, "g");
  EXPECT_EQ(d.state, GroupState::kStable);
  EXPECT_EQ(GroupStateName(d.state), "Stable");
  EXPECT_EQ(d.generation_id, 1);
  EXPECT_EQ(d.protocol_type, "consumer");
  EXPECT_EQ(d.protocol_name, "range");
  EXPECT_EQ(d.leader, a->member_id);
  ASSERT_EQ(d.members.size(), 1u);
  EXPECT_EQ(d.members[0].client_id, "app");
  EXPECT_EQ(d.members[0].client_host, "/10.0.0.1");
  EXPECT_EQ(d.members[0].metadata, "meta-a");
  EXPECT_EQ(d.members[0].assignment, "asg");
  EXPECT_EQ(GroupStateName(GroupState::kPreparingRebalance), "PreparingRebalance");
  EXPECT_EQ(GroupStateName(GroupState::kCompletingRebalance), "CompletingRebalance");
  EXPECT_EQ(GroupStateName(GroupState::kEmpty), "Empty");
  auto s = c_->Stats();
  EXPECT_EQ(s.groups, 1u);
  EXPECT_EQ(s.members, 1u);
  EXPECT_EQ(s.groups_in_state[static_cast<size_t>(GroupState::kStable)], 1u);
}

TEST_F(GroupTest, ShutdownAnswersEveryPendingCallback) {
  auto [A, B] = StableTwo(0);
  auto cj = Join("", 100);
  auto a = Join(A, 100);
  auto b = Join(B, 100);
  ASSERT_TRUE(a.done());
  auto follower = Sync(B, 3, {}, 200);
  auto waiting = Join("", 300);  // a new rebalance: A and B have not rejoined
  ASSERT_TRUE(follower.done());
  auto a2 = Join(A, 400);
  EXPECT_FALSE(a2.done() || waiting.done());
  c_->Shutdown();
  ASSERT_TRUE(a2.done() && waiting.done());
  EXPECT_EQ(a2->error_code, kErrCoordinatorNotAvailable);
  EXPECT_EQ(waiting->error_code, kErrCoordinatorNotAvailable);
  EXPECT_EQ(a2.calls(), 1);
  EXPECT_EQ(Hb(A, 3, 500), kErrCoordinatorNotAvailable);
  EXPECT_EQ(Join("", 500)->error_code, kErrCoordinatorNotAvailable);
  EXPECT_EQ(Sync(A, 3, {}, 500)->error_code, kErrCoordinatorNotAvailable);
  EXPECT_EQ(Leave(A, 500).error_code, kErrCoordinatorNotAvailable);
  c_->Tick(T(100000));
}

// ---- Randomized: several clients, random operations, invariants ------------------------

// Clients behave roughly like Kafka consumers (join, sync, heartbeat in the
// background, commit, rejoin on errors) but also crash, leave, change
// metadata, restart static instances and send stale requests. Checked:
//  - every callback runs exactly once (Shutdown answers what is left);
//  - one leader per generation, and it is a member of that generation;
//  - generations never go back;
//  - every successful SyncGroup of a generation returns what that
//    generation's leader assigned (empty bytes if it assigned nothing);
//  - once the disruptions stop, the group settles with every live client.
class Sim {
 public:
  Sim(uint64_t seed, int n_clients, int n_static) : rng_(seed) {
    GroupOptions o = TestOptions();
    o.member_id_seed = seed;
    o.max_members_per_group = static_cast<size_t>(n_clients) - 1;
    o.initial_rebalance_delay = std::chrono::milliseconds(seed % 2 == 0 ? 0 : 500);
    max_members_ = o.max_members_per_group;
    c_ = std::make_unique<GroupCoordinator>(o);
    for (int i = 0; i < n_clients; ++i) {
      Client cl;
      cl.idx = i;
      if (i < n_static) cl.instance = fmt::format("inst-{}", i);
      clients_.push_back(cl);
    }
  }

  void Run(int steps) {
    for (int i = 0; i < steps; ++i) Step(/*disrupt=*/true);
    // Settle: no more disruptions; clients beyond the group's size stop.
    int live = 0;
    for (auto& cl : clients_) {
      if (cl.phase != Client::kDead && ++live > static_cast<int>(max_members_)) Crash(cl);
    }
    if (live == 0) Revive(clients_[0]);
    bool settled = false;
    for (int i = 0; i < 20000 && !settled; ++i) {
      Step(/*disrupt=*/false);
      settled = Settled();
    }
    EXPECT_TRUE(settled) << "the group did not settle";
    // Every client goes silent: sessions, handed-out ids and then the empty
    // group expire, and every byte charged for them is given back.
    for (int i = 0; i < 200; ++i) {
      now_ms_ += 10000;
      c_->Tick(Now());
    }
    EXPECT_EQ(c_->Stats().groups, 0u);
    EXPECT_EQ(c_->Stats().bytes, 0u);
    c_->Shutdown();
    CheckFinal();
  }

 private:
  struct Client {
    enum Phase { kIdle, kJoining, kNeedSync, kSyncing, kStable, kDead };
    int idx = 0;
    std::optional<std::string> instance;
    std::string member_id;
    std::string zombie_id;  // a static member's previous incarnation
    int32_t generation = -1;
    Phase phase = kIdle;
    bool is_leader = false;
    std::vector<JoinGroupMember> members;
    std::string meta = "v0";
    bool rr_first = false;
    uint64_t join_req = 0, sync_req = 0;
    int64_t last_hb = 0;
  };
  struct Attempt {
    int32_t generation;
    std::string submitter;
    std::map<std::string, std::string> assigned;  // key (instance or member id) -> bytes
  };
  struct SyncSeen {
    int32_t generation;
    std::string key;
    std::string bytes;
  };

  uint64_t Rand(uint64_t n) { return rng_() % n; }
  bool Chance(int percent) { return Rand(100) < static_cast<uint64_t>(percent); }
  TimePoint Now() const { return T(now_ms_); }
  static std::string Key(const Client& cl) { return cl.instance ? *cl.instance : cl.member_id; }

  void Step(bool disrupt) {
    now_ms_ += static_cast<int64_t>(Rand(400));
    c_->Tick(Now());
    for (auto& cl : clients_) {  // background heartbeats
      if (cl.phase == Client::kStable && now_ms_ - cl.last_hb >= 3000) Heartbeat(cl);
    }
    Act(clients_[Rand(clients_.size())], disrupt);
    CheckDescribe();
  }

  void Act(Client& cl, bool disrupt) {
    switch (cl.phase) {
      case Client::kDead:
        if (disrupt && Chance(10)) Revive(cl);
        break;
      case Client::kIdle:
        if (Chance(70)) SendJoin(cl);
        break;
      case Client::kNeedSync:
        if (!disrupt || Chance(80)) SendSync(cl);
        break;
      case Client::kJoining:
      case Client::kSyncing:
        if (disrupt && Chance(2)) Crash(cl);
        break;
      case Client::kStable: {
        if (!disrupt) break;
        int dice = static_cast<int>(Rand(100));
        if (dice < 3) {
          Leave(cl);
        } else if (dice < 6) {
          Crash(cl);
        } else if (dice < 9) {
          cl.meta = fmt::format("v{}", Rand(3));  // maybe the same: then no rebalance
          cl.rr_first = Chance(50);
          SendJoin(cl);
        } else if (dice < 15) {
          Commit(cl);
        } else if (dice < 18) {
          int16_t e = c_->Heartbeat("g", cl.generation - 1, cl.member_id, cl.instance, Now());
          EXPECT_TRUE(e == kErrIllegalGeneration || e == kErrUnknownMemberId) << e;
        } else if (dice < 21 && cl.instance && !cl.zombie_id.empty() && cl.zombie_id != cl.member_id) {
          int16_t e = c_->Heartbeat("g", cl.generation, cl.zombie_id, cl.instance, Now());
          EXPECT_TRUE(e == kErrFencedInstanceId || e == kErrUnknownMemberId) << e;
        }
        break;
      }
    }
  }

  void Crash(Client& cl) {
    cl.phase = Client::kDead;
    cl.join_req = cl.sync_req = 0;  // whatever was in flight is lost
  }
  void Revive(Client& cl) {
    if (cl.instance) cl.zombie_id = cl.member_id;
    cl.member_id.clear();
    cl.generation = -1;
    cl.phase = Client::kIdle;
  }

  // A member, by instance if static (its member ids are "inst-N-<uuid>").
  static std::string Who(const std::string& id) {
    return id.starts_with("inst-") && id.size() > 37 ? id.substr(0, id.size() - 37) : id;
  }

  void SendJoin(Client& cl) {
    JoinGroupInput in;
    in.group_id = "g";
    in.session_timeout_ms = 10000;
    in.rebalance_timeout_ms = 20000;
    in.member_id = cl.member_id;
    in.group_instance_id = cl.instance;
    in.protocol_type = "consumer";
    in.protocols = {{"range", cl.meta + "/range"}, {"roundrobin", cl.meta + "/rr"}};
    if (cl.rr_first) std::swap(in.protocols[0], in.protocols[1]);
    in.version = cl.instance ? 5 : static_cast<int16_t>(3 + Rand(3));
    in.client_id = fmt::format("c{}", cl.idx);
    uint64_t req = NewRequest();
    cl.join_req = req;
    cl.phase = Client::kJoining;
    c_->JoinGroup(in, Now(), [this, idx = cl.idx, req](JoinGroupResult r) { OnJoin(idx, req, std::move(r)); });
  }

  void OnJoin(int idx, uint64_t req, JoinGroupResult r) {
    EXPECT_EQ(calls_[req]++, 0) << "join callback called twice";
    if (r.error_code == kErrNone) {
      EXPECT_GE(r.generation_id, last_join_generation_);
      last_join_generation_ = std::max(last_join_generation_, r.generation_id);
      // A static leader replaced in a Stable group keeps the generation: its
      // new incarnation is told the old id, later rejoins the new one (as on
      // Kafka). One leader per generation is one instance, then.
      auto [l, fresh] = leader_of_gen_.emplace(r.generation_id, r.leader);
      EXPECT_EQ(Who(l->second), Who(r.leader)) << "two leaders in generation " << r.generation_id;
      auto [p, fresh_p] = protocol_of_gen_.emplace(r.generation_id, r.protocol_name);
      EXPECT_EQ(p->second, r.protocol_name);
      if (r.member_id == r.leader) {
        EXPECT_FALSE(r.members.empty());
        std::vector<std::string> ids = Ids(r.members);
        EXPECT_NE(std::find(ids.begin(), ids.end(), r.leader), ids.end()) << "leader is not a member";
        auto [m, fresh_m] = members_of_gen_.emplace(r.generation_id, ids);
        EXPECT_EQ(m->second, ids);
      } else {
        EXPECT_TRUE(r.members.empty());
      }
      if (!clients_[static_cast<size_t>(idx)].instance) dynamic_joins_.emplace_back(r.generation_id, r.member_id);
    }
    Client& cl = clients_[static_cast<size_t>(idx)];
    if (req != cl.join_req || cl.phase != Client::kJoining) return;  // stale
    switch (r.error_code) {
      case kErrNone:
        cl.member_id = r.member_id;
        cl.generation = r.generation_id;
        cl.is_leader = r.leader == r.member_id;
        cl.members = r.members;
        cl.phase = Client::kNeedSync;
        break;
      case kErrMemberIdRequired:
        cl.member_id = r.member_id;
        cl.phase = Client::kIdle;
        break;
      case kErrUnknownMemberId:
      case kErrGroupMaxSizeReached:
        cl.member_id.clear();
        cl.phase = Client::kIdle;
        break;
      case kErrRebalanceInProgress:
        cl.phase = Client::kIdle;
        break;
      case kErrFencedInstanceId:
        Crash(cl);
        break;
      default:
        ADD_FAILURE() << "unexpected JoinGroup error " << r.error_code;
        cl.phase = Client::kIdle;
    }
  }

  void SendSync(Client& cl) {
    SyncGroupInput in;
    in.group_id = "g";
    in.generation_id = cl.generation;
    in.member_id = cl.member_id;
    in.group_instance_id = cl.instance;
    if (cl.is_leader) {
      uint64_t nonce = next_nonce_++;
      Attempt a{cl.generation, cl.member_id, {}};
      for (const auto& m : cl.members) {
        if (Chance(15)) continue;  // leave someone out: it gets empty bytes
        std::string key = m.group_instance_id ? *m.group_instance_id : m.member_id;
        std::string bytes = fmt::format("{}/{}/{}", cl.generation, key, nonce);
        in.assignments.emplace_back(m.member_id, bytes);
        a.assigned[key] = bytes;
      }
      if (Chance(10)) in.assignments.emplace_back("nobody", "junk");
      attempts_[nonce] = std::move(a);
    }
    uint64_t req = NewRequest();
    cl.sync_req = req;
    cl.phase = Client::kSyncing;
    c_->SyncGroup(in, Now(), [this, idx = cl.idx, req, gen = cl.generation, key = Key(cl)](SyncGroupResult r) {
      OnSync(idx, req, gen, key, std::move(r));
    });
  }

  void OnSync(int idx, uint64_t req, int32_t gen, const std::string& key, SyncGroupResult r) {
    EXPECT_EQ(calls_[req]++, 0) << "sync callback called twice";
    if (r.error_code == kErrNone) syncs_.push_back(SyncSeen{gen, key, r.assignment});
    Client& cl = clients_[static_cast<size_t>(idx)];
    if (req != cl.sync_req || cl.phase != Client::kSyncing) return;  // stale
    switch (r.error_code) {
      case kErrNone:
        cl.phase = Client::kStable;
        cl.last_hb = now_ms_;
        break;
      case kErrRebalanceInProgress:
      case kErrIllegalGeneration:
        cl.phase = Client::kIdle;
        break;
      case kErrUnknownMemberId:
        cl.member_id.clear();
        cl.phase = Client::kIdle;
        break;
      case kErrFencedInstanceId:
        Crash(cl);
        break;
      default:
        ADD_FAILURE() << "unexpected SyncGroup error " << r.error_code;
        cl.phase = Client::kIdle;
    }
  }

  void Heartbeat(Client& cl) {
    cl.last_hb = now_ms_;
    int16_t e = c_->Heartbeat("g", cl.generation, cl.member_id, cl.instance, Now());
    switch (e) {
      case kErrNone: break;
      case kErrRebalanceInProgress:
      case kErrIllegalGeneration: SendJoin(cl); break;
      case kErrUnknownMemberId:
        cl.member_id.clear();
        SendJoin(cl);
        break;
      case kErrFencedInstanceId: Crash(cl); break;
      default: ADD_FAILURE() << "unexpected Heartbeat error " << e;
    }
  }

  void Commit(Client& cl) {
    int16_t e = c_->ValidateCommit("g", cl.generation, cl.member_id, cl.instance, Now());
    EXPECT_TRUE(e == kErrNone || e == kErrRebalanceInProgress || e == kErrIllegalGeneration ||
                e == kErrUnknownMemberId)
        << e;
  }

  void Leave(Client& cl) {
    LeaveGroupInput in;
    in.group_id = "g";
    in.version = static_cast<int16_t>(1 + Rand(3));
    bool by_instance = cl.instance && in.version == 3 && Chance(50);
    in.members = {LeaveGroupMember{by_instance ? std::string() : cl.member_id, cl.instance}};
    LeaveGroupResult r = c_->LeaveGroup(in, Now());
    EXPECT_TRUE(r.error_code == kErrNone || r.error_code == kErrUnknownMemberId) << r.error_code;
    cl.member_id.clear();
    cl.phase = Client::kIdle;
  }

  uint64_t NewRequest() {
    uint64_t req = next_req_++;
    calls_[req] = 0;
    return req;
  }

  void CheckDescribe() {
    EXPECT_LT(c_->Stats().bytes, size_t{1} << 20) << "the coordinator's byte count went below zero";
    auto d = c_->DescribeGroup("g");
    if (!d) return;
    EXPECT_GE(d->generation_id, last_described_generation_);
    last_described_generation_ = d->generation_id;
    // In a rebalance only the members that rejoined count toward the limit
    // (Kafka's rule); those that did not go when the join completes.
    if (d->state == GroupState::kPreparingRebalance) {
      EXPECT_LE(d->members.size(), 2 * max_members_);
    } else {
      EXPECT_LE(d->members.size(), max_members_);
    }
    if (d->state == GroupState::kEmpty) {
      EXPECT_TRUE(d->members.empty());
    }
    // (PreparingRebalance may have no members left while member ids handed
    // out by MEMBER_ID_REQUIRED are still expected back.)
    if (d->members.empty()) {
      EXPECT_TRUE(d->leader.empty());
    } else {
      bool leader_is_member = std::any_of(d->members.begin(), d->members.end(),
                                          [&](const MemberDescription& m) { return m.member_id == d->leader; });
      EXPECT_TRUE(leader_is_member) << GroupStateName(d->state);
    }
    if (d->state == GroupState::kStable || d->state == GroupState::kCompletingRebalance) {
      EXPECT_FALSE(d->protocol_name.empty());
    }
  }

  bool Settled() {
    auto d = c_->DescribeGroup("g");
    if (!d || d->state != GroupState::kStable) return false;
    size_t live = 0;
    for (const auto& cl : clients_) {
      if (cl.phase == Client::kDead) continue;
      ++live;
      if (cl.phase != Client::kStable || cl.generation != d->generation_id) return false;
    }
    return d->members.size() == live;
  }

  void CheckFinal() {
    for (const auto& [req, n] : calls_) EXPECT_EQ(n, 1) << "request " << req;
    std::map<int32_t, uint64_t> nonce_of_gen;
    for (const SyncSeen& s : syncs_) {
      ASSERT_TRUE(leader_of_gen_.count(s.generation)) << s.generation;
      if (s.bytes.empty()) continue;
      int32_t gen = 0;
      uint64_t nonce = 0;
      char key[128] = {};
      ASSERT_EQ(std::sscanf(s.bytes.c_str(), "%d/%127[^/]/%lu", &gen, key, &nonce), 3) << s.bytes;
      EXPECT_EQ(gen, s.generation);
      EXPECT_EQ(std::string(key), s.key);
      auto [it, fresh] = nonce_of_gen.emplace(s.generation, nonce);
      EXPECT_EQ(it->second, nonce) << "two assignments distributed in generation " << s.generation;
    }
    for (const auto& [gen, nonce] : nonce_of_gen) {
      const Attempt& a = attempts_.at(nonce);
      EXPECT_EQ(a.generation, gen);
      EXPECT_EQ(Who(a.submitter), Who(leader_of_gen_.at(gen))) << "assignment not from the generation's leader";
    }
    for (const SyncSeen& s : syncs_) {
      auto n = nonce_of_gen.find(s.generation);
      if (n == nonce_of_gen.end()) continue;  // only empty assignments seen in that generation
      const Attempt& a = attempts_.at(n->second);
      auto it = a.assigned.find(s.key);
      EXPECT_EQ(s.bytes, it == a.assigned.end() ? std::string() : it->second);
    }
    for (const auto& [gen, id] : dynamic_joins_) {
      auto m = members_of_gen_.find(gen);
      if (m == members_of_gen_.end()) continue;  // the leader's response went to a crashed client
      EXPECT_NE(std::find(m->second.begin(), m->second.end(), id), m->second.end());
    }
    EXPECT_GT(leader_of_gen_.size(), 3u) << "too few generations to mean anything";
  }

  std::mt19937_64 rng_;
  std::unique_ptr<GroupCoordinator> c_;
  size_t max_members_ = 0;
  std::vector<Client> clients_;
  int64_t now_ms_ = 0;
  uint64_t next_req_ = 1;
  uint64_t next_nonce_ = 1;
  std::map<uint64_t, int> calls_;
  std::map<int32_t, std::string> leader_of_gen_;
  std::map<int32_t, std::string> protocol_of_gen_;
  std::map<int32_t, std::vector<std::string>> members_of_gen_;
  std::vector<std::pair<int32_t, std::string>> dynamic_joins_;
  std::map<uint64_t, Attempt> attempts_;
  std::vector<SyncSeen> syncs_;
  int32_t last_join_generation_ = 0;
  int32_t last_described_generation_ = 0;
};

TEST(GroupCoordinatorRandom, InvariantsHoldUnderRandomOperations) {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    Sim sim(seed, /*n_clients=*/7, /*n_static=*/static_cast<int>(seed % 3));
    sim.Run(3000);
    if (::testing::Test::HasFailure()) break;
  }
}

// Several threads at once (ASan/UBSan catch misuse; callbacks may run on any
// caller's thread): every callback still runs exactly once.
TEST(GroupCoordinatorThreads, ConcurrentCallersAndTicks) {
  GroupCoordinator c(TestOptions());
  std::atomic<int64_t> clock_ms{0};
  std::mutex mu;
  std::map<uint64_t, int> calls;
  std::vector<std::string> ids;
  std::atomic<uint64_t> next_req{1};
  std::atomic<bool> stop{false};
  auto record = [&](uint64_t req, const std::string& member_id) {
    std::lock_guard lock(mu);
    ++calls[req];
    if (!member_id.empty()) ids.push_back(member_id);
  };
  auto worker = [&](int seed) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    for (int i = 0; i < 2000; ++i) {
      TimePoint now = T(clock_ms.load());
      std::string member;
      {
        std::lock_guard lock(mu);
        if (!ids.empty() && rng() % 2 == 0) member = ids[rng() % ids.size()];
      }
      std::string group = fmt::format("g{}", rng() % 3);
      uint64_t req = next_req++;
      {
        std::lock_guard lock(mu);
        calls[req] = 0;
      }
      switch (rng() % 4) {
        case 0: {
          JoinGroupInput in;
          in.group_id = group;
          in.session_timeout_ms = 10000;
          in.member_id = member;
          in.protocol_type = "consumer";
          in.protocols = {{"range", "m"}};
          in.version = static_cast<int16_t>(rng() % 6);
          in.client_id = "t";
          c.JoinGroup(in, now, [&, req](JoinGroupResult r) { record(req, r.member_id); });
          break;
        }
        case 1: {
          SyncGroupInput in{group, static_cast<int32_t>(rng() % 5), member, std::nullopt, std::nullopt,
                            std::nullopt, {{member, "a"}}};
          c.SyncGroup(in, now, [&, req](SyncGroupResult) { record(req, ""); });
          break;
        }
        case 2:
          (void)c.Heartbeat(group, static_cast<int32_t>(rng() % 5), member, std::nullopt, now);
          record(req, "");
          break;
        default:
          (void)c.LeaveGroup(LeaveGroupInput{group, {{member, std::nullopt}}, 3}, now);
          record(req, "");
      }
    }
  };
  std::thread ticker([&] {
    while (!stop.load()) {
      clock_ms += 50;
      c.Tick(T(clock_ms.load()));
      (void)c.Stats();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t + 1);
  for (auto& t : threads) t.join();
  stop = true;
  ticker.join();
  c.Shutdown();
  std::lock_guard lock(mu);
  for (const auto& [req, n] : calls) EXPECT_EQ(n, 1) << req;
}

}  // namespace
}  // namespace weir::kafka
