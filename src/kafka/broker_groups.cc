// Consumer groups: membership through the GroupCoordinator (in memory), and
// committed offsets in the metastore (durable: they survive a restart).
#include <map>
#include <set>

#include "base/log.h"
#include "kafka/broker_internal.h"

namespace weir::kafka {

namespace {
ErrorCode E(int16_t code) { return static_cast<ErrorCode>(code); }

// Most groups without members a ListGroups names (their ids sorted): offset
// commits under new group ids can make any number of them.
constexpr size_t kMaxListedOffsetGroups = 100000;

// Most partitions an OffsetFetch looks up one by one; past that it reads
// the group's offsets whole.
constexpr size_t kMaxSeekedOffsetPartitions = 1024;

// For a request whose answer may wait long: the frame and the decoded body
// (moved from already) are freed, and their bytes leave the request budget,
// so parked requests never hold up other connections' reads.
void ReleaseFrame(Broker::Request& req) {
  req.frame = Frame();
  req.decoded.body = HeartbeatRequest{};  // the smallest body; only the header is used from here on
  req.reply->ReleaseFrame();
}
}  // namespace

void Broker::JoinGroup(const std::shared_ptr<Request>& req) {
  auto& in = req->body<JoinGroupRequest>();
  JoinGroupInput j;
  j.group_id = in.group_id;
  j.session_timeout_ms = in.session_timeout_ms;
  j.rebalance_timeout_ms = in.rebalance_timeout_ms;
  j.member_id = in.member_id;
  j.group_instance_id = in.group_instance_id;
  j.protocol_type = in.protocol_type;
  for (auto& p : in.protocols) j.protocols.emplace_back(std::move(p.name), std::move(p.metadata));
  j.version = req->version();
  j.client_id = req->decoded.header.client_id.value_or("");
  // As Kafka reports it (DescribeGroups): "/" and the address, no port.
  const std::string& peer = req->reply->peer();
  const size_t colon = peer.rfind(':');
  j.client_host = "/" + (colon == std::string::npos ? peer : peer.substr(0, colon));
  ReleaseFrame(*req);  // the answer may wait for the whole rebalance
  groups_.JoinGroup(j, Now(), [req](JoinGroupResult r) {
    JoinGroupResponse resp;
    resp.error_code = E(r.error_code);
    resp.generation_id = r.generation_id;
    resp.protocol_name = r.protocol_name;
    resp.leader = r.leader;
    resp.member_id = r.member_id;
    for (auto& m : r.members) resp.members.push_back(JoinGroupResponseMember{m.member_id, m.group_instance_id, m.metadata});
    Send(req, resp, EncodeJoinGroupResponse);
  });
}

void Broker::SyncGroup(const std::shared_ptr<Request>& req) {
  auto& in = req->body<SyncGroupRequest>();
  SyncGroupInput s;
  s.group_id = in.group_id;
  s.generation_id = in.generation_id;
  s.member_id = in.member_id;
  s.group_instance_id = in.group_instance_id;
  for (auto& a : in.assignments) s.assignments.emplace_back(std::move(a.member_id), std::move(a.assignment));
  ReleaseFrame(*req);  // a follower's answer waits for the leader's SyncGroup
  groups_.SyncGroup(s, Now(), [req](SyncGroupResult r) {
    SyncGroupResponse resp;
    resp.error_code = E(r.error_code);
    resp.assignment = r.assignment;
    Send(req, resp, EncodeSyncGroupResponse);
  });
}

void Broker::Heartbeat(const std::shared_ptr<Request>& req) {
  auto& in = req->body<HeartbeatRequest>();
  HeartbeatResponse resp;
  resp.error_code = E(groups_.Heartbeat(in.group_id, in.generation_id, in.member_id, in.group_instance_id, Now()));
  Send(req, resp, EncodeHeartbeatResponse);
}

void Broker::LeaveGroup(const std::shared_ptr<Request>& req) {
  auto& in = req->body<LeaveGroupRequest>();
  LeaveGroupInput l;
  l.group_id = in.group_id;
  l.version = req->version();
  if (req->version() < 3) {
    l.members.push_back(LeaveGroupMember{in.member_id, std::nullopt});
  } else {
    for (auto& m : in.members) l.members.push_back(LeaveGroupMember{m.member_id, m.group_instance_id});
  }
  LeaveGroupResult r = groups_.LeaveGroup(l, Now());
  LeaveGroupResponse resp;
  resp.error_code = E(r.error_code);
  for (auto& m : r.members) {
    resp.members.push_back(LeaveGroupMemberResponse{m.member_id, m.group_instance_id, E(m.error_code)});
  }
  Send(req, resp, EncodeLeaveGroupResponse);
}

// Runs on a worker thread (a metastore write).
void Broker::OffsetCommit(const std::shared_ptr<Request>& req) {
  auto& in = req->body<OffsetCommitRequest>();
  OffsetCommitResponse resp;
  // An empty group id is valid for offsets (Kafka keeps it for old clients).
  auto offsets_guard = group_offsets_mu_.Lock(in.group_id);
  // v0 names no generation or member: as on Kafka, a standalone commit
  // (generation -1), refused while the group has members.
  const bool v0 = req->version() == 0;
  // A group id no join could use (it would not fit PostgreSQL's index of
  // committed offsets either).
  ErrorCode all = in.group_id.size() > GroupCoordinator::kMaxGroupIdBytes
                      ? ErrorCode::kInvalidGroupId
                      : E(groups_.ValidateCommit(in.group_id, v0 ? -1 : in.generation_id, v0 ? "" : in.member_id,
                                                 v0 ? std::nullopt : in.group_instance_id, Now()));
  std::vector<metastore::GroupOffset> offsets;
  std::vector<std::pair<size_t, size_t>> slots;  // response (topic, partition) of each offset
  int64_t now_ms = WallMillis();
  // The partitions are checked and their offsets written with tables held
  // steady: a topic deleted meanwhile would keep offsets it no longer has.
  Status committed = engine_->WithTablesSteady([&]() -> Status {
    for (auto& t : in.topics) {
      OffsetCommitResponseTopic tr;
      tr.name = t.name;
      for (auto& p : t.partitions) {
        OffsetCommitResponsePartition pr;
        pr.partition_index = p.partition_index;
        pr.error_code = all;
        if (all == ErrorCode::kNone) {
          std::string stream =
              metastore::BucketStreamName(t.name, static_cast<uint32_t>(std::max(p.partition_index, 0)));
          auto tail = p.partition_index < 0 ? Result<uint64_t>(NotFound("partition"))
                                            : engine_->CheckTail(options_.basin, stream);
          if (!tail.ok()) {
            // Superseded: another process holds this node, and coordinates
            // its groups (as when the commit itself is refused).
            pr.error_code = tail.status().code() == Code::kFenced ? ErrorCode::kCoordinatorNotAvailable
                                                                  : ErrorCode::kUnknownTopicOrPartition;
          } else if (p.committed_metadata && p.committed_metadata->size() > options_.max_offset_metadata_bytes) {
            pr.error_code = ErrorCode::kOffsetMetadataTooLarge;
          } else {
            metastore::GroupOffset o;
            o.topic = t.name;
            o.partition = p.partition_index;
            o.offset = p.committed_offset;
            o.leader_epoch = p.committed_leader_epoch;
            o.metadata = p.committed_metadata.value_or("");
            o.commit_time_ms = now_ms;
            offsets.push_back(std::move(o));
            slots.emplace_back(resp.topics.size(), tr.partitions.size());
          }
        }
        tr.partitions.push_back(pr);
      }
      resp.topics.push_back(std::move(tr));
    }
    if (offsets.empty()) return Status::Ok();
    return engine_->RunAsThisNode(
        [&](const metastore::EpochCheck& by) { return meta_->CommitGroupOffsets(in.group_id, offsets, by); });
  });
  if (!committed.ok()) {
    Log().warn("kafka: committing offsets of group {}: {}", in.group_id, committed.ToString());
    for (auto [ti, pi] : slots) resp.topics[ti].partitions[pi].error_code = ErrorCode::kCoordinatorNotAvailable;
  } else {
    metrics_.offset_commits += offsets.size();
  }
  Send(req, resp, EncodeOffsetCommitResponse);
}

// Runs on a worker thread (a metastore read).
void Broker::OffsetFetch(const std::shared_ptr<Request>& req) {
  auto& in = req->body<OffsetFetchRequest>();
  OffsetFetchResponse resp;
  auto fail = [&](ErrorCode code) {
    // v2+ carry a top-level error; v1 only per partition.
    resp.error_code = code;
    if (in.topics) {
      for (auto& t : *in.topics) {
        OffsetFetchResponseTopic tr;
        tr.name = t.name;
        for (int32_t p : t.partition_indexes) {
          OffsetFetchResponsePartition pr;
          pr.partition_index = p;
          pr.error_code = code;
          tr.partitions.push_back(pr);
        }
        resp.topics.push_back(std::move(tr));
      }
    }
    Send(req, resp, EncodeOffsetFetchResponse);
  };
  // The named partitions by index seeks (a consumer names those it was
  // assigned, a few of a group's), unless so many are named that reading the
  // whole group costs less.
  size_t named_count = 0;
  if (in.topics) {
    for (const auto& t : *in.topics) named_count += t.partition_indexes.size();
  }
  std::vector<std::pair<std::string, int32_t>> named;
  const bool seek = in.topics && named_count <= kMaxSeekedOffsetPartitions;
  if (seek) {
    named.reserve(named_count);
    for (const auto& t : *in.topics) {
      for (int32_t p : t.partition_indexes) named.emplace_back(t.name, p);
    }
  }
  auto committed = seek ? meta_->FetchPartitionOffsets(in.group_id, named) : meta_->FetchGroupOffsets(in.group_id);
  if (!committed.ok()) {
    Log().warn("kafka: fetching offsets of group {}: {}", in.group_id, committed.status().ToString());
    // As Kafka while it loads a group's offsets: Java consumers before 3.8.1
    // treat COORDINATOR_NOT_AVAILABLE here as fatal; every client retries this.
    return fail(ErrorCode::kCoordinatorLoadInProgress);
  }
  std::map<std::pair<std::string, int32_t>, const metastore::GroupOffset*> by_key;
  for (const auto& o : *committed) by_key[{o.topic, o.partition}] = &o;
  auto partition = [&](const std::string& topic, int32_t p) {
    OffsetFetchResponsePartition pr;
    pr.partition_index = p;
    auto it = by_key.find({topic, p});
    if (it == by_key.end()) {
      pr.committed_offset = -1;
      pr.metadata = "";
    } else {
      pr.committed_offset = it->second->offset;
      pr.committed_leader_epoch = it->second->leader_epoch;
      pr.metadata = it->second->metadata;
    }
    return pr;
  };
  if (in.topics) {
    for (auto& t : *in.topics) {
      OffsetFetchResponseTopic tr;
      tr.name = t.name;
      for (int32_t p : t.partition_indexes) tr.partitions.push_back(partition(t.name, p));
      resp.topics.push_back(std::move(tr));
    }
  } else {
    for (const auto& o : *committed) {
      if (resp.topics.empty() || resp.topics.back().name != o.topic) {
        resp.topics.push_back(OffsetFetchResponseTopic{o.topic, {}});
      }
      resp.topics.back().partitions.push_back(partition(o.topic, o.partition));
    }
  }
  Send(req, resp, EncodeOffsetFetchResponse);
}

// ---- Group administration ---------------------------------------------------------
// Membership lives in the coordinator (memory) and committed offsets in the
// metastore; a group with offsets but no members (say, after a restart) is an
// Empty group, as on a Kafka broker that loaded it from its offsets topic.

// Runs on a worker thread (a metastore read per group the coordinator lacks).
void Broker::DescribeGroups(const std::shared_ptr<Request>& req) {
  auto& in = req->body<DescribeGroupsRequest>();
  DescribeGroupsResponse resp;
  std::set<std::string_view> seen;  // a group named twice is described once (its members could be large)
  // A group's members (up to the coordinator's whole byte budget) are copied
  // only while the answer fits the room left for responses not yet written
  // (as a Fetch is cut to it): otherwise clients that ask and never read
  // could make the server hold a copy per connection. A group left out is
  // COORDINATOR_LOAD_IN_PROGRESS, which clients retry.
  size_t room = req->reply->ResponseRoom(/*small=*/false);
  for (const std::string& id : in.groups) {
    if (!seen.insert(id).second) continue;
    DescribedGroup g;
    g.group_id = id;
    if (auto d = groups_.DescribeGroup(id, room)) {
      if (d->members_left_out) {
        g.error_code = ErrorCode::kCoordinatorLoadInProgress;
        resp.groups.push_back(std::move(g));
        continue;
      }
      room -= d->member_bytes;
      g.group_state = std::string(GroupStateName(d->state));
      g.protocol_type = d->protocol_type;
      // As Kafka: the protocol and each member's metadata and assignment
      // only once the group is Stable (before that they are in flux).
      const bool stable = d->state == GroupState::kStable;
      if (stable) g.protocol_data = d->protocol_name;
      for (auto& m : d->members) {
        g.members.push_back(DescribedGroupMember{std::move(m.member_id), std::move(m.group_instance_id),
                                                 std::move(m.client_id), std::move(m.client_host),
                                                 stable ? std::move(m.metadata) : "",
                                                 stable ? std::move(m.assignment) : ""});
      }
    } else {
      auto has_offsets = meta_->GroupHasOffsets(id);
      if (!has_offsets.ok()) {
        Log().warn("kafka: describing group {}: {}", id, has_offsets.status().ToString());
        g.error_code = ErrorCode::kCoordinatorNotAvailable;
      }
      // Kafka (before DescribeGroups v6) answers an unknown group with state
      // Dead and no error.
      g.group_state = has_offsets.ok() && *has_offsets ? "Empty" : "Dead";
    }
    resp.groups.push_back(std::move(g));
  }
  Send(req, resp, EncodeDescribeGroupsResponse);
}

// Runs on a worker thread (a metastore read).
void Broker::ListGroups(const std::shared_ptr<Request>& req) {
  ListGroupsResponse resp;
  std::map<std::string, std::string> listed;  // group id -> protocol type
  for (const GroupOverview& g : groups_.ListGroups()) listed[g.group_id] = g.protocol_type;
  auto with_offsets = meta_->ListOffsetGroups(kMaxListedOffsetGroups);
  if (!with_offsets.ok()) {
    Log().warn("kafka: listing groups: {}", with_offsets.status().ToString());
    resp.error_code = ErrorCode::kCoordinatorNotAvailable;
    return Send(req, resp, EncodeListGroupsResponse);
  }
  if (with_offsets->size() >= kMaxListedOffsetGroups) {
    Log().warn("kafka: ListGroups names only the first {} groups with committed offsets", kMaxListedOffsetGroups);
  }
  for (const std::string& id : *with_offsets) listed.emplace(id, "");
  for (auto& [id, type] : listed) resp.groups.push_back(ListedGroup{id, type});
  Send(req, resp, EncodeListGroupsResponse);
}

// Runs on a worker thread (a metastore write). A group is deleted when it has
// no members: its committed offsets first (if that fails, nothing changed),
// then its membership state.
Result<bool> Broker::DeleteAllOffsetsOf(const std::string& group) {
  Result<bool> had = false;
  Status st = engine_->RunAsThisNode([&](const metastore::EpochCheck& by) {
    had = meta_->DeleteAllGroupOffsets(group, by);
    return had.status();
  });
  if (!st.ok()) return st;
  return had;
}

void Broker::DeleteGroups(const std::shared_ptr<Request>& req) {
  auto& in = req->body<DeleteGroupsRequest>();
  DeleteGroupsResponse resp;
  // A group named twice is deleted (and answered) once, as Kafka does: each
  // name costs a metastore transaction.
  std::set<std::string_view> seen;
  for (const std::string& id : in.groups_names) {
    if (!seen.insert(id).second) continue;
    DeletableGroupResult r;
    r.group_id = id;
    auto offsets_guard = group_offsets_mu_.Lock(id);
    auto d = groups_.DescribeGroup(id);
    if (d && d->state != GroupState::kEmpty) {
      r.error_code = ErrorCode::kNonEmptyGroup;
    } else if (Result<bool> had_offsets = DeleteAllOffsetsOf(id); !had_offsets.ok()) {
      Log().warn("kafka: deleting the offsets of group {}: {}", id, had_offsets.status().ToString());
      r.error_code = ErrorCode::kCoordinatorNotAvailable;
    } else {
      // A member that joined since the check keeps the group (its offsets
      // are gone, as if it had joined just after the deletion, as on Kafka,
      // where the deleted group is Dead and the joiner makes a new one): the
      // deletion happened, so it is not answered NON_EMPTY_GROUP.
      r.error_code = E(groups_.DeleteGroup(id));
      if ((r.error_code == ErrorCode::kNonEmptyGroup && (d || *had_offsets)) ||
          (r.error_code == ErrorCode::kGroupIdNotFound && *had_offsets)) {
        r.error_code = ErrorCode::kNone;
      }
    }
    if (r.error_code == ErrorCode::kNone) {
      metrics_.groups_deleted++;
      Log().info("kafka: deleted group {}", id);
    }
    resp.results.push_back(std::move(r));
  }
  Send(req, resp, EncodeDeleteGroupsResponse);
}

// ---- OffsetDelete ---------------------------------------------------------------
// Deletes a group's committed offsets of some partitions (Kafka's
// OffsetDelete: `kafka-consumer-groups --delete-offsets`). As on Kafka, a
// group with members keeps the offsets of the topics they subscribe to
// (GROUP_SUBSCRIBED_TO_TOPIC), read from the members' metadata for the
// selected protocol (the consumer protocol's layout); if a member's metadata
// is not there (no protocol selected yet) or unreadable, every topic counts
// as subscribed. A group with members of another protocol type is
// NON_EMPTY_GROUP. No commit of the group runs between the check and the
// delete; a member that joins between them finds the offsets gone, as if it
// had joined just after the delete (as in DeleteGroups).

// Runs on a worker thread (metastore reads and writes).
void Broker::OffsetDelete(const std::shared_ptr<Request>& req) {
  auto& in = req->body<OffsetDeleteRequest>();
  OffsetDeleteResponse resp;
  auto reply = [&](ErrorCode code) {
    resp.error_code = code;
    resp.topics.clear();
    Send(req, resp, EncodeOffsetDeleteResponse);
  };
  auto offsets_guard = group_offsets_mu_.Lock(in.group_id);
  auto offsets = meta_->FetchGroupOffsets(in.group_id);
  if (!offsets.ok()) {
    Log().warn("kafka: reading the offsets of group {}: {}", in.group_id, offsets.status().ToString());
    return reply(ErrorCode::kCoordinatorNotAvailable);
  }
  const auto group = groups_.DescribeGroup(in.group_id);
  if (!group && offsets->empty()) return reply(ErrorCode::kGroupIdNotFound);
  std::optional<std::set<std::string>> subscribed = std::set<std::string>{};  // nullopt: every topic
  if (group && !group->members.empty()) {
    if (group->protocol_type != "consumer") return reply(ErrorCode::kNonEmptyGroup);
    for (const MemberDescription& m : group->members) {
      auto topics = m.metadata.empty() ? std::nullopt : ConsumerSubscriptionTopics(m.metadata);
      if (!topics) {
        subscribed.reset();
        break;
      }
      subscribed->insert(topics->begin(), topics->end());
    }
  }
  std::vector<std::pair<std::string, int32_t>> doomed;
  for (const OffsetDeleteTopic& t : in.topics) {
    OffsetDeleteTopicResult tr;
    tr.name = t.name;
    auto table = engine_->GetTable(options_.basin, t.name);
    if (!table.ok() && table.status().code() != Code::kNotFound) {
      Log().warn("kafka: looking up topic {}: {}", t.name, table.status().ToString());
      return reply(ErrorCode::kCoordinatorNotAvailable);
    }
    for (int32_t p : t.partitions) {
      OffsetDeletePartitionResult pr;
      pr.partition_index = p;
      if (!table.ok() || p < 0 || static_cast<uint32_t>(p) >= table->bucket_count) {
        pr.error_code = ErrorCode::kUnknownTopicOrPartition;
      } else if (!subscribed || subscribed->count(t.name) != 0) {
        pr.error_code = ErrorCode::kGroupSubscribedToTopic;
      } else {
        doomed.emplace_back(t.name, p);
      }
      tr.partitions.push_back(pr);
    }
    resp.topics.push_back(std::move(tr));
  }
  if (!doomed.empty()) {
    if (Status st = engine_->RunAsThisNode([&](const metastore::EpochCheck& by) {
          return meta_->DeletePartitionOffsets(in.group_id, doomed, by);
        });
        !st.ok()) {
      Log().warn("kafka: deleting offsets of group {}: {}", in.group_id, st.ToString());
      return reply(ErrorCode::kCoordinatorNotAvailable);
    }
    Log().info("kafka: deleted {} committed offset(s) of group {}", doomed.size(), in.group_id);
  }
  Send(req, resp, EncodeOffsetDeleteResponse);
}

}  // namespace weir::kafka
