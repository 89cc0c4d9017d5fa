// Consumer-group coordinator for the Kafka listener (issue #6): the classic
// group membership protocol (JoinGroup v0–5, SyncGroup v0–3, Heartbeat v0–3,
// LeaveGroup v0–3) and the generation checks of OffsetCommit, for one node
// that coordinates every group. A deterministic state machine: no I/O, no
// wire types, no clock of its own (every call takes `now`), so tests drive it
// with a fake clock. docs/kafka-groups.md describes states, timeouts, limits.
//
// The broker never interprets member metadata or assignments: it passes the
// protocol type, protocol names and metadata bytes through, picks the group
// protocol by vote among the protocols every member supports, elects a leader,
// hands the leader every member's metadata, and distributes the leader's
// assignment in SyncGroup. Group state lives in memory only: after a restart
// members get UNKNOWN_MEMBER_ID and rejoin (committed offsets are stored by
// the handlers, not here).
//
// Ownership and threads: one GroupCoordinator per node, owned by the Kafka
// server; any thread may call any method (one internal mutex, held briefly,
// never across a callback). The server calls Tick(now) about every 100 ms.
//
// Response callbacks (`respond` of JoinGroup and SyncGroup):
//  - Each is invoked exactly once: inside the call, or later from inside
//    another call or Tick (a delayed response), or by Shutdown. Dropping the
//    coordinator without Shutdown drops pending callbacks uncalled.
//  - They run on the thread of the call that completes them, after the
//    coordinator's lock is released; they must not block and must not call
//    back into the coordinator (hand the result to the connection instead).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/clock.h"

namespace weir::kafka {

// Kafka error codes this module returns (values from the Kafka protocol).
inline constexpr int16_t kErrUnknownServerError = -1;
inline constexpr int16_t kErrNone = 0;
inline constexpr int16_t kErrCoordinatorNotAvailable = 15;
inline constexpr int16_t kErrIllegalGeneration = 22;
inline constexpr int16_t kErrInconsistentGroupProtocol = 23;
inline constexpr int16_t kErrInvalidGroupId = 24;
inline constexpr int16_t kErrUnknownMemberId = 25;
inline constexpr int16_t kErrInvalidSessionTimeout = 26;
inline constexpr int16_t kErrInvalidRequest = 42;
inline constexpr int16_t kErrRebalanceInProgress = 27;
inline constexpr int16_t kErrNonEmptyGroup = 68;
inline constexpr int16_t kErrGroupIdNotFound = 69;
inline constexpr int16_t kErrMemberIdRequired = 79;
inline constexpr int16_t kErrGroupMaxSizeReached = 81;
inline constexpr int16_t kErrFencedInstanceId = 82;

struct GroupOptions {
  // Accepted session timeouts (Kafka's group.min/max.session.timeout.ms).
  Duration min_session_timeout = std::chrono::seconds(6);
  Duration max_session_timeout = std::chrono::minutes(30);
  // The first rebalance of an Empty group waits this long, and again (within
  // the rebalance timeout) while new members keep arriving
  // (group.initial.rebalance.delay.ms). 0 completes it as soon as possible.
  Duration initial_rebalance_delay = std::chrono::seconds(3);
  // A new member whose first JoinGroup is still waiting after this long is
  // dropped (its client most likely gave up and retried with a new id).
  Duration new_member_join_timeout = std::chrono::minutes(5);
  // An Empty group (no members, no pending member ids) is forgotten after
  // this long; it holds nothing but its generation number.
  Duration empty_group_retention = std::chrono::minutes(10);
  // Bounded memory. Joining a group with max_members (members plus member ids
  // handed out by MEMBER_ID_REQUIRED and not yet used) gets
  // GROUP_MAX_SIZE_REACHED. Creating a group beyond max_groups first forgets
  // the longest-empty group; if every group is in use the join gets
  // COORDINATOR_NOT_AVAILABLE (retriable: clients back off and retry).
  size_t max_groups = 10000;
  size_t max_members_per_group = 1000;
  // A JoinGroup offering more protocols than this, or whose protocols,
  // metadata, ids and client strings exceed max_member_bytes, and a leader's
  // SyncGroup carrying an assignment over max_member_bytes, get
  // INVALID_REQUEST. Every member and MEMBER_ID_REQUIRED id of every group is
  // charged against max_total_bytes (what it holds plus 256 bytes); a join
  // or sync that would pass it gets COORDINATOR_NOT_AVAILABLE (retriable).
  size_t max_protocols_per_member = 32;
  size_t max_member_bytes = size_t{4} << 20;
  size_t max_total_bytes = size_t{256} << 20;
  // Seed for generated member ids; 0 seeds from std::random_device.
  uint64_t member_id_seed = 0;
};

enum class GroupState { kEmpty, kPreparingRebalance, kCompletingRebalance, kStable };
// Kafka's names: "Empty", "PreparingRebalance", "CompletingRebalance", "Stable".
std::string_view GroupStateName(GroupState state);

struct JoinGroupInput {
  std::string group_id;
  int32_t session_timeout_ms = 0;
  int32_t rebalance_timeout_ms = -1;  // v0 has none: <= 0 or version 0 means the session timeout
  std::string member_id;              // "" for a first join
  std::optional<std::string> group_instance_id;  // static membership (v5+)
  std::string protocol_type;
  std::vector<std::pair<std::string, std::string>> protocols;  // (name, metadata), preferred first
  int16_t version = 0;  // v4+ gets MEMBER_ID_REQUIRED on a first dynamic join
  std::string client_id;
  std::string client_host;
};

struct JoinGroupMember {
  std::string member_id;
  std::optional<std::string> group_instance_id;
  std::string metadata;  // for the selected protocol
};

struct JoinGroupResult {
  int16_t error_code = kErrNone;
  int32_t generation_id = -1;
  std::string protocol_type;
  std::string protocol_name;
  std::string leader;
  std::string member_id;
  std::vector<JoinGroupMember> members;  // only for the leader, in join order
};

struct SyncGroupInput {
  std::string group_id;
  int32_t generation_id = -1;
  std::string member_id;
  std::optional<std::string> group_instance_id;
  std::optional<std::string> protocol_type;  // v5+; checked when present
  std::optional<std::string> protocol_name;  // v5+; checked when present
  std::vector<std::pair<std::string, std::string>> assignments;  // leader only: (member id, bytes)
};

struct SyncGroupResult {
  int16_t error_code = kErrNone;
  std::string protocol_type;
  std::string protocol_name;
  std::string assignment;  // empty bytes when the leader assigned nothing to this member
};

struct LeaveGroupMember {
  std::string member_id;  // "" with an instance id: remove that static member
  std::optional<std::string> group_instance_id;
};

struct LeaveGroupInput {
  std::string group_id;
  std::vector<LeaveGroupMember> members;  // v0–2: exactly one
  int16_t version = 0;
};

struct LeaveGroupMemberResult {
  std::string member_id;
  std::optional<std::string> group_instance_id;
  int16_t error_code = kErrNone;
};

struct LeaveGroupResult {
  // Top-level error. For v0–2 it carries the single member's error, as the
  // v0–2 response has no per-member errors.
  int16_t error_code = kErrNone;
  std::vector<LeaveGroupMemberResult> members;  // one per input member, in order
};

struct MemberDescription {
  std::string member_id;
  std::optional<std::string> group_instance_id;
  std::string client_id;
  std::string client_host;
  std::string metadata;    // for the selected protocol; empty while none is selected
  std::string assignment;  // this generation's, once the leader synced
};

struct GroupDescription {
  std::string group_id;
  GroupState state = GroupState::kEmpty;
  int32_t generation_id = 0;
  std::string protocol_type;
  std::string protocol_name;  // "" until a generation with members completed
  std::string leader;         // "" when there are no members
  std::vector<MemberDescription> members;  // in join order
  size_t pending_member_ids = 0;  // handed out by MEMBER_ID_REQUIRED, not yet used
  // Bytes of strings `members` holds (or would hold); past DescribeGroup's
  // max_member_bytes, `members` is left empty (nothing of them copied).
  size_t member_bytes = 0;
  bool members_left_out = false;
};

struct GroupOverview {
  std::string group_id;
  std::string protocol_type;
  GroupState state = GroupState::kEmpty;
  TimePoint empty_since{};  // kEmpty: when it last became empty (or was made)
};

struct GroupCoordinatorStats {
  size_t groups = 0;
  size_t members = 0;
  size_t pending_member_ids = 0;
  size_t bytes = 0;  // charged against GroupOptions::max_total_bytes
  size_t groups_in_state[4] = {};  // indexed by GroupState
  uint64_t rebalances_completed = 0;  // generations started with members
  uint64_t members_expired = 0;       // session, join or sync timeouts
};

class GroupCoordinator {
 public:
  // Longest group id any group API takes (INVALID_GROUP_ID beyond): a group
  // keeps it uncharged, and PostgreSQL indexes it.
  static constexpr size_t kMaxGroupIdBytes = 255;
  using JoinCallback = std::function<void(JoinGroupResult)>;
  using SyncCallback = std::function<void(SyncGroupResult)>;

  explicit GroupCoordinator(GroupOptions opts = {});
  ~GroupCoordinator();
  GroupCoordinator(const GroupCoordinator&) = delete;
  GroupCoordinator& operator=(const GroupCoordinator&) = delete;

  // Responds now (errors, MEMBER_ID_REQUIRED, a known member rejoining a
  // stable group) or when the group's rebalance completes.
  void JoinGroup(const JoinGroupInput& in, TimePoint now, JoinCallback respond);
  // Responds now, or (a follower during CompletingRebalance) when the leader
  // syncs or the rebalance is abandoned.
  void SyncGroup(const SyncGroupInput& in, TimePoint now, SyncCallback respond);
  int16_t Heartbeat(std::string_view group_id, int32_t generation_id, std::string_view member_id,
                    const std::optional<std::string>& group_instance_id, TimePoint now);
  LeaveGroupResult LeaveGroup(const LeaveGroupInput& in, TimePoint now);
  // For OffsetCommit: NONE if the commit may proceed, else the Kafka error for
  // every partition. Generation -1 with an empty member id and no instance id
  // is a standalone (simple consumer) commit, allowed while the group has no
  // members. A member's commit renews its session.
  int16_t ValidateCommit(std::string_view group_id, int32_t generation_id, std::string_view member_id,
                         const std::optional<std::string>& group_instance_id, TimePoint now);
  // For DeleteGroups: NONE (forgotten), GROUP_ID_NOT_FOUND or NON_EMPTY_GROUP.
  int16_t DeleteGroup(std::string_view group_id);

  // Expires sessions and member ids, completes rebalances whose delay or
  // timeout passed, drops members that never synced, forgets old Empty
  // groups. Cheap when nothing is due.
  void Tick(TimePoint now);
  // Answers every pending callback with COORDINATOR_NOT_AVAILABLE; later calls
  // get COORDINATOR_NOT_AVAILABLE too. Call before tearing down connections.
  void Shutdown();

  // Copies the members only when that copies at most `max_member_bytes`
  // (GroupDescription::members_left_out otherwise).
  std::optional<GroupDescription> DescribeGroup(std::string_view group_id, size_t max_member_bytes = SIZE_MAX) const;
  std::vector<GroupOverview> ListGroups() const;  // sorted by group id
  GroupCoordinatorStats Stats() const;

 private:
  struct Member;
  struct Group;
  using Outbox = std::vector<std::function<void()>>;
  using GroupMap = std::map<std::string, std::unique_ptr<Group>, std::less<>>;

  // All of these run with mu_ held and queue callbacks in `out`.
  Group* FindGroup(std::string_view id);
  Group* CreateGroup(const std::string& id, TimePoint now);
  std::string NewMemberId(std::string_view prefix);
  void JoinLocked(const JoinGroupInput& in, int32_t rebalance_ms, TimePoint now, JoinCallback& respond,
                  Outbox& out);
  void SyncLocked(const SyncGroupInput& in, TimePoint now, SyncCallback& respond, Outbox& out);
  void AddMember(Group& g, const std::string& member_id, const JoinGroupInput& in, int32_t rebalance_ms,
                 TimePoint now, JoinCallback respond, Outbox& out);
  void ReplaceStaticMember(Group& g, const std::string& old_id, const JoinGroupInput& in, int32_t rebalance_ms,
                           TimePoint now, JoinCallback respond, Outbox& out);
  void UpdateMemberAndRebalance(Group& g, Member& m, const JoinGroupInput& in, int32_t rebalance_ms,
                                TimePoint now, JoinCallback respond, Outbox& out);
  void RemoveMember(Group& g, const std::string& member_id, TimePoint now, bool update_group, Outbox& out);
  void PrepareRebalance(Group& g, TimePoint now, Outbox& out);
  void MaybeCompleteJoin(Group& g, TimePoint now, Outbox& out);
  void CompleteJoin(Group& g, TimePoint now, Outbox& out);
  void TickGroup(Group& g, TimePoint now, Outbox& out);
  void Refresh(Group& g);
  bool EvictOneEmptyGroup();
  // Memory accounting (bytes_): a member is charged what it holds; Recharge
  // after changing it, Discharge when it goes. Pending ids and whole groups
  // go through AddPending / ErasePending / EraseGroup.
  void Recharge(Member& m);
  void Discharge(const Member& m);
  void AddPending(Group& g, const std::string& id, TimePoint expiry);
  void ErasePending(Group& g, std::string_view id);
  GroupMap::iterator EraseGroup(GroupMap::iterator it);  // the next group
  JoinGroupResult CurrentGeneration(const Group& g, const Member& m, std::string_view leader) const;
  static void Run(Outbox& out);

  const GroupOptions opts_;
  mutable std::mutex mu_;
  GroupMap groups_;
  std::mt19937_64 rng_;
  uint64_t next_seq_ = 0;
  size_t bytes_ = 0;  // charged by every member and pending id, see GroupOptions::max_total_bytes
  bool shut_down_ = false;
  uint64_t rebalances_completed_ = 0;
  uint64_t members_expired_ = 0;
};

}  // namespace weir::kafka
