#include "kafka/group_coordinator.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/utf8.h"

namespace weir::kafka {
namespace {

using Protocols = std::vector<std::pair<std::string, std::string>>;

Duration Ms(int32_t ms) { return std::chrono::milliseconds(ms); }

// What a member or a pending member id is charged beyond its strings (map
// nodes, the struct itself, callbacks).
constexpr size_t kEntryBytes = 256;

size_t ProtocolBytes(const Protocols& protocols) {
  size_t n = 0;
  for (const auto& [name, metadata] : protocols) n += name.size() + metadata.size();
  return n;
}

// A new member id's prefix (the client id, or a static member's instance id)
// is cut to this many bytes: ids are opaque to clients, and a pending id is
// held for its session timeout.
constexpr size_t kMaxMemberIdPrefix = 64;
constexpr size_t kUuidBytes = 37;  // "-" and a UUID

// Group ids and protocol types a join may bring (a group keeps them, uncharged).
constexpr size_t kMaxGroupString = GroupCoordinator::kMaxGroupIdBytes;

// What a member joining with `in` will hold, its assignment aside: as
// Member::Bytes counts it (its id is the one it sent, or a new one).
size_t JoinBytes(const JoinGroupInput& in) {
  const size_t prefix = in.group_instance_id ? in.group_instance_id->size() : in.client_id.size();
  const size_t id = !in.member_id.empty() ? in.member_id.size() : std::min(prefix, kMaxMemberIdPrefix) + kUuidBytes;
  return kEntryBytes + id + in.group_instance_id.value_or("").size() + in.client_id.size() +
         in.client_host.size() + ProtocolBytes(in.protocols);
}

}  // namespace

std::string_view GroupStateName(GroupState state) {
  switch (state) {
    case GroupState::kEmpty: return "Empty";
    case GroupState::kPreparingRebalance: return "PreparingRebalance";
    case GroupState::kCompletingRebalance: return "CompletingRebalance";
    case GroupState::kStable: return "Stable";
  }
  return "Unknown";
}

// One member of a Group, owned by it (members); touched only under the
// coordinator's mu_. Bytes() is what it is charged against max_total_bytes.
struct GroupCoordinator::Member {
  std::string id;
  std::optional<std::string> instance_id;
  std::string client_id;
  std::string client_host;
  int32_t session_ms = 0;
  int32_t rebalance_ms = 0;
  Protocols protocols;
  std::string assignment;
  JoinCallback join_cb;  // set while a JoinGroup waits for the rebalance
  SyncCallback sync_cb;  // set while a SyncGroup waits for the leader
  bool is_new = true;    // has not had a JoinGroup response yet
  bool pending_sync = false;  // owes a SyncGroup for this generation
  uint64_t seq = 0;           // join order
  TimePoint session_deadline{};     // applies while not awaiting join or sync
  TimePoint new_member_deadline{};  // applies while new and awaiting join
  size_t charged = 0;               // counted in GroupCoordinator::bytes_

  size_t Bytes() const {
    return kEntryBytes + id.size() + (instance_id ? instance_id->size() : 0) + client_id.size() +
           client_host.size() + ProtocolBytes(protocols) + assignment.size();
  }

  bool Supports(std::string_view protocol) const {
    return std::any_of(protocols.begin(), protocols.end(), [&](const auto& p) { return p.first == protocol; });
  }
  std::string MetadataFor(std::string_view protocol) const {
    for (const auto& [name, metadata] : protocols) {
      if (name == protocol) return metadata;
    }
    return {};
  }
  // Bytes of what a description of this member copies (MemberDescription).
  size_t DescribedBytes(std::string_view protocol) const {
    size_t n = id.size() + (instance_id ? instance_id->size() : 0) + client_id.size() + client_host.size() +
               assignment.size();
    for (const auto& [name, metadata] : protocols) {
      if (name == protocol) n += metadata.size();
    }
    return n;
  }
};

// One group's membership state. Owned by the GroupCoordinator (groups_);
// touched only under its mu_, from whichever thread calls the coordinator.
// Its members' waiting callbacks are never run under mu_: what completes goes
// to the caller's Outbox, run once mu_ is released.
struct GroupCoordinator::Group {
  std::string id;
  GroupState state = GroupState::kEmpty;
  int32_t generation = 0;
  std::string protocol_type;
  std::string protocol_name;  // "" while no generation with members is current
  std::string leader;         // "" iff there are no members
  std::map<std::string, Member, std::less<>> members;
  std::map<std::string, std::string, std::less<>> static_members;  // instance id -> member id
  std::map<std::string, TimePoint, std::less<>> pending;           // member id -> expiry
  // PreparingRebalance: the join completes at join_deadline, or earlier once
  // every member rejoined (not during the initial delay).
  TimePoint join_deadline{};
  bool initial_delay = false;
  bool new_member_added = false;
  Duration initial_remaining{};
  // CompletingRebalance and Stable: members owing a SyncGroup are removed at sync_deadline.
  bool sync_armed = false;
  TimePoint sync_deadline{};
  TimePoint empty_since{};
  TimePoint next_check{};  // no deadline of this group is earlier

  Member* Find(std::string_view member_id) {
    auto it = members.find(member_id);
    return it == members.end() ? nullptr : &it->second;
  }
  std::vector<Member*> Ordered() {
    std::vector<Member*> v;
    v.reserve(members.size());
    for (auto& [id, m] : members) v.push_back(&m);
    std::sort(v.begin(), v.end(), [](const Member* a, const Member* b) { return a->seq < b->seq; });
    return v;
  }
  int32_t RebalanceTimeoutMs() const {
    int32_t t = 0;
    for (const auto& [id, m] : members) t = std::max(t, m.rebalance_ms);
    return t;
  }
  bool AllJoined() const {
    return pending.empty() &&
           std::all_of(members.begin(), members.end(), [](const auto& kv) { return bool(kv.second.join_cb); });
  }
  bool CanRebalance() const { return state != GroupState::kPreparingRebalance; }

  // A request naming a current member: an instance id must map to that member
  // id (FENCED_INSTANCE_ID if it maps to another), and the member must exist.
  int16_t Validate(std::string_view member_id, const std::optional<std::string>& instance_id) const {
    if (instance_id) {
      auto it = static_members.find(*instance_id);
      if (it == static_members.end()) return kErrUnknownMemberId;
      if (it->second != member_id) return kErrFencedInstanceId;
    }
    return members.find(member_id) == members.end() ? kErrUnknownMemberId : kErrNone;
  }
  // Kafka's rule (GroupCoordinator.acceptJoiningMember) for a join by
  // `member_id` (a member, a pending id, or ""): in PreparingRebalance only
  // the members that stay count: those that rejoined, and static members
  // (kept when the join completes; Kafka counts only the rejoined, so its
  // groups can end up over the limit); the dynamic members that did not
  // rejoin are dropped then. Otherwise every member counts; an empty group
  // takes anyone. Ids handed out with MEMBER_ID_REQUIRED are not members and
  // do not count. So a group has at most `max` members once a join completes.
  bool AcceptsJoin(std::string_view member_id, size_t max) const {
    auto it = members.find(member_id);
    switch (state) {
      case GroupState::kEmpty:
        return true;
      case GroupState::kPreparingRebalance: {
        if (it != members.end() && (it->second.join_cb || it->second.instance_id)) return true;
        const auto staying = std::count_if(members.begin(), members.end(), [](const auto& kv) {
          return kv.second.join_cb || kv.second.instance_id;
        });
        return static_cast<size_t>(staying) < max;
      }
      case GroupState::kCompletingRebalance:
      case GroupState::kStable:
        return it != members.end() || members.size() < max;
    }
    return false;
  }

  // Whether a member offering `protocols` of `type` may be in the group next
  // to every member other than `exclude`: same type and at least one protocol
  // all of them support. (Kafka counts the member's own old protocols too,
  // which refuses a sole member changing protocol; this does not.)
  bool SupportsProtocols(std::string_view type, const Protocols& protocols, std::string_view exclude) const {
    if (type.empty() || protocols.empty()) return false;
    bool others = std::any_of(members.begin(), members.end(), [&](const auto& kv) { return kv.first != exclude; });
    if (!others) return true;
    if (type != protocol_type) return false;
    for (const auto& [name, metadata] : protocols) {
      bool all = true;
      for (const auto& [id, m] : members) {
        if (id != exclude && !m.Supports(name)) {
          all = false;
          break;
        }
      }
      if (all) return true;
    }
    return false;
  }

  // Kafka's vote: candidates are the protocols every member supports; each
  // member votes for its most preferred candidate; most votes wins. Ties go to
  // the candidate the earliest member prefers.
  std::string SelectProtocol() {
    std::vector<Member*> ordered = Ordered();
    if (ordered.empty()) return {};
    std::vector<std::string> candidates;
    for (const auto& [name, metadata] : ordered.front()->protocols) {
      bool all = std::all_of(ordered.begin(), ordered.end(), [&](const Member* m) { return m->Supports(name); });
      if (all && std::find(candidates.begin(), candidates.end(), name) == candidates.end()) {
        candidates.push_back(name);
      }
    }
    // Unreachable while joins check SupportsProtocols; the first member's choice keeps going.
    if (candidates.empty()) return ordered.front()->protocols.front().first;
    std::vector<size_t> votes(candidates.size(), 0);
    for (const Member* m : ordered) {
      for (const auto& [name, metadata] : m->protocols) {
        auto it = std::find(candidates.begin(), candidates.end(), name);
        if (it != candidates.end()) {
          ++votes[static_cast<size_t>(it - candidates.begin())];
          break;
        }
      }
    }
    size_t best = 0;
    for (size_t i = 1; i < candidates.size(); ++i) {
      if (votes[i] > votes[best]) best = i;
    }
    return candidates[best];
  }
};

namespace {

// Moves a callback out and leaves the source empty (a moved-from
// std::function is only "valid but unspecified").
template <typename F>
F Take(F& f) {
  F taken = std::move(f);
  f = nullptr;
  return taken;
}

void QueueJoin(std::vector<std::function<void()>>& out, GroupCoordinator::JoinCallback cb, JoinGroupResult r) {
  out.push_back([cb = std::move(cb), r = std::move(r)]() mutable { cb(std::move(r)); });
}

void QueueSync(std::vector<std::function<void()>>& out, GroupCoordinator::SyncCallback cb, SyncGroupResult r) {
  out.push_back([cb = std::move(cb), r = std::move(r)]() mutable { cb(std::move(r)); });
}

JoinGroupResult JoinError(int16_t code, std::string member_id) {
  JoinGroupResult r;
  r.error_code = code;
  r.member_id = std::move(member_id);
  return r;
}

SyncGroupResult SyncError(int16_t code) {
  SyncGroupResult r;
  r.error_code = code;
  return r;
}

}  // namespace

GroupCoordinator::GroupCoordinator(GroupOptions opts)
    : opts_(std::move(opts)), rng_(opts_.member_id_seed != 0 ? opts_.member_id_seed : std::random_device{}()) {}

GroupCoordinator::~GroupCoordinator() = default;

void GroupCoordinator::Run(Outbox& out) {
  for (auto& f : out) f();
  out.clear();
}

GroupCoordinator::Group* GroupCoordinator::FindGroup(std::string_view id) {
  auto it = groups_.find(id);
  return it == groups_.end() ? nullptr : it->second.get();
}

GroupCoordinator::Group* GroupCoordinator::CreateGroup(const std::string& id, TimePoint now) {
  if (groups_.size() >= opts_.max_groups && !EvictOneEmptyGroup()) return nullptr;
  auto g = std::make_unique<Group>();
  g->id = id;
  g->empty_since = now;
  Group* raw = g.get();
  groups_.emplace(id, std::move(g));
  return raw;
}

bool GroupCoordinator::EvictOneEmptyGroup() {
  auto victim = groups_.end();
  for (auto it = groups_.begin(); it != groups_.end(); ++it) {
    const Group& g = *it->second;
    // Member ids handed out by MEMBER_ID_REQUIRED do not keep a group (a
    // client coming back with one gets UNKNOWN_MEMBER_ID and joins afresh),
    // but such a group, being joined now, goes after every truly empty one.
    if (g.state != GroupState::kEmpty || !g.members.empty()) continue;
    auto rank = [](const Group& x) { return std::pair(!x.pending.empty(), x.empty_since); };
    if (victim == groups_.end() || rank(g) < rank(*victim->second)) victim = it;
  }
  if (victim == groups_.end()) return false;
  EraseGroup(victim);
  return true;
}

void GroupCoordinator::Recharge(Member& m) {
  const size_t now_holds = m.Bytes();
  bytes_ = bytes_ - m.charged + now_holds;
  m.charged = now_holds;
}

void GroupCoordinator::Discharge(const Member& m) { bytes_ -= m.charged; }

void GroupCoordinator::AddPending(Group& g, const std::string& id, TimePoint expiry) {
  auto [it, added] = g.pending.insert_or_assign(id, expiry);
  if (added) bytes_ += kEntryBytes + id.size();
}

void GroupCoordinator::ErasePending(Group& g, std::string_view id) {
  auto it = g.pending.find(id);
  if (it == g.pending.end()) return;
  bytes_ -= kEntryBytes + it->first.size();
  g.pending.erase(it);
}

GroupCoordinator::GroupMap::iterator GroupCoordinator::EraseGroup(GroupMap::iterator it) {
  for (const auto& [id, m] : it->second->members) Discharge(m);
  for (const auto& [id, expiry] : it->second->pending) bytes_ -= kEntryBytes + id.size();
  return groups_.erase(it);
}

// "<prefix>-<uuid>", as Kafka forms member ids (prefix: client id, or the
// instance id of a static member). The request header's client id is not
// checked as UTF-8, but member ids are strings the client sends back: a
// prefix that is not UTF-8 keeps its printable ASCII and gets '_' for the
// other bytes, or every later request of the member would be refused.
std::string GroupCoordinator::NewMemberId(std::string_view prefix) {
  std::string ascii;
  if (!IsValidUtf8(prefix)) {
    ascii.reserve(std::min(prefix.size(), kMaxMemberIdPrefix));
    for (char c : prefix.substr(0, kMaxMemberIdPrefix)) ascii.push_back(c >= 0x20 && c < 0x7f ? c : '_');
    prefix = ascii;
  }
  if (prefix.size() > kMaxMemberIdPrefix) {
    size_t cut = kMaxMemberIdPrefix;
    while (cut > 0 && (static_cast<unsigned char>(prefix[cut]) & 0xc0) == 0x80) --cut;  // not inside a UTF-8 character
    prefix = prefix.substr(0, cut);
  }
  uint64_t hi = rng_();
  uint64_t lo = rng_();
  hi = (hi & ~uint64_t{0xf000}) | 0x4000;                                  // version 4
  lo = (lo & ~(uint64_t{0xc} << 60)) | (uint64_t{0x8} << 60);              // variant 10
  return fmt::format("{}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", prefix, hi >> 32, (hi >> 16) & 0xffff, hi & 0xffff,
                     lo >> 48, lo & 0xffffffffffffULL);
}

// ---- JoinGroup ---------------------------------------------------------------

void GroupCoordinator::JoinGroup(const JoinGroupInput& in, TimePoint now, JoinCallback respond) {
  if (!respond) respond = [](JoinGroupResult) {};
  int32_t rebalance_ms =
      (in.version == 0 || in.rebalance_timeout_ms <= 0) ? in.session_timeout_ms : in.rebalance_timeout_ms;
  Outbox out;
  {
    std::lock_guard lock(mu_);
    JoinLocked(in, rebalance_ms, now, respond, out);
  }
  Run(out);
}

void GroupCoordinator::JoinLocked(const JoinGroupInput& in, int32_t rebalance_ms, TimePoint now,
                                  JoinCallback& respond, Outbox& out) {
  auto fail = [&](int16_t code, std::string member_id) {
    QueueJoin(out, std::move(respond), JoinError(code, std::move(member_id)));
  };
  if (shut_down_) return fail(kErrCoordinatorNotAvailable, in.member_id);
  if (in.group_id.empty()) return fail(kErrInvalidGroupId, in.member_id);
  Duration session = Ms(in.session_timeout_ms);
  if (session < opts_.min_session_timeout || session > opts_.max_session_timeout) {
    return fail(kErrInvalidSessionTimeout, in.member_id);
  }
  const bool unknown = in.member_id.empty();
  Group* g = FindGroup(in.group_id);
  if (in.group_id.size() > kMaxGroupString) return fail(kErrInvalidGroupId, in.member_id);
  const size_t wants = JoinBytes(in);
  if (in.protocols.size() > opts_.max_protocols_per_member || wants > opts_.max_member_bytes ||
      in.protocol_type.size() > kMaxGroupString) {
    return fail(kErrInvalidRequest, in.member_id);
  }
  // A member rejoining (or a static member's new incarnation, or a pending
  // id joining) gives back what it holds now, its assignment aside (kept
  // until the rebalance clears it): an unchanged rejoin costs nothing.
  size_t gives_back = 0;
  if (g != nullptr) {
    const Member* held = nullptr;
    if (!unknown) {
      held = g->Find(in.member_id);
      if (auto p = g->pending.find(in.member_id); held == nullptr && p != g->pending.end()) {
        gives_back = kEntryBytes + p->first.size();
      }
    } else if (in.group_instance_id) {
      auto it = g->static_members.find(*in.group_instance_id);
      if (it != g->static_members.end()) held = g->Find(it->second);
    }
    if (held != nullptr) gives_back = held->charged - held->assignment.size();
  }
  if (bytes_ - gives_back + wants > opts_.max_total_bytes) return fail(kErrCoordinatorNotAvailable, in.member_id);
  bool created = false;
  if (g == nullptr) {
    // Only a first join creates a group; a member id for a group we do not
    // know (say, from before a restart) must start over.
    if (!unknown) return fail(kErrUnknownMemberId, in.member_id);
    g = CreateGroup(in.group_id, now);
    if (g == nullptr) return fail(kErrCoordinatorNotAvailable, in.member_id);
    created = true;
  }

  if (unknown) {
    // A known instance id without a member id: a restarted static member.
    std::string old_static;
    if (in.group_instance_id) {
      auto it = g->static_members.find(*in.group_instance_id);
      if (it != g->static_members.end()) old_static = it->second;
    }
    if (!g->SupportsProtocols(in.protocol_type, in.protocols, old_static)) {
      fail(kErrInconsistentGroupProtocol, "");
    } else if (!old_static.empty()) {
      ReplaceStaticMember(*g, old_static, in, rebalance_ms, now, std::move(respond), out);
    } else if (!g->AcceptsJoin("", opts_.max_members_per_group)) {
      fail(kErrGroupMaxSizeReached, "");
    } else if (in.group_instance_id) {
      AddMember(*g, NewMemberId(*in.group_instance_id), in, rebalance_ms, now, std::move(respond), out);
    } else if (in.version >= 4 && g->pending.size() >= opts_.max_members_per_group) {
      // Ids handed out and not yet used (they expire with the session
      // timeout): a retryable refusal, as Kafka has no such limit.
      fail(kErrCoordinatorNotAvailable, "");
    } else if (in.version >= 4) {
      // KIP-394: hand out the id first; the member joins when it comes back with it.
      std::string id = NewMemberId(in.client_id);
      AddPending(*g, id, now + session);
      QueueJoin(out, std::move(respond), JoinError(kErrMemberIdRequired, id));
    } else {
      AddMember(*g, NewMemberId(in.client_id), in, rebalance_ms, now, std::move(respond), out);
    }
  } else if (!g->SupportsProtocols(in.protocol_type, in.protocols, in.member_id)) {
    fail(kErrInconsistentGroupProtocol, in.member_id);
  } else if (!in.group_instance_id && g->pending.count(in.member_id) != 0) {
    ErasePending(*g, in.member_id);
    if (g->AcceptsJoin(in.member_id, opts_.max_members_per_group)) {
      AddMember(*g, in.member_id, in, rebalance_ms, now, std::move(respond), out);
    } else {
      fail(kErrGroupMaxSizeReached, "");
    }
  } else if (int16_t err = g->Validate(in.member_id, in.group_instance_id); err != kErrNone) {
    fail(err, in.member_id);
  } else if (!g->AcceptsJoin(in.member_id, opts_.max_members_per_group)) {
    // As Kafka: newer members filled the rebalance first; this one is out.
    RemoveMember(*g, in.member_id, now, /*update_group=*/true, out);
    fail(kErrGroupMaxSizeReached, "");
  } else {
    Member& m = *g->Find(in.member_id);
    switch (g->state) {
      case GroupState::kPreparingRebalance:
        UpdateMemberAndRebalance(*g, m, in, rebalance_ms, now, std::move(respond), out);
        break;
      case GroupState::kCompletingRebalance:
        // Same metadata: the member missed its JoinGroup response; send it again.
        if (m.protocols == in.protocols) {
          m.session_deadline = now + Ms(m.session_ms);
          QueueJoin(out, std::move(respond), CurrentGeneration(*g, m, g->leader));
        } else {
          UpdateMemberAndRebalance(*g, m, in, rebalance_ms, now, std::move(respond), out);
        }
        break;
      case GroupState::kStable:
        // The leader rejoins to force a rebalance (say, its topics changed);
        // a follower with unchanged metadata just gets the generation back.
        if (g->leader == m.id || m.protocols != in.protocols) {
          UpdateMemberAndRebalance(*g, m, in, rebalance_ms, now, std::move(respond), out);
        } else {
          m.session_deadline = now + Ms(m.session_ms);
          QueueJoin(out, std::move(respond), CurrentGeneration(*g, m, g->leader));
        }
        break;
      case GroupState::kEmpty:  // no members: unreachable
        fail(kErrUnknownMemberId, in.member_id);
        break;
    }
  }

  MaybeCompleteJoin(*g, now, out);
  if (created && g->members.empty() && g->pending.empty()) {
    EraseGroup(groups_.find(in.group_id));  // a failed first join leaves nothing behind
    return;
  }
  Refresh(*g);
}

JoinGroupResult GroupCoordinator::CurrentGeneration(const Group& g, const Member& m, std::string_view leader) const {
  JoinGroupResult r;
  r.generation_id = g.generation;
  r.protocol_type = g.protocol_type;
  r.protocol_name = g.protocol_name;
  r.leader = std::string(leader);
  r.member_id = m.id;
  if (m.id == leader) {
    std::vector<const Member*> ordered;
    for (const auto& [id, other] : g.members) ordered.push_back(&other);
    std::sort(ordered.begin(), ordered.end(), [](const Member* a, const Member* b) { return a->seq < b->seq; });
    for (const Member* other : ordered) {
      r.members.push_back(JoinGroupMember{other->id, other->instance_id, other->MetadataFor(g.protocol_name)});
    }
  }
  return r;
}

void GroupCoordinator::AddMember(Group& g, const std::string& member_id, const JoinGroupInput& in,
                                 int32_t rebalance_ms, TimePoint now, JoinCallback respond, Outbox& out) {
  Member m;
  m.id = member_id;
  m.instance_id = in.group_instance_id;
  m.client_id = in.client_id;
  m.client_host = in.client_host;
  m.session_ms = in.session_timeout_ms;
  m.rebalance_ms = rebalance_ms;
  m.protocols = in.protocols;
  m.join_cb = std::move(respond);
  m.seq = next_seq_++;
  m.session_deadline = now + Ms(m.session_ms);
  m.new_member_deadline = now + opts_.new_member_join_timeout;
  if (g.members.empty()) g.protocol_type = in.protocol_type;
  if (g.leader.empty()) g.leader = member_id;
  if (m.instance_id) g.static_members[*m.instance_id] = member_id;
  // A member arriving during a new group's initial delay extends it (within
  // the rebalance timeout); a group re-forming from Empty waits the delay once.
  if (g.state == GroupState::kPreparingRebalance && g.initial_delay && g.generation == 0) g.new_member_added = true;
  Recharge(g.members.emplace(member_id, std::move(m)).first->second);
  if (g.CanRebalance()) PrepareRebalance(g, now, out);
}

void GroupCoordinator::UpdateMemberAndRebalance(Group& g, Member& m, const JoinGroupInput& in, int32_t rebalance_ms,
                                                TimePoint now, JoinCallback respond, Outbox& out) {
  if (m.join_cb) QueueJoin(out, Take(m.join_cb), JoinError(kErrRebalanceInProgress, m.id));  // superseded
  m.protocols = in.protocols;
  m.session_ms = in.session_timeout_ms;
  m.rebalance_ms = rebalance_ms;
  m.client_id = in.client_id;
  m.client_host = in.client_host;
  m.join_cb = std::move(respond);
  Recharge(m);
  if (g.members.size() == 1) g.protocol_type = in.protocol_type;
  if (g.CanRebalance()) PrepareRebalance(g, now, out);
}

// A static member restarted: its instance id comes back without a member id.
// The new incarnation takes the old member's place (and assignment) under a
// new id; the old id is fenced from now on.
void GroupCoordinator::ReplaceStaticMember(Group& g, const std::string& old_id, const JoinGroupInput& in,
                                           int32_t rebalance_ms, TimePoint now, JoinCallback respond, Outbox& out) {
  const std::string prev_leader = g.leader;
  auto node = g.members.extract(old_id);
  Member& m = node.mapped();
  if (m.join_cb) QueueJoin(out, Take(m.join_cb), JoinError(kErrFencedInstanceId, old_id));
  if (m.sync_cb) QueueSync(out, Take(m.sync_cb), SyncError(kErrFencedInstanceId));
  std::string new_id = NewMemberId(*in.group_instance_id);
  node.key() = new_id;
  m.id = new_id;
  m.protocols = in.protocols;
  m.session_ms = in.session_timeout_ms;
  m.rebalance_ms = rebalance_ms;
  m.client_id = in.client_id;
  m.client_host = in.client_host;
  m.session_deadline = now + Ms(m.session_ms);
  g.members.insert(std::move(node));
  Member& placed = *g.Find(new_id);
  Recharge(placed);
  g.static_members[*in.group_instance_id] = new_id;
  if (g.leader == old_id) g.leader = new_id;
  if (g.members.size() == 1) g.protocol_type = in.protocol_type;

  switch (g.state) {
    case GroupState::kStable:
      if (g.SelectProtocol() == g.protocol_name) {
        // No rebalance. The response names the previous leader id, so a
        // replaced leader does not compute an assignment a stable group would
        // never distribute; it syncs and gets its stored assignment.
        QueueJoin(out, std::move(respond), CurrentGeneration(g, placed, prev_leader));
        return;
      }
      placed.join_cb = std::move(respond);
      PrepareRebalance(g, now, out);
      return;
    case GroupState::kCompletingRebalance:
      // The leader may be assigning to the old id: start over.
      placed.join_cb = std::move(respond);
      PrepareRebalance(g, now, out);
      return;
    case GroupState::kPreparingRebalance:
    case GroupState::kEmpty:  // no members: unreachable
      placed.join_cb = std::move(respond);
      return;
  }
}

void GroupCoordinator::RemoveMember(Group& g, const std::string& member_id, TimePoint now, bool update_group,
                                    Outbox& out) {
  auto it = g.members.find(member_id);
  if (it == g.members.end()) return;
  Member m = std::move(it->second);
  g.members.erase(it);
  Discharge(m);
  if (m.join_cb) QueueJoin(out, Take(m.join_cb), JoinError(kErrUnknownMemberId, ""));
  if (m.sync_cb) QueueSync(out, Take(m.sync_cb), SyncError(kErrUnknownMemberId));
  if (m.instance_id) {
    auto s = g.static_members.find(*m.instance_id);
    if (s != g.static_members.end() && s->second == member_id) g.static_members.erase(s);
  }
  if (g.leader == member_id) {
    std::vector<Member*> ordered = g.Ordered();
    g.leader = ordered.empty() ? std::string() : ordered.front()->id;
  }
  if (!update_group) return;
  switch (g.state) {
    case GroupState::kStable:
    case GroupState::kCompletingRebalance: PrepareRebalance(g, now, out); break;
    case GroupState::kPreparingRebalance: MaybeCompleteJoin(g, now, out); break;
    case GroupState::kEmpty: break;
  }
}

// ---- Rebalance ---------------------------------------------------------------

void GroupCoordinator::PrepareRebalance(Group& g, TimePoint now, Outbox& out) {
  if (g.state == GroupState::kCompletingRebalance) {
    // Members waiting for the leader's assignment rejoin instead. Their
    // sessions start again now: they sent no heartbeat while they waited.
    for (auto& [id, m] : g.members) {
      m.assignment.clear();
      Recharge(m);
      if (m.sync_cb) {
        QueueSync(out, Take(m.sync_cb), SyncError(kErrRebalanceInProgress));
        m.session_deadline = now + Ms(m.session_ms);
      }
    }
  }
  g.sync_armed = false;
  for (auto& [id, m] : g.members) m.pending_sync = false;
  Duration rebalance = Ms(g.RebalanceTimeoutMs());
  if (g.state == GroupState::kEmpty) {
    g.initial_delay = true;
    g.new_member_added = false;
    g.join_deadline = now + opts_.initial_rebalance_delay;
    g.initial_remaining = std::max(rebalance - opts_.initial_rebalance_delay, Duration::zero());
  } else {
    g.initial_delay = false;
    g.join_deadline = now + rebalance;
  }
  g.state = GroupState::kPreparingRebalance;
  MaybeCompleteJoin(g, now, out);
}

void GroupCoordinator::MaybeCompleteJoin(Group& g, TimePoint now, Outbox& out) {
  if (g.state != GroupState::kPreparingRebalance) return;
  if (g.initial_delay) {
    while (now >= g.join_deadline) {
      if (g.new_member_added && g.initial_remaining > Duration::zero()) {
        Duration step = std::min(opts_.initial_rebalance_delay, g.initial_remaining);
        g.initial_remaining -= step;
        g.join_deadline += step;
        g.new_member_added = false;
      } else {
        CompleteJoin(g, now, out);
        return;
      }
    }
    return;
  }
  if (g.AllJoined() || now >= g.join_deadline) CompleteJoin(g, now, out);
}

void GroupCoordinator::CompleteJoin(Group& g, TimePoint now, Outbox& out) {
  // Dynamic members that did not rejoin are out; static ones keep their place
  // (their session or the sync deadline decides).
  std::vector<std::string> gone;
  for (const auto& [id, m] : g.members) {
    if (!m.join_cb && !m.instance_id) gone.push_back(id);
  }
  for (const auto& id : gone) RemoveMember(g, id, now, /*update_group=*/false, out);

  if (!g.members.empty()) {
    Member* leader = g.Find(g.leader);
    if (leader == nullptr || !leader->join_cb) {
      Member* joined = nullptr;
      for (Member* m : g.Ordered()) {
        if (m->join_cb) {
          joined = m;
          break;
        }
      }
      if (joined == nullptr) {
        // Only static members that did not rejoin: wait another rebalance timeout.
        g.initial_delay = false;
        g.join_deadline = now + Ms(g.RebalanceTimeoutMs());
        return;
      }
      g.leader = joined->id;
    }
  }

  ++g.generation;
  g.initial_delay = false;
  g.new_member_added = false;
  if (g.members.empty()) {
    g.protocol_name.clear();
    g.leader.clear();
    g.state = GroupState::kEmpty;
    g.empty_since = now;
    return;
  }
  g.protocol_name = g.SelectProtocol();
  g.state = GroupState::kCompletingRebalance;
  ++rebalances_completed_;
  for (Member* m : g.Ordered()) {
    m->is_new = false;
    m->pending_sync = true;
    m->session_deadline = now + Ms(m->session_ms);
    if (m->join_cb) {
      JoinCallback cb = std::move(m->join_cb);
      m->join_cb = nullptr;
      QueueJoin(out, std::move(cb), CurrentGeneration(g, *m, g.leader));
    }
  }
  g.sync_armed = true;
  g.sync_deadline = now + Ms(g.RebalanceTimeoutMs());
}

// ---- SyncGroup, Heartbeat, LeaveGroup, commits -------------------------------

void GroupCoordinator::SyncGroup(const SyncGroupInput& in, TimePoint now, SyncCallback respond) {
  if (!respond) respond = [](SyncGroupResult) {};
  Outbox out;
  {
    std::lock_guard lock(mu_);
    SyncLocked(in, now, respond, out);
  }
  Run(out);
}

void GroupCoordinator::SyncLocked(const SyncGroupInput& in, TimePoint now, SyncCallback& respond, Outbox& out) {
  auto fail = [&](int16_t code) { QueueSync(out, std::move(respond), SyncError(code)); };
  if (shut_down_) return fail(kErrCoordinatorNotAvailable);
  if (in.group_id.empty()) return fail(kErrInvalidGroupId);
  Group* g = FindGroup(in.group_id);
  if (g == nullptr) return fail(kErrUnknownMemberId);
  if (int16_t err = g->Validate(in.member_id, in.group_instance_id); err != kErrNone) return fail(err);
  if (in.generation_id != g->generation) return fail(kErrIllegalGeneration);
  if ((in.protocol_type && *in.protocol_type != g->protocol_type) ||
      (in.protocol_name && *in.protocol_name != g->protocol_name)) {
    return fail(kErrInconsistentGroupProtocol);
  }
  Member& m = *g->Find(in.member_id);
  if (g->state == GroupState::kCompletingRebalance && g->leader == m.id) {
    // The leader's assignments replace every member's (members it leaves out get none).
    size_t held = 0;
    size_t wanted = 0;
    for (const auto& [id, each] : g->members) held += each.assignment.size();
    for (const auto& [member_id, bytes] : in.assignments) {
      if (bytes.size() > opts_.max_member_bytes) return fail(kErrInvalidRequest);
      if (g->members.count(member_id) != 0) wanted += bytes.size();
    }
    if (bytes_ - held + wanted > opts_.max_total_bytes) return fail(kErrCoordinatorNotAvailable);
  }
  switch (g->state) {
    case GroupState::kEmpty: return fail(kErrUnknownMemberId);  // no members: unreachable
    case GroupState::kPreparingRebalance: return fail(kErrRebalanceInProgress);
    case GroupState::kCompletingRebalance:
      if (m.sync_cb) QueueSync(out, Take(m.sync_cb), SyncError(kErrRebalanceInProgress));  // superseded
      m.sync_cb = std::move(respond);
      m.pending_sync = false;
      if (g->leader == m.id) {
        // Members the leader left out get empty bytes; ids it made up are ignored.
        std::map<std::string_view, const std::string*> assigned;
        for (const auto& [member_id, bytes] : in.assignments) assigned[member_id] = &bytes;
        for (Member* each : g->Ordered()) {
          auto a = assigned.find(each->id);
          each->assignment = a == assigned.end() ? std::string() : *a->second;
          Recharge(*each);
          if (each->sync_cb) {
            each->session_deadline = now + Ms(each->session_ms);
            QueueSync(out, Take(each->sync_cb),
                      SyncGroupResult{kErrNone, g->protocol_type, g->protocol_name, each->assignment});
          }
        }
        g->state = GroupState::kStable;
      }
      break;
    case GroupState::kStable:
      m.pending_sync = false;
      m.session_deadline = now + Ms(m.session_ms);
      QueueSync(out, std::move(respond), SyncGroupResult{kErrNone, g->protocol_type, g->protocol_name, m.assignment});
      break;
  }
  if (g->sync_armed &&
      std::none_of(g->members.begin(), g->members.end(), [](const auto& kv) { return kv.second.pending_sync; })) {
    g->sync_armed = false;
  }
  Refresh(*g);
}

int16_t GroupCoordinator::Heartbeat(std::string_view group_id, int32_t generation_id, std::string_view member_id,
                                    const std::optional<std::string>& group_instance_id, TimePoint now) {
  std::lock_guard lock(mu_);
  if (shut_down_) return kErrCoordinatorNotAvailable;
  if (group_id.empty()) return kErrInvalidGroupId;
  Group* g = FindGroup(group_id);
  if (g == nullptr) return kErrUnknownMemberId;
  if (int16_t err = g->Validate(member_id, group_instance_id); err != kErrNone) return err;
  if (generation_id != g->generation) return kErrIllegalGeneration;
  Member* m = g->Find(member_id);
  m->session_deadline = now + Ms(m->session_ms);  // later than before: next_check stays valid
  switch (g->state) {
    case GroupState::kEmpty: return kErrUnknownMemberId;  // no members: unreachable
    case GroupState::kPreparingRebalance: return kErrRebalanceInProgress;
    // As Kafka: members heartbeat between their JoinGroup and SyncGroup responses.
    case GroupState::kCompletingRebalance:
    case GroupState::kStable: return kErrNone;
  }
  return kErrNone;
}

LeaveGroupResult GroupCoordinator::LeaveGroup(const LeaveGroupInput& in, TimePoint now) {
  LeaveGroupResult r;
  Outbox out;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) {
      r.error_code = kErrCoordinatorNotAvailable;
    } else if (in.group_id.empty()) {
      r.error_code = kErrInvalidGroupId;
    } else {
      Group* g = FindGroup(in.group_id);
      for (const LeaveGroupMember& who : in.members) {
        int16_t err = kErrNone;
        if (g == nullptr) {
          err = kErrUnknownMemberId;
        } else if (who.member_id.empty()) {
          // Administrative removal of a static member by instance id.
          auto it = who.group_instance_id ? g->static_members.find(*who.group_instance_id) : g->static_members.end();
          if (it == g->static_members.end()) {
            err = kErrUnknownMemberId;
          } else {
            std::string id = it->second;
            RemoveMember(*g, id, now, /*update_group=*/true, out);
          }
        } else if (g->pending.count(who.member_id) != 0) {
          ErasePending(*g, who.member_id);
          MaybeCompleteJoin(*g, now, out);
        } else {
          err = g->Validate(who.member_id, who.group_instance_id);
          if (err == kErrNone) RemoveMember(*g, who.member_id, now, /*update_group=*/true, out);
        }
        r.members.push_back(LeaveGroupMemberResult{who.member_id, who.group_instance_id, err});
      }
      if (g != nullptr) Refresh(*g);
    }
  }
  Run(out);
  if (in.version < 3 && r.error_code == kErrNone && r.members.size() == 1) r.error_code = r.members[0].error_code;
  return r;
}

int16_t GroupCoordinator::ValidateCommit(std::string_view group_id, int32_t generation_id, std::string_view member_id,
                                         const std::optional<std::string>& group_instance_id, TimePoint now) {
  std::lock_guard lock(mu_);
  if (shut_down_) return kErrCoordinatorNotAvailable;
  // As Kafka: a generation below 0 is a consumer that manages its own
  // partitions (assign(), whatever member or instance id it sends), allowed
  // while the group has no members. (An empty group id is allowed, as Kafka
  // allows it for commits: no group has it.)
  Group* g = FindGroup(group_id);
  if (g == nullptr) return generation_id < 0 ? kErrNone : kErrIllegalGeneration;
  if (group_instance_id) {
    auto it = g->static_members.find(*group_instance_id);
    if (it != g->static_members.end() && it->second != member_id) return kErrFencedInstanceId;
  }
  if (generation_id < 0 && g->state == GroupState::kEmpty) return kErrNone;
  if (int16_t err = g->Validate(member_id, group_instance_id); err != kErrNone) return err;
  if (generation_id != g->generation) return kErrIllegalGeneration;
  Member* m = g->Find(member_id);
  switch (g->state) {
    case GroupState::kEmpty: return kErrUnknownMemberId;  // no members: unreachable
    // A member that got the new generation's JoinGroup response has no assignment yet.
    case GroupState::kCompletingRebalance: return kErrRebalanceInProgress;
    // During PreparingRebalance the old generation may still commit; its
    // heartbeats tell it to rejoin.
    case GroupState::kPreparingRebalance:
    case GroupState::kStable:
      m->session_deadline = now + Ms(m->session_ms);
      return kErrNone;
  }
  return kErrNone;
}

int16_t GroupCoordinator::DeleteGroup(std::string_view group_id) {
  std::lock_guard lock(mu_);
  if (shut_down_) return kErrCoordinatorNotAvailable;
  auto it = groups_.find(group_id);
  if (it == groups_.end()) return kErrGroupIdNotFound;
  if (it->second->state != GroupState::kEmpty) return kErrNonEmptyGroup;
  EraseGroup(it);  // pending member ids go too; they rejoin from scratch
  return kErrNone;
}

// ---- Time --------------------------------------------------------------------

void GroupCoordinator::Tick(TimePoint now) {
  Outbox out;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    for (auto it = groups_.begin(); it != groups_.end();) {
      Group& g = *it->second;
      if (g.next_check > now) {
        ++it;
        continue;
      }
      TickGroup(g, now, out);
      if (g.state == GroupState::kEmpty && g.members.empty() && g.pending.empty() &&
          now - g.empty_since >= opts_.empty_group_retention) {
        it = EraseGroup(it);
      } else {
        Refresh(g);
        ++it;
      }
    }
  }
  Run(out);
}

void GroupCoordinator::TickGroup(Group& g, TimePoint now, Outbox& out) {
  // Member ids handed out by MEMBER_ID_REQUIRED and never used.
  for (auto p = g.pending.begin(); p != g.pending.end();) {
    if (p->second > now) {
      ++p;
      continue;
    }
    bytes_ -= kEntryBytes + p->first.size();
    p = g.pending.erase(p);
  }
  // The rebalance delay or timeout (before sessions: a rebalance due now
  // answers its new members rather than dropping them).
  MaybeCompleteJoin(g, now, out);
  // Sessions. Members waiting in JoinGroup or SyncGroup are alive unless new
  // and waiting too long. One at a time: a removal may complete a rebalance,
  // which renews every remaining session.
  for (;;) {
    Member* dead = nullptr;
    for (auto& [id, m] : g.members) {
      bool expired = m.join_cb ? (m.is_new && now >= m.new_member_deadline)
                               : (!m.sync_cb && now >= m.session_deadline);
      if (expired) {
        dead = &m;
        break;
      }
    }
    if (dead == nullptr) break;
    ++members_expired_;
    std::string id = dead->id;
    RemoveMember(g, id, now, /*update_group=*/true, out);
  }
  // Members that got the generation's JoinGroup response but never synced.
  if (g.sync_armed && now >= g.sync_deadline &&
      (g.state == GroupState::kCompletingRebalance || g.state == GroupState::kStable)) {
    std::vector<std::string> laggards;
    for (const auto& [id, m] : g.members) {
      if (m.pending_sync) laggards.push_back(id);
    }
    g.sync_armed = false;
    if (!laggards.empty()) {
      for (const auto& id : laggards) RemoveMember(g, id, now, /*update_group=*/false, out);
      members_expired_ += laggards.size();
      PrepareRebalance(g, now, out);
    }
  }
}

// Recomputes the earliest deadline of the group (after any change that may
// add an earlier one; renewals only move deadlines later).
void GroupCoordinator::Refresh(Group& g) {
  TimePoint next = TimePoint::max();
  for (const auto& [id, expiry] : g.pending) next = std::min(next, expiry);
  for (const auto& [id, m] : g.members) {
    if (m.join_cb) {
      if (m.is_new) next = std::min(next, m.new_member_deadline);
    } else if (!m.sync_cb) {
      next = std::min(next, m.session_deadline);
    }
  }
  if (g.state == GroupState::kPreparingRebalance) next = std::min(next, g.join_deadline);
  if (g.sync_armed) next = std::min(next, g.sync_deadline);
  if (g.state == GroupState::kEmpty && g.members.empty() && g.pending.empty()) {
    next = std::min(next, g.empty_since + opts_.empty_group_retention);
  }
  g.next_check = next;
}

void GroupCoordinator::Shutdown() {
  Outbox out;
  {
    std::lock_guard lock(mu_);
    shut_down_ = true;
    for (auto& [gid, g] : groups_) {
      for (auto& [id, m] : g->members) {
        if (m.join_cb) QueueJoin(out, Take(m.join_cb), JoinError(kErrCoordinatorNotAvailable, id));
        if (m.sync_cb) QueueSync(out, Take(m.sync_cb), SyncError(kErrCoordinatorNotAvailable));
      }
    }
  }
  Run(out);
}

// ---- Introspection -----------------------------------------------------------

std::optional<GroupDescription> GroupCoordinator::DescribeGroup(std::string_view group_id,
                                                                size_t max_member_bytes) const {
  std::lock_guard lock(mu_);
  auto it = groups_.find(group_id);
  if (it == groups_.end()) return std::nullopt;
  Group& g = *it->second;
  GroupDescription d;
  d.group_id = g.id;
  d.state = g.state;
  d.generation_id = g.generation;
  d.protocol_type = g.protocol_type;
  d.protocol_name = g.protocol_name;
  d.leader = g.leader;
  d.pending_member_ids = g.pending.size();
  for (const auto& [id, m] : g.members) d.member_bytes += m.DescribedBytes(g.protocol_name);
  if (d.member_bytes > max_member_bytes) {
    d.members_left_out = true;
    return d;
  }
  for (const Member* m : g.Ordered()) {
    d.members.push_back(MemberDescription{m->id, m->instance_id, m->client_id, m->client_host,
                                          m->MetadataFor(g.protocol_name), m->assignment});
  }
  return d;
}

std::vector<GroupOverview> GroupCoordinator::ListGroups() const {
  std::lock_guard lock(mu_);
  std::vector<GroupOverview> v;
  v.reserve(groups_.size());
  for (const auto& [id, g] : groups_) v.push_back(GroupOverview{id, g->protocol_type, g->state, g->empty_since});
  return v;
}

GroupCoordinatorStats GroupCoordinator::Stats() const {
  std::lock_guard lock(mu_);
  GroupCoordinatorStats s;
  s.groups = groups_.size();
  for (const auto& [id, g] : groups_) {
    s.members += g->members.size();
    s.pending_member_ids += g->pending.size();
    ++s.groups_in_state[static_cast<size_t>(g->state)];
  }
  s.bytes = bytes_;
  s.rebalances_completed = rebalances_completed_;
  s.members_expired = members_expired_;
  return s;
}

}  // namespace weir::kafka
