#include "kafka/broker.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <map>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "base/log.h"
#include "base/thread.h"
#include "kafka/api_table.h"
#include "kafka/broker_internal.h"
#include "wal/record_batch.h"

namespace weir::kafka {

namespace {

ErrorCode AppendError(const log::AppendOutcome& o) {
  switch (o.status.code()) {
    case Code::kOk:
      return ErrorCode::kNone;
    case Code::kCorruption:
      return ErrorCode::kCorruptMessage;
    case Code::kInvalidArgument:  // past the WAL pool: the client may split it
      return o.too_large ? ErrorCode::kMessageTooLarge : ErrorCode::kInvalidRecord;
    case Code::kNotSupported:
      return ErrorCode::kTransactionalIdAuthorizationFailed;
    case Code::kOutOfRange:
      return ErrorCode::kOutOfOrderSequenceNumber;  // a producer not known here starts anywhere (KIP-360)
    case Code::kFenced:  // the producer's epoch, or this node's WAL lost to a successor
      return o.producer_fenced ? ErrorCode::kInvalidProducerEpoch : ErrorCode::kNotLeaderOrFollower;
    case Code::kNotFound:
      return ErrorCode::kUnknownTopicOrPartition;
    case Code::kTimeout:
    case Code::kUnavailable:
    case Code::kResourceExhausted:
      // REQUEST_TIMED_OUT tells a client the batch may have been written:
      // librdkafka's idempotent producer then counts it as acknowledged, and
      // the next batch's OUT_OF_ORDER_SEQUENCE_NUMBER (this one never got
      // offsets) is fatal to it. A batch refused before it had offsets is
      // NOT_ENOUGH_REPLICAS: retried, known not written.
      return o.not_admitted ? ErrorCode::kNotEnoughReplicas : ErrorCode::kRequestTimedOut;
    case Code::kCancelled:
      return ErrorCode::kNotLeaderOrFollower;
    default:
      return ErrorCode::kKafkaStorageError;
  }
}

// A partition's answer to a failed read of its stream (Fetch, ListOffsets,
// DeleteRecords): NOT_LEADER_OR_FOLLOWER once another process holds this
// node (kFenced: clients look up the leader again), KAFKA_STORAGE_ERROR for
// what is not the client's.
ErrorCode PartitionReadError(const Status& st) {
  switch (st.code()) {
    case Code::kOutOfRange:
      return ErrorCode::kOffsetOutOfRange;
    case Code::kNotFound:
      return ErrorCode::kUnknownTopicOrPartition;
    case Code::kFenced:
      return ErrorCode::kNotLeaderOrFollower;
    default:
      return ErrorCode::kKafkaStorageError;
  }
}

// An admin request's answer to a failure of the engine or metastore: a
// retryable one (kUnavailable, kTimeout, kResourceExhausted; kFenced, this
// process superseded: a retry may reach its successor) as
// REQUEST_TIMED_OUT, which clients retry; UNKNOWN_SERVER_ERROR, which they
// do not, otherwise.
ErrorCode AdminFailure(const Status& st) {
  // A topic deleted while the request ran (its check passed before).
  if (st.code() == Code::kNotFound) return ErrorCode::kUnknownTopicOrPartition;
  // --max-streams: as a create policy's refusal.
  if (st.code() == Code::kQuotaExhausted) return ErrorCode::kPolicyViolation;
  return IsRetryableCode(st.code()) || st.code() == Code::kFenced ? ErrorCode::kRequestTimedOut
                                                                   : ErrorCode::kUnknownServerError;
}

// A produce's partition refused before its batch reached the engine: a
// retryable failure as NOT_ENOUGH_REPLICAS (nothing written; see AppendError).
ErrorCode ProduceRefusal(const Status& st) {
  const ErrorCode e = AdminFailure(st);
  return e == ErrorCode::kRequestTimedOut ? ErrorCode::kNotEnoughReplicas : e;
}

// What Kafka's broker answers for a partition's records before it reads a
// record (ProduceRequest.validateRecords, v3 and later): INVALID_RECORD when
// there is no whole first batch or it is not magic 2 (not retried, unlike
// CORRUPT_MESSAGE), UNSUPPORTED_COMPRESSION_TYPE for zstd before v7. A length
// below any batch's is left to the CRC check (CORRUPT_MESSAGE, as Kafka).
ErrorCode ProduceRecordsError(const std::optional<std::string_view>& records, int16_t version) {
  constexpr size_t kLogOverhead = 12;  // baseOffset and batchLength
  if (!records || records->size() < kLogOverhead) return ErrorCode::kInvalidRecord;
  const char* p = records->data();
  const int64_t batch_length = static_cast<int32_t>(weir::LoadBE32(p + 8));
  if (batch_length < 14) return ErrorCode::kNone;  // Kafka: CorruptRecordException
  // The first batch is whole from here on, and at least 26 bytes: its magic
  // (byte 16) and attributes (bytes 21-22) are there. One shorter than a v2
  // header is left to the CRC check too.
  if (static_cast<uint64_t>(batch_length) + kLogOverhead > records->size()) return ErrorCode::kInvalidRecord;
  if (static_cast<int8_t>(p[16]) != wal::kRecordBatchMagic) return ErrorCode::kInvalidRecord;
  constexpr int kZstd = 4;
  if ((weir::LoadBE16(p + 21) & wal::kCompressionMask) == kZstd && version < 7) {
    return ErrorCode::kUnsupportedCompressionType;
  }
  return ErrorCode::kNone;
}

// Whether a Fetch of this version must refuse these batches: clients before
// Fetch v10 cannot read zstd, and Kafka answers UNSUPPORTED_COMPRESSION_TYPE
// rather than send them.
bool FetchCannotCarry(const std::vector<std::shared_ptr<const std::string>>& batches, int16_t version) {
  if (version >= 10) return false;
  for (const auto& b : batches) {
    auto h = wal::ParseBatchHeader(*b);
    if (h.ok() && h->compression() == 4) return true;
  }
  return false;
}

}  // namespace

Status ValidateTopicName(const std::string& name) { return metastore::CheckLogTableName(name, "topic"); }

Broker::Broker(BrokerOptions options, log::Engine* engine, std::shared_ptr<metastore::Metastore> meta)
    : options_(std::move(options)), engine_(engine), meta_(std::move(meta)), groups_(options_.groups) {
  tick_thread_ = std::thread([this] { TickLoop(); });
  expiry_thread_ = std::thread([this] { ExpiryLoop(); });
}

Broker::~Broker() { Stop(); }

void Broker::Stop() {
  {
    std::lock_guard lk(tick_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  tick_cv_.notify_all();
  // Waiting joins and fetches are answered first: the expiry thread may be
  // in a slow metastore call.
  groups_.Shutdown();
  AnswerWaitingFetches();
  if (tick_thread_.joinable()) tick_thread_.join();
  if (expiry_thread_.joinable()) expiry_thread_.join();
}

void Broker::TickLoop() {
  SetThreadName("kafka-tick");
  std::unique_lock lk(tick_mu_);
  bool groups_shut = false;
  while (!stopping_) {
    tick_cv_.wait_for(lk, std::chrono::milliseconds(100));
    if (stopping_) break;
    lk.unlock();
    if (!groups_shut && engine_->superseded()) {
      // Its successor coordinates the groups now: joins waiting for a
      // rebalance are answered COORDINATOR_NOT_AVAILABLE, as is every group
      // request from here on, so members look for the coordinator again.
      Log().warn("kafka: node superseded by another process; coordinating no more groups");
      groups_.Shutdown();
      groups_shut = true;
    }
    groups_.Tick(Now());
    lk.lock();
  }
}

// On its own thread: a slow metastore must not hold up the group timers.
// Groups are looked at more often than offsets expire: an Empty group is
// forgotten by the coordinator after its empty_group_retention (10 min), so
// a check every 10 min alone could miss one that had members in between.
void Broker::ExpiryLoop() {
  SetThreadName("kafka-expiry");
  const Duration look_every = std::min<Duration>(options_.offsets_retention_check, std::chrono::minutes(1));
  TimePoint next_expiry = Now();
  std::unique_lock lk(tick_mu_);
  while (!stopping_) {
    lk.unlock();
    NoteActiveGroups();
    if (Now() >= next_expiry) {
      ExpireOffsets();
      next_expiry = Now() + options_.offsets_retention_check;
    }
    lk.lock();
    tick_cv_.wait_for(lk, std::min<Duration>(look_every, std::max<Duration>(next_expiry - Now(), Duration(0))),
                      [&] { return stopping_; });
  }
}

// Groups with members (or rebalancing) are active now; an Empty group was
// active when it became empty (its last member left).
void Broker::NoteActiveGroups() {
  const int64_t now = WallMillis();
  const TimePoint steady_now = Now();
  for (const GroupOverview& g : groups_.ListGroups()) {
    int64_t at = now;
    if (g.state == GroupState::kEmpty) {
      at = now - std::chrono::duration_cast<std::chrono::milliseconds>(steady_now - g.empty_since).count();
    }
    auto [it, added] = last_active_ms_.emplace(g.group_id, at);
    if (!added) it->second = std::max(it->second, at);
  }
}

void Broker::ExpireOffsets() {
  // Groups with members (or rebalancing) keep their offsets however old, and
  // so do groups seen with members within the retention. Membership is not
  // persisted, so every group counts as active when this broker started:
  // nothing expires before the retention has passed since then (groups
  // rejoin after a restart with their members' next requests).
  const int64_t now = WallMillis();
  const int64_t cutoff = now - std::chrono::duration_cast<std::chrono::milliseconds>(options_.offsets_retention).count();
  std::erase_if(last_active_ms_, [&](const auto& kv) { return kv.second < cutoff; });
  if (last_active_ms_.size() > kMaxGroupsRemembered) {
    // Many short-lived groups (ids made up per run): those seen longest ago
    // are forgotten, and their offsets expire by their last commit alone.
    std::vector<int64_t> times;
    times.reserve(last_active_ms_.size());
    for (const auto& [group, at] : last_active_ms_) times.push_back(at);
    auto nth = times.begin() + static_cast<ptrdiff_t>(times.size() - kMaxGroupsRemembered);
    std::nth_element(times.begin(), nth, times.end());
    const int64_t oldest_kept = *nth;
    std::erase_if(last_active_ms_, [&](const auto& kv) { return kv.second < oldest_kept; });
  }
  metrics_.offset_expiry_checks++;
  if (started_ms_ >= cutoff) return;
  std::vector<std::string> keep;
  for (const auto& [group, at] : last_active_ms_) keep.push_back(group);
  Result<std::vector<std::string>> removed = std::vector<std::string>{};
  Status expired = engine_->RunAsThisNode([&](const metastore::EpochCheck& by) {
    removed = meta_->ExpireGroupOffsets(cutoff, keep, by);
    return removed.status();
  });
  if (!expired.ok()) {
    Log().warn("kafka: expiring committed offsets: {}", expired.ToString());
    return;
  }
  for (const std::string& group : *removed) {
    Log().info("kafka: offsets of group {} expired (no commit for {} h and no members)", group,
               std::chrono::duration_cast<std::chrono::hours>(options_.offsets_retention).count());
  }
  metrics_.offset_groups_expired += removed->size();
}

Status Broker::Init() {
  if (engine_->group_offsets_basin() != options_.basin) {
    return InvalidArgument(
        "the engine keeps group offsets with the tables of basin \"{}\", not the Kafka basin \"{}\" "
        "(EngineOptions::group_offsets_basin)",
        engine_->group_offsets_basin(), options_.basin);
  }
  Status st = engine_->CreateBasin(options_.basin);
  if (!st.ok() && st.code() != Code::kAlreadyExists) return st.WithContext("creating the Kafka basin");
  return Status::Ok();
}

void Broker::Handle(Frame frame, std::shared_ptr<Reply> reply) {
  auto req = std::make_shared<Request>();
  req->frame = std::move(frame);
  req->reply = std::move(reply);
  auto decoded = DecodeRequest(req->frame.view());
  if (!decoded.ok()) {
    auto header = PeekRequestHeader(req->frame.view());
    if (IsUnsupportedApi(decoded.status()) && header.ok() &&
        header->api_key == static_cast<int16_t>(ApiKey::kApiVersions)) {
      // A client's first ApiVersions at a version newer than ours: answered
      // (it asks again at one we have), not a bad request.
      metrics_.requests_by_api[static_cast<size_t>(ApiKey::kApiVersions)]++;
      return req->reply->Respond(EncodeApiVersionsUnsupported(header->correlation_id));
    }
    metrics_.bad_requests++;
    Log().warn("kafka: closing the connection of {}: {}", req->reply->peer(), decoded.status().ToString());
    return req->reply->Close();
  }
  req->decoded = std::move(*decoded);
  auto key = static_cast<size_t>(req->decoded.header.api_key);
  if (key < std::size(metrics_.requests_by_api)) metrics_.requests_by_api[key]++;
  Dispatch(req);
}

static_assert(
    [] {
      for (const ApiInfo& api : kSupportedApis) {
        if (api.key < 0 || static_cast<size_t>(api.key) >= std::extent_v<decltype(BrokerMetrics::requests_by_api)>) {
          return false;
        }
      }
      return true;
    }(),
    "BrokerMetrics::requests_by_api must have a slot for every supported api key");

// One handler per API; the versions each accepts are the rows of
// kSupportedApis (api_table.h), checked by DecodeRequest. Requests that change
// or read state run in request order per connection, as on a Kafka broker
// (an async commit must not overtake the one before it, nor a produce the
// one before it); Fetch, which only reads and may long-poll, does not wait
// for them, but one Fetch of a connection waits for the previous one's
// response to be written (its response may be large).
void Broker::Dispatch(const std::shared_ptr<Request>& req) {
  Reply& r = *req->reply;
  auto ordered = [&](void (Broker::*fn)(const std::shared_ptr<Request>&)) {
    r.PostInOrder([this, req, fn] { (this->*fn)(req); });
  };
  auto in_order = [&](void (Broker::*fn)(const std::shared_ptr<Request>&)) {
    r.RunInOrder([this, req, fn](bool) { (this->*fn)(req); });
  };
  switch (RequestKey(req->decoded.body)) {
    case ApiKey::kProduce:  // acks=0 gets no response: it still runs after a clean close (tcp_server.h)
      return r.RunInOrder([this, req](bool on_worker) { Produce(req, on_worker); },
                          req->body<ProduceRequest>().acks != 0);
    case ApiKey::kFetch:           return r.PostOneAtATime([this, req] { Fetch(req); });
    case ApiKey::kListOffsets:     return ordered(&Broker::ListOffsets);
    case ApiKey::kMetadata:        return ordered(&Broker::Metadata);
    case ApiKey::kOffsetCommit:    return ordered(&Broker::OffsetCommit);
    case ApiKey::kOffsetFetch:     return ordered(&Broker::OffsetFetch);
    case ApiKey::kFindCoordinator: return FindCoordinator(req);
    case ApiKey::kJoinGroup:       return in_order(&Broker::JoinGroup);
    case ApiKey::kHeartbeat:       return in_order(&Broker::Heartbeat);
    case ApiKey::kLeaveGroup:      return in_order(&Broker::LeaveGroup);
    case ApiKey::kSyncGroup:       return in_order(&Broker::SyncGroup);
    case ApiKey::kApiVersions:     return ApiVersions(req);
    case ApiKey::kCreateTopics:    return ordered(&Broker::CreateTopics);
    case ApiKey::kDeleteTopics:    return ordered(&Broker::DeleteTopics);
    case ApiKey::kInitProducerId:  return ordered(&Broker::InitProducerId);
    case ApiKey::kDescribeGroups:  return ordered(&Broker::DescribeGroups);
    case ApiKey::kListGroups:      return ordered(&Broker::ListGroups);
    case ApiKey::kDeleteGroups:    return ordered(&Broker::DeleteGroups);
    case ApiKey::kDescribeConfigs: return ordered(&Broker::DescribeConfigs);
    case ApiKey::kCreatePartitions: return ordered(&Broker::CreatePartitions);
    case ApiKey::kDeleteRecords:   return ordered(&Broker::DeleteRecords);
    case ApiKey::kAlterConfigs:    return ordered(&Broker::AlterConfigs);
    case ApiKey::kIncrementalAlterConfigs: return ordered(&Broker::IncrementalAlterConfigs);
    case ApiKey::kOffsetDelete:    return ordered(&Broker::OffsetDelete);
  }
  req->reply->Close();
}

// ---- Topics -------------------------------------------------------------------

Status Broker::CreateTopic(const std::string& topic, int32_t partitions, const std::string& config_json,
                           const metastore::StreamConfig& stream_config) {
  WEIR_RETURN_IF_ERROR(ValidateTopicName(topic));
  if (partitions < 1 || partitions > options_.max_partitions) {
    return InvalidArgument("a topic has 1 to {} partitions, not {}", options_.max_partitions, partitions);
  }
  // As Kafka: a topic that exists is TOPIC_ALREADY_EXISTS before any collision.
  if (engine_->GetTable(options_.basin, topic).ok()) return AlreadyExists("topic '{}' already exists", topic);
  WEIR_RETURN_IF_ERROR(CheckTopicCollision(topic));
  metastore::TableInfo t;
  t.basin = options_.basin;
  t.name = topic;
  t.kind = "log";
  t.bucket_count = static_cast<uint32_t>(partitions);
  t.config = config_json;
  auto created = engine_->CreateTable(t, stream_config);
  if (!created.ok() && created.status().code() == Code::kNotFound) {
    // The basin was deleted (through the REST API): bring it back.
    WEIR_RETURN_IF_ERROR(Init());
    created = engine_->CreateTable(t, stream_config);
  }
  if (!created.ok()) return created.status();
  metrics_.topics_created++;
  Log().info("kafka: created topic {} with {} partitions", topic, partitions);
  return Status::Ok();
}

Status Broker::CheckTopicCollision(const std::string& topic) {
  if (topic.find_first_of("._") == std::string::npos) return Status::Ok();
  auto folded = [](std::string s) {
    std::replace(s.begin(), s.end(), '.', '_');
    return s;
  };
  const std::string mine = folded(topic);
  // A colliding name has this one's characters up to its first '.' or '_'.
  const std::string prefix = topic.substr(0, topic.find_first_of("._"));
  std::string after;
  for (;;) {
    WEIR_ASSIGN_OR_RETURN(auto page, engine_->ListTables(options_.basin, prefix, after, 1000));
    for (const auto& t : page) {
      if (t.name != topic && folded(t.name) == mine) {
        return InvalidArgument("topic '{}' collides with existing topic '{}' ('.' and '_' are one in Kafka's metric "
                               "names)",
                               topic, t.name);
      }
    }
    if (page.size() < 1000) return Status::Ok();
    after = page.back().name;
  }
}

Result<uint32_t> Broker::TopicPartitions(const std::string& topic, int32_t create_partitions) {
  auto t = engine_->GetTable(options_.basin, topic);
  if (t.ok()) return t->bucket_count;
  if (t.status().code() != Code::kNotFound || create_partitions <= 0) return t.status();
  WEIR_RETURN_IF_ERROR(ValidateTopicName(topic));
  std::lock_guard lk(create_mu_);
  Status st = CreateTopic(topic, create_partitions, "{}", metastore::LogTableStreamConfig());
  if (!st.ok() && st.code() != Code::kAlreadyExists) return st;
  WEIR_ASSIGN_OR_RETURN(auto made, engine_->GetTable(options_.basin, topic));
  return made.bucket_count;
}

// ---- Produce ------------------------------------------------------------------

struct ProduceJob {
  size_t topic = 0, partition = 0;  // indexes into the response
  std::string stream;
  std::string batch;
};

// One Produce request's batches on their way in: answered once the last is
// done. Shared by the appends' callbacks; `mu` guards the response.
struct ProduceRun {
  std::mutex mu;
  std::shared_ptr<ProduceResponse> resp;
  std::vector<ProduceJob> jobs;  // a batch is moved out as it is appended
  size_t outstanding = 0;
  std::shared_ptr<SuspendedWork> suspended;  // while it waits for admission
  TimePoint admit_by;  // one admission timeout for all its groups
};

static std::shared_ptr<ProduceRun> NewProduceRun(std::shared_ptr<ProduceResponse> resp, std::vector<ProduceJob> jobs) {
  auto run = std::make_shared<ProduceRun>();
  run->resp = std::move(resp);
  run->jobs = std::move(jobs);
  run->outstanding = run->jobs.size();
  return run;
}

// A Produce whose batches add up to more than this is checked (CRC, records)
// on a worker, not on the I/O thread that serves every connection: the I/O
// thread spends at most about 10 ms on one. Below it, the hop to a worker
// cost more than it saved (librdkafka's requests are up to a batch of about
// 1 MB per partition; measured with scripts/bench-kafka.sh).
constexpr size_t kInlineProduceBytes = 16 << 20;

void Broker::Produce(const std::shared_ptr<Request>& req, bool on_worker) {
  auto& in = req->body<ProduceRequest>();
  // Each topic's size limit, as kept in memory when the I/O thread looked
  // (read once: the kept limits may be dropped meanwhile).
  std::vector<std::optional<size_t>> limits(in.topic_data.size());
  if (!on_worker) {
    size_t bytes = 0;
    bool compressed = false;
    for (const auto& t : in.topic_data) {
      for (const auto& p : t.partition_data) {
        if (!p.records) continue;
        bytes += p.records->size();
        auto h = wal::ParseBatchHeader(*p.records);
        compressed = compressed || (h.ok() && h->compression() != 0);
      }
    }
    // Admission may block (backpressure), and checking a compressed batch
    // decompresses it (a big one takes long to check, too): neither on the
    // I/O thread, which serves every connection (heartbeats, fetches); still
    // in order. A topic's size limit not yet read is a metastore read: not
    // here either.
    bool uncached = false;
    for (size_t i = 0; i < in.topic_data.size(); ++i) {
      limits[i] = KeptMaxMessageBytes(in.topic_data[i].name);
      uncached = uncached || !limits[i];
    }
    if (compressed || uncached || bytes > kInlineProduceBytes || engine_->AdmissionMayWait(bytes)) {
      return req->reply->PostInOrder([this, req] { Produce(req, true); }, in.acks != 0);
    }
  }
  auto resp = std::make_shared<ProduceResponse>();
  // Per-request checks that fail every partition alike.
  ErrorCode all = ErrorCode::kNone;
  if (in.transactional_id) all = ErrorCode::kTransactionalIdAuthorizationFailed;
  if (in.acks != 0 && in.acks != 1 && in.acks != -1) all = ErrorCode::kInvalidRequiredAcks;
  std::vector<ProduceJob> jobs;
  std::set<std::string> to_create;  // missing topics a batch may be appended to once created
  for (size_t ti = 0; ti < in.topic_data.size(); ++ti) {
    auto& t = in.topic_data[ti];
    ProduceTopicResponse tr;
    tr.name = t.name;
    bool valid_topic = ValidateTopicName(t.name).ok();
    Result<size_t> max_bytes = !valid_topic ? options_.max_batch_bytes
                               : limits[ti]  ? *limits[ti]
                                             : MaxMessageBytes(t.name);
    for (auto& p : t.partition_data) {
      ProducePartitionResponse pr;
      pr.index = p.index;
      pr.error_code = all;
      if (pr.error_code != ErrorCode::kNone) {
      } else if (!max_bytes.ok()) {  // the topic's limit is unknown for now: retriable, nothing written
        pr.error_code = ProduceRefusal(max_bytes.status());
      } else if (!valid_topic) {
        pr.error_code = ErrorCode::kInvalidTopicException;
      } else if (p.index < 0) {
        pr.error_code = ErrorCode::kUnknownTopicOrPartition;
      } else if (ErrorCode e = ProduceRecordsError(p.records, req->version()); e != ErrorCode::kNone) {
        pr.error_code = e;
      } else if (p.records->size() > *max_bytes) {
        pr.error_code = ErrorCode::kMessageTooLarge;
      } else {
        ProduceJob job{resp->responses.size(), tr.partition_responses.size(),
                       metastore::BucketStreamName(t.name, static_cast<uint32_t>(p.index)), std::string(*p.records)};
        // Auto-creation, for partitions it would make (the batch is checked
        // on the worker that creates: a rejected produce changes nothing).
        if (options_.auto_create_partitions > 0 && p.index < options_.auto_create_partitions &&
            !to_create.count(t.name) &&
            engine_->CheckTail(options_.basin, job.stream).status().code() == Code::kNotFound) {
          to_create.insert(t.name);
        }
        jobs.push_back(std::move(job));
      }
      tr.partition_responses.push_back(pr);
    }
    resp->responses.push_back(std::move(tr));
  }
  // On the I/O thread only when admission looked free (above); should it
  // fill meanwhile, the batch is refused (retriable) rather than waited for.
  if (to_create.empty()) {
    if (on_worker) return ProduceWhenAdmissible(req, std::move(resp), std::move(jobs));
    return ProduceAppend(req, std::move(resp), std::move(jobs), nullptr);
  }
  // A topic is missing: create it off the I/O thread, then append, still
  // before this connection's next request.
  auto create_then_append = [this, req, resp, jobs = std::move(jobs), to_create = std::move(to_create)]() mutable {
    // Only topics with a batch the append would take, to a partition the
    // creation makes.
    std::set<std::string> wanted;
    for (const auto& job : jobs) {
      const std::string& topic = resp->responses[job.topic].name;
      const int32_t partition = resp->responses[job.topic].partition_responses[job.partition].index;
      if (to_create.count(topic) && !wanted.count(topic) && partition < options_.auto_create_partitions &&
          engine_->CheckBatch(job.batch).ok()) {
        wanted.insert(topic);
      }
    }
    for (const auto& topic : wanted) {
      auto n = TopicPartitions(topic, options_.auto_create_partitions);
      // Past --max-streams: as a topic that does not exist (said by CreateTopics).
      if (!n.ok() && n.status().code() != Code::kNotFound && n.status().code() != Code::kQuotaExhausted) {
        Log().warn("kafka: auto-creating topic {}: {}", topic, n.status().ToString());
      }
      // The topic may have been there with a partition memory lacks (a
      // create whose answer was lost): loaded, or appends to it would fail
      // for ever. Only for a partition the topic has (this path is rare).
      bool has = false;
      for (const auto& job : jobs) {
        has = has || (n.ok() && resp->responses[job.topic].name == topic &&
                      resp->responses[job.topic].partition_responses[job.partition].index < static_cast<int32_t>(*n));
      }
      if (has) engine_->LoadTable(options_.basin, topic).IgnoreError();
    }
    ProduceWhenAdmissible(req, std::move(resp), std::move(jobs));
  };
  if (on_worker) return create_then_append();
  req->reply->PostInOrder(std::move(create_then_append), req->body<ProduceRequest>().acks != 0);
}

void Broker::ProduceWhenAdmissible(const std::shared_ptr<Request>& req, std::shared_ptr<ProduceResponse> resp,
                                   std::vector<ProduceJob> jobs) {
  size_t bytes = 0;
  for (const auto& job : jobs) bytes += job.batch.size();
  // Room taken now for all the batches, held by the ticket (a look then an
  // append would leave the worker waiting should others take the room in
  // between), or waited for without holding the worker.
  std::shared_ptr<log::AdmissionTicket> ticket;
  if (jobs.empty() || ((ticket = engine_->TryAdmission(bytes, jobs.size())) && ticket->has_room())) {
    return ProduceAppend(req, std::move(resp), std::move(jobs), ticket);
  }
  auto run = NewProduceRun(std::move(resp), std::move(jobs));
  // An idempotent producer's retry of a batch already appended (its answer
  // was lost or late) needs no room: answered now, or once its original is
  // durable, rather than after waiting out a full pool.
  std::vector<ProduceJob> waiting;
  for (size_t i = 0; i < run->jobs.size(); ++i) {
    ProduceJob& job = run->jobs[i];
    log::AppendCallback done = JobDone(req, run, i);
    const size_t size = job.batch.size();
    if (engine_->AnswerRetriedBatch(options_.basin, job.stream, job.batch, done)) {
      metrics_.produce_batches++;
      metrics_.produce_bytes += size;
      continue;
    }
    waiting.push_back(std::move(job));
  }
  // Callbacks read only the response indexes, never `jobs`.
  run->jobs = std::move(waiting);
  if (run->jobs.empty()) return;  // the last answer finishes the request
  run->suspended = req->reply->SuspendInOrder();
  run->admit_by = Now() + engine_->admission_timeout();
  WaitForAdmission(req, run, 0);
}

void Broker::WaitForAdmission(const std::shared_ptr<Request>& req, const std::shared_ptr<ProduceRun>& run,
                              size_t from) {
  auto& jobs = run->jobs;
  if (from == jobs.size()) return run->suspended->Resume(nullptr);  // all in: the connection goes on
  const auto [to, bytes] = engine_->NextAdmissionGroup(from, jobs.size(), [&](size_t i) { return jobs[i].batch.size(); });
  // A client that left while its batches waited gets no more appends: it
  // retries them elsewhere, and a late append would be a second copy (as
  // ordered work left waiting at a close is dropped). An acks=0 batch still
  // goes in.
  auto left = [req] { return req->reply->closed() && req->body<ProduceRequest>().acks != 0; };
  using Wait = log::Engine::AdmissionWait;
  engine_->WhenAdmissible(
      bytes, to - from, run->admit_by,
      // Looks on the ordered-work threads: the read threads may all be in
      // slow GETs of fetches.
      [req](Duration delay, std::function<void()> fn) { req->reply->WorkAfter(delay, std::move(fn)); }, left,
      [this, req, run, from, to](Wait how, std::shared_ptr<log::AdmissionTicket> ticket) {
        if (how == Wait::kAbandoned) {
          req->reply->NoResponse();  // nobody to answer; batches appended before still complete
          return run->suspended->Resume(nullptr);
        }
        // Posted to an ordered-work thread (the look runs on one, or on the
        // caller's thread when there is room at once).
        req->reply->PostWork([this, req, run, from, to, how, ticket = std::move(ticket)]() mutable {
          // Room held for this group; else (expired) the rest now, admitted
          // or refused, as a wait that ran out.
          const size_t end = how == Wait::kRoom ? to : run->jobs.size();
          for (size_t i = from; i < end; ++i) AppendJob(req, run, i, how == Wait::kRoom ? ticket : nullptr);
          ticket.reset();  // room a batch did not take (refused before) goes back before the next look
          WaitForAdmission(req, run, end);
        });
      });
}

void Broker::ProduceAppend(const std::shared_ptr<Request>& req, std::shared_ptr<ProduceResponse> resp,
                           std::vector<ProduceJob> jobs, const std::shared_ptr<log::AdmissionTicket>& ticket) {
  auto run = NewProduceRun(std::move(resp), std::move(jobs));
  if (run->jobs.empty()) return FinishProduce(req, *run->resp);
  for (size_t i = 0; i < run->jobs.size(); ++i) AppendJob(req, run, i, ticket);
}

void Broker::FinishProduce(const std::shared_ptr<Request>& req, const ProduceResponse& r) {
  // acks=0 gets no response; Kafka closes the connection instead when a
  // partition failed, its only way to tell the client (which then refreshes
  // its metadata). Either happens once the appends are done, so the
  // connection's later requests wait as they would on a Kafka broker.
  if (req->body<ProduceRequest>().acks != 0) return Send(req, r, EncodeProduceResponse);
  for (const auto& tr : r.responses) {
    for (const auto& pr : tr.partition_responses) {
      if (pr.error_code != ErrorCode::kNone) return req->reply->Close();
    }
  }
  req->reply->NoResponse();
}

void Broker::AppendJob(const std::shared_ptr<Request>& req, const std::shared_ptr<ProduceRun>& run, size_t i,
                       const std::shared_ptr<log::AdmissionTicket>& ticket) {
  ProduceJob& job = run->jobs[i];
  metrics_.produce_batches++;
  metrics_.produce_bytes += job.batch.size();
  // Never waits for admission: room held by the ticket, or taken now, or
  // the batch is refused (retriable).
  engine_->AppendBatchAsync(options_.basin, job.stream, std::move(job.batch), JobDone(req, run, i),
                            /*may_wait=*/false, ticket);
}

log::AppendCallback Broker::JobDone(const std::shared_ptr<Request>& req, const std::shared_ptr<ProduceRun>& run,
                                    size_t i) {
  const size_t ti = run->jobs[i].topic, pi = run->jobs[i].partition;
  return [this, req, run, ti, pi](log::AppendOutcome o) {
    bool last = false;
    {
      std::lock_guard lk(run->mu);
      auto& pr = run->resp->responses[ti].partition_responses[pi];
      pr.error_code = AppendError(o);
      if (o.status.ok()) {
        pr.base_offset = static_cast<int64_t>(o.ack.start_offset);
        pr.log_start_offset = static_cast<int64_t>(o.ack.log_start);
        if (o.ack.log_append_time) pr.log_append_time_ms = o.ack.last_timestamp_ms;
      } else {
        pr.base_offset = -1;
        metrics_.produce_errors++;
        Log().debug("kafka: produce to {}[{}] from {}: {}", run->resp->responses[ti].name, pr.index,
                    req->reply->peer(), o.status.ToString());
      }
      last = --run->outstanding == 0;
    }
    if (last) FinishProduce(req, *run->resp);
  };
}

// ---- Fetch --------------------------------------------------------------------

// One Fetch in flight: it is read again each time a watched partition's
// high watermark moves, and answered once min_bytes are there, a partition
// fails, or max_wait_ms is over.
// A longer max_wait_ms is cut to this (an earlier empty answer is legal).
constexpr int32_t kMaxFetchWaitMs = 30000;
// A fetch that found no room for its answer looks again this often.
constexpr auto kFetchRoomRetry = std::chrono::milliseconds(100);
// A fetch's partitions whose reads need the object store (settled or
// evicted data) are read this many at a time.
constexpr size_t kFetchParallelReads = 8;

// Drops a read's trailing batches past `max_bytes` (its first stays).
void KeepWithin(std::vector<std::shared_ptr<const std::string>>* batches, size_t max_bytes) {
  size_t bytes = 0, keep = 0;
  for (; keep < batches->size(); ++keep) {
    const size_t size = (*batches)[keep]->size();
    if (keep > 0 && bytes + size > max_bytes) break;
    bytes += size;
  }
  batches->resize(keep);
}

struct FetchState {
  std::mutex mu;
  bool answered = false;     // the response is sent (or being built to send)
  // Watches are set and no read of it is running. Whoever clears it (a
  // watch, the timer, Stop) takes the fetch; atomic so a watch firing on the
  // WAL's thread takes it without waiting for `mu`, which a fetch holds
  // while it registers its watches.
  std::atomic<bool> waiting{false};
  bool timer_armed = false;  // max_wait_ms runs from the first wait
  bool expired = false;      // max_wait_ms is over: the next read answers
  std::vector<std::pair<std::string, uint64_t>> watches;  // (stream, watch id)
};

void Broker::Fetch(const std::shared_ptr<Request>& req) {
  auto& in = req->body<FetchRequest>();
  if (in.session_epoch != 0 && in.session_epoch != -1) {
    // Epochs 0 (a new session) and -1 (none) ask for a full fetch; any
    // other names an open session (KIP-227), whatever the id: weir opens
    // none (it answers session id 0), so a client cannot hold one.
    FetchResponse resp;
    resp.error_code = ErrorCode::kFetchSessionIdNotFound;
    return Send(req, resp, EncodeFetchResponse);
  }
  // A partition named more than once is read and answered once, where it
  // was first named, with its last entry's offset and limit (Kafka keys a
  // fetch's partitions by name in a map, whose later entries replace
  // earlier ones): a request of a million entries naming one partition
  // would otherwise read it a million times.
  std::unordered_map<std::string, std::unordered_map<int32_t, FetchPartition>> last;
  for (const auto& t : in.topics) {
    for (const auto& p : t.partitions) last[t.topic][p.partition] = p;
  }
  std::unordered_map<std::string, std::unordered_set<int32_t>> named;
  for (auto& t : in.topics) {
    auto& parts = named[t.topic];
    std::erase_if(t.partitions, [&](const FetchPartition& p) { return !parts.insert(p.partition).second; });
    for (auto& p : t.partitions) p = last[t.topic][p.partition];
  }
  std::erase_if(in.topics, [](const FetchTopic& t) { return t.partitions.empty(); });
  auto state = std::make_shared<FetchState>();
  FetchOnce(req, state, /*final=*/in.max_wait_ms <= 0);
}

void Broker::FetchOnce(const std::shared_ptr<Request>& req, const std::shared_ptr<FetchState>& state, bool final) {
  auto& in = req->body<FetchRequest>();
  FetchResponse resp;
  if (req->reply->closed()) {
    // The client left: no more reads or waits (an append woke it, or its
    // timer fired). The empty answer goes nowhere; it ends the exchange.
    {
      std::lock_guard lk(state->mu);
      state->answered = true;
    }
    {
      std::lock_guard flk(fetches_mu_);
      metrics_.fetches_waiting -= static_cast<int64_t>(waiting_fetches_.erase(state.get()));
    }
    return Send(req, resp, EncodeFetchResponse);
  }
  std::vector<std::shared_ptr<const std::string>> hold;  // keeps the views in resp alive
  size_t budget = std::min<size_t>(static_cast<size_t>(std::max(in.max_bytes, 1)), options_.max_fetch_bytes);
  // Responses waiting for slow readers share one budget (the server's
  // max_unwritten_total_bytes): the answer is cut to what is left. Its last
  // eighth is for answers of at most a batch, so consumers that keep up are
  // answered while bulk reads fill the rest. With less than a batch left
  // (the first batch may pass the limits, KIP-74) the fetch reads nothing:
  // it looks again every kFetchRoomRetry until max_wait_ms, then answers
  // without data.
  bool starved = false;
  if (size_t room = req->reply->ResponseRoom(/*small=*/false); room >= options_.max_batch_bytes) {
    budget = std::min(budget, room);
  } else if (req->reply->ResponseRoom(/*small=*/true) >= options_.max_batch_bytes) {
    budget = std::min(budget, options_.max_batch_bytes);
  } else {
    starved = true;
    budget = 0;
    metrics_.fetches_without_room++;
  }
  // Waiting for room, a pass reads nothing and watches no partition.
  const bool wait_for_room = starved && !final;
  size_t total = 0;
  bool error = false;
  bool held_back = false;  // a partition has data this answer leaves out
  // Where to watch if the fetch has to wait: (stream, offset).
  std::vector<std::pair<std::string, uint64_t>> waits;
  static const std::vector<FetchTopic> kNoTopics;
  // Partitions are read in waves of up to kFetchParallelReads, those that
  // need the object store in parallel (a consumer catching up over many
  // partitions waits about one GET per wave, not one per partition). A wave
  // starts at the first partition not yet read, with the room the answer
  // has left, and takes the partitions after it while room would be left
  // if each before it filled its partition_max_bytes; each is read up to
  // that. So a fetch holds at most a wave's reads besides its answer.
  std::vector<std::pair<const FetchTopic*, const FetchPartition*>> flat;  // in request order
  for (const auto& t : wait_for_room ? kNoTopics : in.topics) {
    for (const auto& p : t.partitions) flat.emplace_back(&t, &p);
  }
  std::vector<std::optional<Result<log::BatchReadResult>>> wave(flat.size());
  auto read_wave = [&](size_t first) {
    std::vector<log::Engine::BatchRead> reads;
    std::vector<size_t> of;  // index into flat of each read
    size_t planned = total;
    for (size_t i = first; i < flat.size() && reads.size() < kFetchParallelReads; ++i) {
      const FetchPartition& p = *flat[i].second;
      if (p.partition < 0 || p.fetch_offset < 0) continue;
      const size_t want = std::min<size_t>(static_cast<size_t>(std::max(p.partition_max_bytes, 1)),
                                           budget > planned ? budget - planned : 0);
      if (want == 0) break;
      planned += want;
      of.push_back(i);
      reads.push_back(log::Engine::BatchRead{
          metastore::BucketStreamName(flat[i].first->topic, static_cast<uint32_t>(p.partition)),
          static_cast<uint64_t>(p.fetch_offset), want});
    }
    auto got = engine_->ReadBatchesMany(options_.basin, reads, kFetchParallelReads);
    for (size_t k = 0; k < of.size(); ++k) wave[of[k]] = std::move(got[k]);
  };
  size_t partition_no = 0;
  for (const auto& t : wait_for_room ? kNoTopics : in.topics) {
    FetchableTopicResponse tr;
    tr.topic = t.topic;
    for (auto& p : t.partitions) {
      const size_t flat_no = partition_no++;
      FetchPartitionData pd;
      pd.partition_index = p.partition;
      pd.aborted_transactions = std::vector<AbortedTransaction>{};
      std::string stream = metastore::BucketStreamName(t.topic, static_cast<uint32_t>(std::max(p.partition, 0)));
      if (p.partition < 0 || p.fetch_offset < 0) {
        pd.error_code = p.partition < 0 ? ErrorCode::kUnknownTopicOrPartition : ErrorCode::kOffsetOutOfRange;
        error = true;
        tr.partitions.push_back(std::move(pd));
        continue;
      }
      size_t want = std::min<size_t>(static_cast<size_t>(std::max(p.partition_max_bytes, 1)),
                                     budget > total ? budget - total : 0);
      Result<log::BatchReadResult> r = Status();
      if (want == 0) {
        // No room left for data, but the offset is checked as a read would
        // (a consumer below the log start must learn it now, not once the
        // partitions before it have nothing more to give).
        r = engine_->Offsets(options_.basin, stream);
        if (r.ok() && (static_cast<uint64_t>(p.fetch_offset) < r->log_start ||
                       static_cast<uint64_t>(p.fetch_offset) > r->tail)) {
          r = OutOfRange("offset {} is outside [{}, {}]", p.fetch_offset, r->log_start, r->tail);
        }
      } else if (req->reply->closed()) {
        r = Cancelled("the client left");  // no more reads for an answer that goes nowhere
      } else {
        if (!wave[flat_no]) read_wave(flat_no);  // it leads the wave, with this very `want`
        r = wave[flat_no] ? std::move(*wave[flat_no])
                          : engine_->ReadBatches(options_.basin, stream, static_cast<uint64_t>(p.fetch_offset), want);
        // Read with at most what was planned; the room left may be less (a
        // partition before it passed its limit with its first batch).
        if (r.ok() && !r->batches.empty()) KeepWithin(&r->batches, want);
      }
      wave[flat_no].reset();  // read in a wave but left no room: dropped now
      if (!r.ok()) {
        error = true;
        if (r.status().code() == Code::kOutOfRange) {
          pd.error_code = ErrorCode::kOffsetOutOfRange;
          auto offs = engine_->Offsets(options_.basin, stream);
          if (offs.ok()) {
            pd.high_watermark = pd.last_stable_offset = static_cast<int64_t>(offs->tail);
            pd.log_start_offset = static_cast<int64_t>(offs->log_start);
          }
        } else {
          if (r.status().code() != Code::kNotFound && r.status().code() != Code::kFenced &&
              r.status().code() != Code::kCancelled) {
            Log().warn("kafka: fetch {} at {}: {}", stream, p.fetch_offset, r.status().ToString());
          }
          pd.error_code = PartitionReadError(r.status());
        }
        tr.partitions.push_back(std::move(pd));
        continue;
      }
      pd.high_watermark = pd.last_stable_offset = static_cast<int64_t>(r->tail);
      pd.log_start_offset = static_cast<int64_t>(r->log_start);
      if (FetchCannotCarry(r->batches, req->version())) {
        pd.error_code = ErrorCode::kUnsupportedCompressionType;
        error = true;
        tr.partitions.push_back(std::move(pd));
        continue;
      }
      const bool at_end = r->batches.empty();
      // Only the first partition with data may go past the limits, by its
      // first batch (KIP-74); later ones get nothing rather than too much.
      if (total > 0 && !at_end && r->batches.front()->size() > want) r->batches.clear();
      // Whether this answer holds everything up to the high watermark.
      bool complete = r->batches.empty() ? at_end : false;
      if (!r->batches.empty()) {
        auto h = wal::ParseBatchHeader(*r->batches.back());
        complete = h.ok() && static_cast<uint64_t>(h->last_offset()) + 1 >= r->tail;
      }
      for (auto& b : r->batches) {
        total += b->size();
        pd.records.emplace_back(*b);
        hold.push_back(std::move(b));
      }
      // If the fetch waits for more bytes, a partition that gave all it had
      // wakes it once its high watermark moves. One held back by the limits
      // has nothing more to give this fetch: watching it would only read it
      // again on every append.
      if (complete) waits.emplace_back(stream, r->tail);
      held_back = held_back || (!complete && !at_end);
      tr.partitions.push_back(std::move(pd));
    }
    resp.responses.push_back(std::move(tr));
  }
  // min_bytes 0 answers at once, as in Kafka; so does a response that is as
  // full as max_bytes allows, and one with a partition whose data the limits
  // held back (waiting would add nothing: Kafka counts that data as there).
  bool enough = !wait_for_room && (error || (!starved && (total >= static_cast<size_t>(std::max(in.min_bytes, 0)) ||
                                                          total >= budget || held_back)) ||
                                   waits.empty());
  if (!final && !enough) {
    // Long poll: read again when a partition at its end gets data, until
    // min_bytes are there or max_wait_ms is over (or the broker stops).
    std::unique_lock lk(state->mu);
    if (state->answered) return;
    bool stopped = false;
    {
      std::lock_guard flk(fetches_mu_);
      stopped = fetches_stopped_;
      if (!stopped && waiting_fetches_.insert_or_assign(state.get(), std::pair{req, state}).second) {
        metrics_.fetches_waiting++;
      }
    }
    if (wait_for_room && (state->expired || stopped)) {
      // No more waiting: the final pass answers (errors and watermarks too).
      lk.unlock();
      return FetchOnce(req, state, /*final=*/true);
    }
    if (!state->expired && !stopped) {
      auto wake = [this, req, state] {
        if (!state->waiting.exchange(false)) return;  // another watch, or the timer, took it
        req->reply->Post([this, req, state] { FinishFetch(req, state, /*final=*/false); });
      };
      state->waiting = true;
      if (wait_for_room) {
        // The retry keeps the fetch alive (no watch does) for 100 ms at most.
        req->reply->After(kFetchRoomRetry, [this, req, state] {
          if (!state->waiting.exchange(false)) return;  // answered, or the timer took it
          req->reply->Post([this, req, state] { FinishFetch(req, state, /*final=*/false); });
        });
        waits.clear();
      }
      // One watch per stream (Fetch named each partition once).
      std::sort(waits.begin(), waits.end());
      waits.erase(std::unique(waits.begin(), waits.end(),
                              [](const auto& a, const auto& b) { return a.first == b.first; }),
                  waits.end());
      for (auto& [stream, offset] : waits) {
        auto id = engine_->WatchTail(options_.basin, stream, offset, wake);
        if (id.ok() && *id != 0) {
          state->watches.emplace_back(stream, *id);
        } else {
          // Moved already (or gone): read again now, unless a watch took it.
          if (state->waiting.exchange(false)) {
            req->reply->Post([this, req, state] { FinishFetch(req, state, /*final=*/false); });
          }
          break;
        }
      }
      if (!state->timer_armed) {
        state->timer_armed = true;
        // The timer holds the fetch only weakly: once it is answered, its
        // request is freed at once, not when max_wait_ms expires. Until then
        // the registered watches (or a pending read) keep it alive.
        std::weak_ptr<Request> weak_req = req;
        std::weak_ptr<FetchState> weak_state = state;
        req->reply->After(std::chrono::milliseconds(std::min(in.max_wait_ms, kMaxFetchWaitMs)),
                          [this, weak_req, weak_state] {
                            auto r = weak_req.lock();
                            auto st = weak_state.lock();
                            if (!r || !st) return;
                            {
                              std::lock_guard lk2(st->mu);
                              if (st->answered) return;
                              st->expired = true;
                              // A read that is running sees `expired` and answers.
                              if (!st->waiting.exchange(false)) return;
                            }
                            r->reply->Post([this, r, st] { FinishFetch(r, st, /*final=*/true); });
                          });
      }
      return;
    }
  }
  {
    std::lock_guard lk(state->mu);
    state->answered = true;
  }
  {
    std::lock_guard flk(fetches_mu_);
    metrics_.fetches_waiting -= static_cast<int64_t>(waiting_fetches_.erase(state.get()));
  }
  metrics_.fetch_bytes += total;
  Send(req, resp, EncodeFetchResponse);
}

void Broker::FinishFetch(const std::shared_ptr<Request>& req, const std::shared_ptr<FetchState>& state, bool final) {
  std::vector<std::pair<std::string, uint64_t>> watches;
  {
    std::lock_guard lk(state->mu);
    watches.swap(state->watches);
  }
  for (auto& [stream, id] : watches) engine_->UnwatchTail(options_.basin, stream, id);
  FetchOnce(req, state, final);
}

void Broker::AnswerWaitingFetches() {
  std::vector<std::pair<std::weak_ptr<Request>, std::weak_ptr<FetchState>>> waiting;
  {
    std::lock_guard lk(fetches_mu_);
    fetches_stopped_ = true;
    for (auto& [key, w] : waiting_fetches_) waiting.push_back(w);
  }
  for (auto& [weak_req, weak_state] : waiting) {
    auto req = weak_req.lock();
    auto state = weak_state.lock();
    if (!req || !state) continue;
    {
      std::lock_guard lk(state->mu);
      if (!state->waiting.exchange(false)) continue;  // a read of it is running, and answers (fetches_stopped_)
    }
    req->reply->Post([this, req, state] { FinishFetch(req, state, /*final=*/true); });
  }
}

// ---- ListOffsets ----------------------------------------------------------------

void Broker::ListOffsets(const std::shared_ptr<Request>& req) {
  // A lookup by time may read segments from the object store: it runs on a
  // read thread, the connection's later ordered work waiting for it (as
  // Kafka answers a connection's requests in order) without holding one of
  // the few ordered-work threads every connection shares.
  const auto& in = req->body<ListOffsetsRequest>();
  const bool by_time = std::any_of(in.topics.begin(), in.topics.end(), [](const auto& t) {
    return std::any_of(t.partitions.begin(), t.partitions.end(), [](const auto& p) { return p.timestamp >= 0; });
  });
  if (!by_time) return ListOffsetsNow(req);
  std::shared_ptr<SuspendedWork> suspended = req->reply->SuspendInOrder();
  req->reply->Post([this, req, suspended] {
    if (req->reply->closed()) {
      // The client left: no lookups for it. The empty answer goes nowhere;
      // it ends the exchange (as a fetch's does).
      Send(req, ListOffsetsResponse{}, EncodeListOffsetsResponse);
    } else {
      ListOffsetsNow(req);
    }
    suspended->Resume(nullptr);
  });
}

void Broker::ListOffsetsNow(const std::shared_ptr<Request>& req) {
  auto& in = req->body<ListOffsetsRequest>();
  ListOffsetsResponse resp;
  // Kafka answers a partition named twice INVALID_REQUEST (v1 and later),
  // every time it is named, and looks none of them up. So does weir for v0
  // (where Kafka answers one of them): each would be a lookup by time.
  std::set<std::pair<std::string_view, int32_t>> seen, twice;
  for (const auto& t : in.topics) {
    for (const auto& p : t.partitions) {
      if (!seen.emplace(t.name, p.partition_index).second) twice.emplace(t.name, p.partition_index);
    }
  }
  for (auto& t : in.topics) {
    ListOffsetsTopicResponse tr;
    tr.name = t.name;
    for (auto& p : t.partitions) {
      ListOffsetsPartitionResponse pr;
      pr.partition_index = p.partition_index;
      if (twice.count({t.name, p.partition_index}) != 0) {
        pr.error_code = ErrorCode::kInvalidRequest;
        tr.partitions.push_back(std::move(pr));
        continue;
      }
      std::string stream = metastore::BucketStreamName(t.name, static_cast<uint32_t>(std::max(p.partition_index, 0)));
      auto offs = p.partition_index < 0 ? Result<log::BatchReadResult>(NotFound("partition"))
                                        : engine_->Offsets(options_.basin, stream);
      if (!offs.ok()) {
        pr.error_code = PartitionReadError(offs.status());
        tr.partitions.push_back(std::move(pr));
        continue;
      }
      int64_t offset = -1, timestamp = -1;
      if (p.timestamp == kListOffsetsLatest) {
        offset = static_cast<int64_t>(offs->tail);
      } else if (p.timestamp == kListOffsetsEarliest) {
        offset = static_cast<int64_t>(offs->log_start);
      } else if (p.timestamp < 0) {
        pr.error_code = ErrorCode::kInvalidRequest;
      } else {
        auto r = engine_->Read(options_.basin, stream,
                               log::ReadStart{log::ReadStart::kTimestamp, static_cast<uint64_t>(p.timestamp)}, 1,
                               1 << 20);
        if (!r.ok()) {
          pr.error_code = PartitionReadError(r.status());
        } else if (!r->records.empty()) {
          offset = static_cast<int64_t>(r->records[0].offset);
          timestamp = r->records[0].record.timestamp;
        }
      }
      if (req->version() == 0) {
        if (offset >= 0 && p.max_num_offsets > 0) pr.old_style_offsets.push_back(offset);
      } else {
        pr.offset = offset;
        pr.timestamp = timestamp;
      }
      tr.partitions.push_back(std::move(pr));
    }
    resp.topics.push_back(std::move(tr));
  }
  Send(req, resp, EncodeListOffsetsResponse);
}

// ---- Metadata -----------------------------------------------------------------

void Broker::Metadata(const std::shared_ptr<Request>& req) {
  auto& in = req->body<MetadataRequest>();
  MetadataResponse resp;
  resp.brokers.push_back(MetadataResponseBroker{options_.node_id, options_.advertised_host, options_.advertised_port,
                                                std::nullopt});
  resp.cluster_id = options_.cluster_id;
  resp.controller_id = options_.node_id;
  auto describe = [&](const std::string& name, ErrorCode err, uint32_t partitions) {
    MetadataResponseTopic t;
    t.name = name;
    t.error_code = err;
    for (uint32_t p = 0; p < partitions; ++p) {
      MetadataResponsePartition mp;
      mp.partition_index = static_cast<int32_t>(p);
      mp.leader_id = options_.node_id;
      mp.replica_nodes = {options_.node_id};
      mp.isr_nodes = {options_.node_id};
      t.partitions.push_back(std::move(mp));
    }
    resp.topics.push_back(std::move(t));
  };
  bool all = !in.topics || (req->version() == 0 && in.topics->empty());
  if (all) {
    std::string after;
    for (;;) {
      auto page = engine_->ListTables(options_.basin, "", after, 1000);
      if (!page.ok()) {
        // Metadata has no top-level error: a partial list would read as the
        // truth (a pattern subscription would drop its topics). Clients retry
        // a closed connection.
        Log().warn("kafka: listing topics: {}; closing the connection", page.status().ToString());
        return req->reply->Close();
      }
      for (auto& t : *page) {
        if (t.kind == "log") describe(t.name, ErrorCode::kNone, t.bucket_count);
      }
      if (page->size() < 1000) break;
      after = page->back().name;
    }
  } else {
    // Auto-creation: on by the broker's setting, and (v4+) if the client allows it.
    bool create = options_.auto_create_partitions > 0 && in.allow_auto_topic_creation;
    std::set<std::string_view> seen;  // as Kafka, a topic named twice is described once
    for (auto& t : *in.topics) {
      if (!seen.insert(t.name).second) continue;
      if (!ValidateTopicName(t.name).ok()) {
        describe(t.name, ErrorCode::kInvalidTopicException, 0);
        continue;
      }
      auto n = TopicPartitions(t.name, create ? options_.auto_create_partitions : 0);
      if (n.ok()) {
        describe(t.name, ErrorCode::kNone, *n);
      } else if (n.status().code() == Code::kNotFound || n.status().code() == Code::kQuotaExhausted) {
        // Past --max-streams the topic stays missing (clients retry; a
        // CreateTopics says why).
        describe(t.name, ErrorCode::kUnknownTopicOrPartition, 0);
      } else if (n.status().code() == Code::kInvalidArgument) {  // a name colliding with a topic's
        describe(t.name, ErrorCode::kInvalidTopicException, 0);
      } else {
        Log().warn("kafka: metadata of topic {}: {}", t.name, n.status().ToString());
        describe(t.name, ErrorCode::kLeaderNotAvailable, 0);
      }
    }
  }
  Send(req, resp, EncodeMetadataResponse);
}

// ---- Admin --------------------------------------------------------------------

void Broker::ApiVersions(const std::shared_ptr<Request>& req) {
  Send(req, SupportedApiVersions(), EncodeApiVersionsResponse);
}

void Broker::FindCoordinator(const std::shared_ptr<Request>& req) {
  auto& in = req->body<FindCoordinatorRequest>();
  FindCoordinatorResponse resp;
  if (in.key_type == kCoordinatorKeyTransaction) {
    resp.error_code = ErrorCode::kTransactionalIdAuthorizationFailed;
    resp.error_message = "weir does not support Kafka transactions";
  } else if (in.key_type != kCoordinatorKeyGroup) {
    resp.error_code = ErrorCode::kInvalidRequest;  // as Kafka: no such coordinator type
    resp.error_message = fmt::format("unknown coordinator key type {}", in.key_type);
  } else {
    // Any group id, the empty one included, has this node as coordinator
    // (Kafka checks the id only where a group is joined).
    resp.node_id = options_.node_id;
    resp.host = options_.advertised_host;
    resp.port = options_.advertised_port;
  }
  if (resp.error_code != ErrorCode::kNone) resp.node_id = -1, resp.port = -1;
  Send(req, resp, EncodeFindCoordinatorResponse);
}

void Broker::InitProducerId(const std::shared_ptr<Request>& req) {
  auto& in = req->body<InitProducerIdRequest>();
  InitProducerIdResponse resp;
  if (in.transactional_id) {
    resp.error_code = ErrorCode::kTransactionalIdAuthorizationFailed;
  } else {
    auto id = engine_->AllocateProducerId();
    if (!id.ok()) {
      // Every client retries "loading" in place; the Java producer takes
      // COORDINATOR_NOT_AVAILABLE as "find the transaction coordinator",
      // which an idempotent producer (no transactional id) cannot do.
      Log().warn("kafka: allocating a producer id: {}", id.status().ToString());
      resp.error_code = ErrorCode::kCoordinatorLoadInProgress;
    } else if (*id > static_cast<uint64_t>(INT64_MAX)) {
      Log().error("kafka: producer ids are exhausted (the allocator is at {})", *id);
      resp.error_code = ErrorCode::kUnknownServerError;
    } else {
      resp.producer_id = static_cast<int64_t>(*id);
      resp.producer_epoch = 0;
    }
  }
  Send(req, resp, EncodeInitProducerIdResponse);
}

void Broker::DropStaleLimits() {
  const uint64_t now = engine_->TablesVersion();
  if (now == limits_tables_version_) return;
  max_message_bytes_.clear();
  limits_tables_version_ = now;
}

std::optional<size_t> Broker::KeptMaxMessageBytes(const std::string& topic) {
  std::lock_guard lk(limits_mu_);
  DropStaleLimits();
  auto it = max_message_bytes_.find(topic);
  if (it == max_message_bytes_.end()) return std::nullopt;
  return it->second;
}

size_t Broker::MaxMessageBytesOf(const std::string& table_config) const {
  size_t limit = options_.max_batch_bytes;
  auto config = nlohmann::json::parse(table_config, nullptr, /*allow_exceptions=*/false);
  if (config.is_object()) {
    auto it = config.find("max.message.bytes");
    if (it != config.end() && it->is_string()) {
      unsigned long long v = std::strtoull(it->get<std::string>().c_str(), nullptr, 10);
      limit = std::min<size_t>(v, options_.max_batch_bytes);  // CreateTopics checked the range
    }
  }
  return limit;
}

Result<size_t> Broker::MaxMessageBytes(const std::string& topic) {
  // Read before the catalog: a table change after it keeps the answer out of
  // the map (it may be stale), one before it is in what the catalog gives.
  const uint64_t version = engine_->TablesVersion();
  {
    std::lock_guard lk(limits_mu_);
    DropStaleLimits();
    if (auto it = max_message_bytes_.find(topic); it != max_message_bytes_.end()) return it->second;
  }
  // One metastore read per topic, then memory. A missing topic gets the
  // default (auto-creation gives it no other); the map is cleared if names
  // pile up. A catalog that could not be read says nothing: no limit is
  // assumed, and none is remembered.
  auto table = engine_->GetTable(options_.basin, topic);
  if (!table.ok() && table.status().code() != Code::kNotFound) return table.status();
  const size_t limit = MaxMessageBytesOf(table.ok() ? table->config : "{}");
  std::lock_guard lk(limits_mu_);
  DropStaleLimits();
  if (version != limits_tables_version_) return limit;
  if (max_message_bytes_.size() >= 10000) max_message_bytes_.clear();
  max_message_bytes_[topic] = limit;
  return limit;
}

namespace {

// Kafka's topic-level config names (TopicConfig and the replication quotas):
// any other name is INVALID_CONFIG, as on a Kafka broker.
bool KnownTopicConfig(const std::string& name) {
  static const std::set<std::string, std::less<>> kNames = {
      "cleanup.policy", "compression.gzip.level", "compression.lz4.level", "compression.type",
      "compression.zstd.level", "delete.retention.ms", "file.delete.delay.ms", "flush.messages", "flush.ms",
      "follower.replication.throttled.replicas", "index.interval.bytes", "leader.replication.throttled.replicas",
      "local.retention.bytes", "local.retention.ms", "max.compaction.lag.ms", "max.message.bytes",
      "message.downconversion.enable", "message.format.version", "message.timestamp.after.max.ms",
      "message.timestamp.before.max.ms", "message.timestamp.difference.max.ms", "message.timestamp.type",
      "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "min.insync.replicas", "preallocate",
      "remote.log.copy.disable", "remote.log.delete.on.disable", "remote.storage.enable", "retention.bytes",
      "retention.ms", "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
      "unclean.leader.election.enable"};
  return kNames.count(name) != 0;
}

// Kafka topic configs weir applies to the partition streams or checks at
// produce time (max.message.bytes, up to `max_batch_bytes`); every other
// known config is kept in the catalog entry and has no effect (replication
// and segment settings belong to the object store and the WAL here).
// A config's integer as Kafka reads a Long config: surrounding whitespace
// trimmed, then decimal digits after an optional sign, within int64.
std::string_view TrimSpaces(std::string_view text);

std::optional<int64_t> ConfigInteger(std::string_view text) {
  text = TrimSpaces(text);
  if (text.size() > 1 && text.front() == '+' && text[1] != '-') text.remove_prefix(1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::string_view TrimSpaces(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

std::vector<std::string> SplitList(std::string_view value);

// A known config's value as Kafka's ConfigDef would take it (its type and
// range), whether or not weir applies it: Kafka refuses "abc" for
// segment.bytes with INVALID_CONFIG, so is it here.
Status CheckTopicConfigValue(const std::string& name, const std::string& value) {
  struct Integer {
    const char* name;
    int64_t min;
    int64_t max;
  };
  static constexpr int64_t kInt = INT32_MAX, kLong = INT64_MAX;
  static constexpr Integer kIntegers[] = {
      {"compression.gzip.level", -1, 9},      {"compression.lz4.level", 1, 17},
      {"compression.zstd.level", -131072, 22}, {"delete.retention.ms", 0, kLong},
      {"file.delete.delay.ms", 0, kLong},     {"flush.messages", 1, kLong},
      {"flush.ms", 0, kLong},                 {"index.interval.bytes", 0, kInt},
      {"local.retention.bytes", -2, kLong},   {"local.retention.ms", -2, kLong},
      {"max.compaction.lag.ms", 1, kLong},    {"message.timestamp.after.max.ms", 0, kLong},
      {"message.timestamp.before.max.ms", 0, kLong}, {"message.timestamp.difference.max.ms", 0, kLong},
      {"min.compaction.lag.ms", 0, kLong},    {"min.insync.replicas", 1, kInt},
      {"retention.bytes", INT64_MIN, kLong},  {"segment.bytes", 14, kInt},
      {"segment.index.bytes", 4, kInt},       {"segment.jitter.ms", 0, kLong},
      {"segment.ms", 1, kLong}};
  for (const Integer& i : kIntegers) {
    if (name != i.name) continue;
    auto v = ConfigInteger(value);
    if (!v || *v < i.min || *v > i.max) {
      return InvalidArgument("invalid value {} for configuration {}: an integer from {} to {}", value, name, i.min,
                             i.max);
    }
    if (name == "compression.gzip.level" && *v == 0) {  // as Kafka: -1 (the default) or 1 to 9
      return InvalidArgument("invalid value {} for configuration {}: -1 or an integer from 1 to 9", value, name);
    }
    return Status::Ok();
  }
  static const std::set<std::string, std::less<>> kBooleans = {
      "message.downconversion.enable", "preallocate", "remote.log.copy.disable", "remote.log.delete.on.disable",
      "remote.storage.enable", "unclean.leader.election.enable"};
  std::string lower;
  for (char c : value) {
    if (!std::isspace(static_cast<unsigned char>(c))) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (kBooleans.count(name) != 0 && lower != "true" && lower != "false") {
    return InvalidArgument("invalid value {} for configuration {}: true or false", value, name);
  }
  if (name == "compression.type") {
    static const std::set<std::string, std::less<>> kTypes = {"uncompressed", "zstd", "lz4", "snappy", "gzip",
                                                              "producer"};
    if (kTypes.count(lower) == 0) {
      return InvalidArgument("invalid value {} for configuration compression.type: one of uncompressed, zstd, lz4, "
                             "snappy, gzip, producer",
                             value);
    }
  }
  if (name == "min.cleanable.dirty.ratio") {
    char* end = nullptr;
    const std::string trimmed = lower;
    const double d = std::strtod(trimmed.c_str(), &end);
    if (trimmed.empty() || end != trimmed.c_str() + trimmed.size() || !(d >= 0 && d <= 1)) {
      return InvalidArgument("invalid value {} for configuration min.cleanable.dirty.ratio: from 0 to 1", value);
    }
  }
  return Status::Ok();
}

// `check_value`: false for a stored value carried over unchanged (stored
// before its value was checked, it must not block changes to other configs).
Status ApplyTopicConfig(const std::string& name, const std::optional<std::string>& value,
                        metastore::StreamConfig* cfg, size_t max_batch_bytes, bool check_value = true) {
  if (!KnownTopicConfig(name)) return InvalidArgument("unknown topic config {}", name);
  if (!value) return Status::Ok();
  if (check_value) WEIR_RETURN_IF_ERROR(CheckTopicConfigValue(name, *value));
  if (name == "max.message.bytes") {
    auto v = ConfigInteger(*value);
    if (!v || *v < 0 || static_cast<uint64_t>(*v) > max_batch_bytes) {
      return InvalidArgument("max.message.bytes must be 0 to {} on this server", max_batch_bytes);
    }
  } else if (name == "retention.ms") {
    auto ms = ConfigInteger(*value);
    if (!ms || *ms < -1) return InvalidArgument("retention.ms must be -1 or a number of ms up to {}", INT64_MAX);
    cfg->retention_age_s = *ms == -1 ? 0 : std::max<int64_t>(1, *ms / 1000);
  } else if (name == "message.timestamp.type") {
    // Kafka's ConfigDef trims a string config's value.
    const std::string_view type = TrimSpaces(*value);
    if (type == "CreateTime") {
      cfg->timestamping = metastore::TimestampingMode::kClientPrefer;
      cfg->uncapped_timestamps = true;
    } else if (type == "LogAppendTime") {
      cfg->timestamping = metastore::TimestampingMode::kArrival;
    } else {
      return InvalidArgument("message.timestamp.type must be CreateTime or LogAppendTime");
    }
  } else if (name == "cleanup.policy") {
    // A list config: its items trimmed.
    const std::vector<std::string> items = SplitList(*value);
    if (items.empty() || std::any_of(items.begin(), items.end(), [](const std::string& i) { return i != "delete"; })) {
      return InvalidArgument("cleanup.policy {} is not supported (only delete)", *value);
    }
  }
  return Status::Ok();
}

// retention.ms as DescribeConfigs shows it: as it was set (the streams keep
// whole seconds), unless the partitions' retention was changed otherwise.
std::string RetentionMsOf(const nlohmann::json& stored, int64_t retention_age_s, int64_t age) {
  auto it = stored.find("retention.ms");
  if (it != stored.end() && it->is_string()) {
    if (auto ms = ConfigInteger(it->get<std::string>())) {
      const int64_t as_age = *ms == -1 ? 0 : std::max<int64_t>(1, *ms / 1000);
      if (as_age == retention_age_s) return std::to_string(*ms);
    }
  }
  return age == 0 ? "-1" : std::to_string(age * 1000);
}

// The items of a comma-separated list config value, trimmed, without empty ones.
std::vector<std::string> SplitList(std::string_view value) {
  std::vector<std::string> items;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view item = TrimSpaces(value.substr(0, comma));
    if (!item.empty()) items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return items;
}

}  // namespace

void Broker::CreateTopics(const std::shared_ptr<Request>& req) {
  auto& in = req->body<CreateTopicsRequest>();
  CreateTopicsResponse resp;
  std::map<std::string, int> seen;
  for (auto& t : in.topics) seen[t.name]++;
  size_t validated = 0;  // partitions the request's earlier topics would make (validate_only)
  for (auto& t : in.topics) {
    CreatableTopicResult r;
    r.name = t.name;
    auto fail = [&](ErrorCode code, std::string message) {
      r.error_code = code;
      r.error_message = std::move(message);
    };
    int32_t partitions = t.num_partitions == -1 ? options_.default_partitions : t.num_partitions;
    metastore::StreamConfig cfg = metastore::LogTableStreamConfig();  // Kafka keeps producer timestamps as sent
    nlohmann::json config = nlohmann::json::object();
    Status valid = ValidateTopicName(t.name);
    if (seen[t.name] > 1) {
      fail(ErrorCode::kInvalidRequest, "the topic is named more than once in the request");
    } else if (!valid.ok()) {
      fail(ErrorCode::kInvalidTopicException, valid.message());
    } else if (partitions < 1 || partitions > options_.max_partitions) {
      fail(ErrorCode::kInvalidPartitions, fmt::format("partitions must be 1 to {}", options_.max_partitions));
    } else if (t.replication_factor == 0 || t.replication_factor < -1) {
      fail(ErrorCode::kInvalidReplicationFactor, "replication factor must be -1 or at least 1");
    } else if (!t.assignments.empty()) {
      fail(ErrorCode::kInvalidReplicaAssignment, "weir places partitions itself; manual assignments are not supported");
    } else {
      for (auto& c : t.configs) {
        // As Kafka: a topic's configs are created with values.
        Status st = c.value ? ApplyTopicConfig(c.name, c.value, &cfg, options_.max_batch_bytes)
                            : InvalidArgument("a null value is not supported for topic config {}", c.name);
        if (!st.ok()) {
          fail(ErrorCode::kInvalidConfig, st.message());
          break;
        }
        config[c.name] = c.value ? nlohmann::json(*c.value) : nlohmann::json(nullptr);
      }
    }
    if (r.error_code == ErrorCode::kNone && !in.validate_only) {
      std::lock_guard lk(create_mu_);
      Status st = CreateTopic(t.name, partitions, config.dump(), cfg);
      if (st.code() == Code::kAlreadyExists) {
        fail(ErrorCode::kTopicAlreadyExists, fmt::format("topic '{}' already exists", t.name));
      } else if (st.code() == Code::kInvalidArgument) {  // partitions and name were checked: a collision
        fail(ErrorCode::kInvalidTopicException, st.message());
      } else if (!st.ok()) {
        fail(AdminFailure(st), st.code() == Code::kQuotaExhausted ? st.message() : st.ToString());
      }
    } else if (r.error_code == ErrorCode::kNone && engine_->GetTable(options_.basin, t.name).ok()) {
      fail(ErrorCode::kTopicAlreadyExists, fmt::format("topic '{}' already exists", t.name));
    } else if (r.error_code == ErrorCode::kNone) {
      if (Status c = CheckTopicCollision(t.name); c.code() == Code::kInvalidArgument) {
        fail(ErrorCode::kInvalidTopicException, c.message());
      } else if (Status room = engine_->CheckStreamRoom(
                     validated + static_cast<size_t>(partitions),
                     "topic " + t.name + (validated > 0 ? " and the request's topics before it" : ""));
                 !room.ok()) {
        fail(AdminFailure(room), room.message());
      } else {
        validated += static_cast<size_t>(partitions);
      }
    }
    resp.topics.push_back(std::move(r));
  }
  Send(req, resp, EncodeCreateTopicsResponse);
}

// ---- CreatePartitions ---------------------------------------------------------
// A topic's new partitions are new bucket streams of its table, created in one
// metastore transaction with the config of partition 0's stream; they start
// empty. Partitions can only be added, as in Kafka.

// Runs on a worker thread (metastore writes).
void Broker::CreatePartitions(const std::shared_ptr<Request>& req) {
  auto& in = req->body<CreatePartitionsRequest>();
  CreatePartitionsResponse resp;
  std::map<std::string, int> seen;
  for (auto& t : in.topics) seen[t.name]++;
  size_t validated = 0;  // partitions the request's earlier topics would add (validate_only)
  for (auto& t : in.topics) {
    CreatePartitionsTopicResult r;
    r.name = t.name;
    auto fail = [&](ErrorCode code, std::string message) {
      r.error_code = code;
      r.error_message = std::move(message);
    };
    std::lock_guard lk(create_mu_);
    auto table = engine_->GetTable(options_.basin, t.name);
    if (seen[t.name] > 1) {
      fail(ErrorCode::kInvalidRequest, "the topic is named more than once in the request");
    } else if (!table.ok()) {
      if (table.status().code() == Code::kNotFound) {
        fail(ErrorCode::kUnknownTopicOrPartition, fmt::format("topic {} does not exist", t.name));
      } else {
        fail(AdminFailure(table.status()), table.status().ToString());
      }
    } else if (t.count < 0 || static_cast<uint32_t>(t.count) < table->bucket_count) {
      fail(ErrorCode::kInvalidPartitions, fmt::format("topic {} has {} partitions, more than the {} asked for; "
                                                      "partitions cannot be removed",
                                                      t.name, table->bucket_count, t.count));
    } else if (static_cast<uint32_t>(t.count) == table->bucket_count) {
      fail(ErrorCode::kInvalidPartitions, fmt::format("topic {} already has {} partitions", t.name, t.count));
    } else if (t.count > options_.max_partitions) {
      fail(ErrorCode::kInvalidPartitions, fmt::format("a topic has at most {} partitions", options_.max_partitions));
    } else if (t.assignments) {
      fail(ErrorCode::kInvalidReplicaAssignment, "weir places partitions itself; manual assignments are not supported");
    } else if (in.validate_only) {
      const uint32_t more = static_cast<uint32_t>(t.count) - table->bucket_count;
      if (Status room = engine_->CheckStreamRoom(
              validated + more, fmt::format("{} more partitions of topic {}{}", more, t.name,
                                            validated > 0 ? " and the request's topics before it" : ""));
          !room.ok()) {
        fail(AdminFailure(room), room.message());
      } else {
        validated += more;
      }
    } else {
      auto grown = engine_->AddTableBuckets(options_.basin, t.name, static_cast<uint32_t>(t.count));
      if (!grown.ok()) {
        if (grown.status().code() != Code::kQuotaExhausted) {
          Log().warn("kafka: adding partitions to topic {}: {}", t.name, grown.status().ToString());
        }
        fail(grown.status().code() == Code::kInvalidArgument ? ErrorCode::kInvalidPartitions
                                                              : AdminFailure(grown.status()),
             grown.status().message());
      } else {
        Log().info("kafka: topic {} now has {} partitions", t.name, t.count);
      }
    }
    resp.results.push_back(std::move(r));
  }
  Send(req, resp, EncodeCreatePartitionsResponse);
}

// ---- DeleteRecords ------------------------------------------------------------
// Moves a partition's log start offset up: the partition stream's trim point,
// stored in the metastore before the answer, with no record added to the log
// (Engine::TrimTo). Offset -1 means the high watermark; past it is
// OFFSET_OUT_OF_RANGE, as on Kafka.

// Runs on a worker thread (metastore writes).
void Broker::DeleteRecords(const std::shared_ptr<Request>& req) {
  auto& in = req->body<DeleteRecordsRequest>();
  DeleteRecordsResponse resp;
  for (auto& t : in.topics) {
    DeleteRecordsTopicResult tr;
    tr.name = t.name;
    auto table = engine_->GetTable(options_.basin, t.name);
    for (auto& p : t.partitions) {
      DeleteRecordsPartitionResult pr;
      pr.partition_index = p.partition_index;
      pr.low_watermark = -1;
      if (!table.ok() && table.status().code() != Code::kNotFound) {
        pr.error_code = AdminFailure(table.status());
      } else if (!table.ok() || p.partition_index < 0 ||
                 static_cast<uint32_t>(p.partition_index) >= table->bucket_count) {
        pr.error_code = ErrorCode::kUnknownTopicOrPartition;
      } else if (p.offset < -1) {
        pr.error_code = ErrorCode::kOffsetOutOfRange;
      } else {
        const std::string stream = metastore::BucketStreamName(t.name, static_cast<uint32_t>(p.partition_index));
        Result<uint64_t> low = OutOfRange("unset");
        if (p.offset == -1) {
          auto offs = engine_->Offsets(options_.basin, stream);
          low = offs.ok() ? engine_->TrimTo(options_.basin, stream, offs->tail) : Result<uint64_t>(offs.status());
        } else {
          low = engine_->TrimTo(options_.basin, stream, static_cast<uint64_t>(p.offset));
        }
        if (low.ok()) {
          pr.low_watermark = static_cast<int64_t>(*low);
          Log().info("kafka: records of {}-{} below {} deleted", t.name, p.partition_index, *low);
        } else {
          if (low.status().code() != Code::kOutOfRange && low.status().code() != Code::kNotFound &&
              low.status().code() != Code::kFenced) {
            Log().warn("kafka: deleting records of {}-{}: {}", t.name, p.partition_index, low.status().ToString());
          }
          pr.error_code = PartitionReadError(low.status());
        }
      }
      tr.partitions.push_back(pr);
    }
    resp.topics.push_back(std::move(tr));
  }
  Send(req, resp, EncodeDeleteRecordsResponse);
}

// ---- AlterConfigs -------------------------------------------------------------
// Replaces a topic's configs with the given set, as Kafka's (non-incremental)
// AlterConfigs does: a config it leaves out goes back to its default. The
// values weir applies (retention.ms, message.timestamp.type) change every
// partition stream's config, in the same metastore transaction that stores
// the set in the topic's catalog entry. Broker configs come from the flags of
// `weir serve` and are not changed here.

// Runs on a worker thread (metastore writes).
void Broker::AlterConfigs(const std::shared_ptr<Request>& req) {
  auto& in = req->body<AlterConfigsRequest>();
  auto resp = AlterEachTopic(in.resources, [&](const AlterConfigsResource& res, const metastore::TableInfo&,
                                               AlterConfigsResult* out) {
    ReplaceTopicConfigs(res.resource_name, res.configs, in.validate_only, out);
  });
  Send(req, resp, EncodeAlterConfigsResponse);
}

template <typename Resource, typename Apply>
AlterConfigsResponse Broker::AlterEachTopic(const std::vector<Resource>& resources, Apply&& apply) {
  AlterConfigsResponse resp;
  std::map<std::pair<int8_t, std::string>, int> seen;
  for (auto& res : resources) seen[{res.resource_type, res.resource_name}]++;
  for (auto& res : resources) {
    AlterConfigsResult out;
    out.resource_type = res.resource_type;
    out.resource_name = res.resource_name;
    if (CheckConfigResource(res.resource_type, seen[{res.resource_type, res.resource_name}], &out)) {
      std::lock_guard lk(create_mu_);
      auto table = engine_->GetTable(options_.basin, res.resource_name);
      if (table.ok()) {
        apply(res, *table, &out);
      } else {
        const bool missing = table.status().code() == Code::kNotFound;
        out.error_code = missing ? ErrorCode::kUnknownTopicOrPartition : AdminFailure(table.status());
        out.error_message =
            missing ? fmt::format("topic {} does not exist", res.resource_name) : table.status().ToString();
      }
    }
    resp.responses.push_back(std::move(out));
  }
  return resp;
}

bool Broker::CheckConfigResource(int8_t resource_type, int times_named, AlterConfigsResult* out) {
  if (times_named > 1) {
    out->error_code = ErrorCode::kInvalidRequest;
    out->error_message = "the resource is named more than once in the request";
  } else if (resource_type == kConfigResourceBroker) {
    out->error_code = ErrorCode::kInvalidConfig;
    out->error_message = "broker configs are set by the flags of weir serve and cannot be changed here";
  } else if (resource_type != kConfigResourceTopic) {
    out->error_code = ErrorCode::kInvalidRequest;
    out->error_message =
        fmt::format("config resource type {} is not supported (2: topic, 4: broker)", static_cast<int>(resource_type));
  }
  return out->error_code == ErrorCode::kNone;
}

void Broker::ReplaceTopicConfigs(const std::string& topic, const std::vector<AlterConfigsEntry>& set,
                                 bool validate_only, AlterConfigsResult* out, const std::set<std::string>* named) {
  metastore::StreamConfig cfg = metastore::LogTableStreamConfig();  // as CreateTopics starts from
  nlohmann::json config = nlohmann::json::object();
  std::set<std::string> seen;
  for (const auto& c : set) {
    const bool carried_over = named != nullptr && named->count(c.name) == 0;
    Status st = !seen.insert(c.name).second
                    ? InvalidArgument("config {} is named more than once", c.name)
                    : ApplyTopicConfig(c.name, c.value, &cfg, options_.max_batch_bytes, !carried_over);
    if (!st.ok()) {
      out->error_code = ErrorCode::kInvalidConfig;
      out->error_message = st.message();
      return;
    }
    if (c.value) config[c.name] = *c.value;  // a null value leaves the config at its default, as on Kafka
  }
  if (validate_only) return;
  Status st = engine_->ReconfigureTable(options_.basin, topic, config.dump(), [&](const metastore::StreamConfig& old) {
    metastore::StreamConfig next = old;
    auto changes = [&](const char* name) { return named == nullptr || named->count(name) != 0; };
    if (changes("retention.ms")) next.retention_age_s = cfg.retention_age_s;
    if (changes("message.timestamp.type")) {
      next.timestamping = cfg.timestamping;
      next.uncapped_timestamps = cfg.uncapped_timestamps;
    }
    return next;
  });
  if (!st.ok()) {
    Log().warn("kafka: altering the configs of topic {}: {}", topic, st.ToString());
    out->error_code = AdminFailure(st);
    out->error_message = st.message();
  } else {
    Log().info("kafka: topic {} configs now {}", topic, config.dump());
  }
}

// ---- IncrementalAlterConfigs --------------------------------------------------
// Changes a topic's stored config set by the operations given (SET, DELETE,
// and APPEND/SUBTRACT for the list config cleanup.policy), then applies the
// resulting set as AlterConfigs does.

// Runs on a worker thread (metastore writes).
void Broker::IncrementalAlterConfigs(const std::shared_ptr<Request>& req) {
  auto& in = req->body<IncrementalAlterConfigsRequest>();
  auto resp = AlterEachTopic(in.resources, [&](const IncrementalAlterConfigsResource& res,
                                               const metastore::TableInfo& table, AlterConfigsResult* out) {
    auto fail = [&](ErrorCode code, std::string message) {
      out->error_code = code;
      out->error_message = std::move(message);
    };
    // The current set: the values stored with the topic (nulls are unset).
    std::map<std::string, std::string> current;
    auto stored = nlohmann::json::parse(table.config, nullptr, /*allow_exceptions=*/false);
    if (stored.is_object()) {
      for (auto& [name, value] : stored.items()) {
        if (value.is_string()) current[name] = value.get<std::string>();
      }
    }
    // As Kafka: only a DELETE may leave the value null.
    std::string null_updates;
    for (const auto& c : res.configs) {
      if (c.op != kConfigOpDelete && !c.value) null_updates += (null_updates.empty() ? "" : ", ") + c.name;
    }
    if (!null_updates.empty()) {
      return fail(ErrorCode::kInvalidRequest, fmt::format("a null value is not supported for: {}", null_updates));
    }
    std::set<std::string> named;
    for (const auto& c : res.configs) {
      if (!named.insert(c.name).second) {
        return fail(ErrorCode::kInvalidRequest, fmt::format("config {} is named more than once", c.name));
      }
      if (c.op == kConfigOpSet) {
        current[c.name] = *c.value;
      } else if (c.op == kConfigOpDelete) {
        current.erase(c.name);
      } else if (c.op == kConfigOpAppend || c.op == kConfigOpSubtract) {
        if (c.name != "cleanup.policy") {
          return fail(ErrorCode::kInvalidConfig,
                      fmt::format("{} is not a list config: it cannot be appended to or subtracted from", c.name));
        }
        // A comma-separated list; its default is "delete".
        auto it = current.find(c.name);
        std::vector<std::string> items = SplitList(it != current.end() ? it->second : "delete");
        for (const std::string& item : SplitList(*c.value)) {
          auto at = std::find(items.begin(), items.end(), item);
          if (c.op == kConfigOpAppend && at == items.end()) items.push_back(item);
          if (c.op == kConfigOpSubtract && at != items.end()) items.erase(at);
        }
        std::string joined;
        for (const std::string& item : items) joined += (joined.empty() ? "" : ",") + item;
        current[c.name] = joined;
      } else {
        return fail(ErrorCode::kInvalidRequest, fmt::format("unknown config operation {}", static_cast<int>(c.op)));
      }
    }
    std::vector<AlterConfigsEntry> set;
    for (auto& [name, value] : current) set.push_back(AlterConfigsEntry{name, value});
    ReplaceTopicConfigs(res.resource_name, set, in.validate_only, out, &named);
  });
  Send(req, resp, EncodeAlterConfigsResponse);
}

// ---- DescribeConfigs ----------------------------------------------------------
// Topic configs as they act: the values weir applies (retention.ms and
// message.timestamp.type from the partition streams' config, the produce size
// limit) and every other config the topic was created with or last altered
// to, as stored. Topic entries can be changed with AlterConfigs; broker
// entries are read-only.

namespace {

struct ConfigValue {
  std::string name;
  std::optional<std::string> value;
  int8_t source = kConfigSourceDefault;
};

std::string Ms(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

}  // namespace

// Runs on a worker thread (metastore reads).
void Broker::DescribeConfigs(const std::shared_ptr<Request>& req) {
  auto& in = req->body<DescribeConfigsRequest>();
  const int16_t version = req->version();
  DescribeConfigsResponse resp;
  for (const DescribeConfigsResource& res : in.resources) {
    DescribeConfigsResult out;
    out.resource_type = res.resource_type;
    out.resource_name = res.resource_name;
    std::vector<ConfigValue> values;
    if (res.resource_type == kConfigResourceTopic) {
      auto table = engine_->GetTable(options_.basin, res.resource_name);
      if (!table.ok()) {
        const bool missing = table.status().code() == Code::kNotFound;
        out.error_code = missing ? ErrorCode::kUnknownTopicOrPartition : AdminFailure(table.status());
        out.error_message = missing ? fmt::format("topic {} does not exist", res.resource_name)
                                    : table.status().ToString();
        resp.results.push_back(std::move(out));
        continue;
      }
      auto stored = nlohmann::json::parse(table->config, nullptr, /*allow_exceptions=*/false);
      if (!stored.is_object()) stored = nlohmann::json::object();
      // The partitions' stream config (partition 0 stands for all: they are
      // created alike, and the REST API changes them one by one).
      auto stream = engine_->GetStream(options_.basin, metastore::BucketStreamName(res.resource_name, 0));
      if (!stream.ok()) {
        out.error_code = AdminFailure(stream.status());
        out.error_message = stream.status().ToString();
        resp.results.push_back(std::move(out));
        continue;
      }
      const metastore::StreamConfig& cfg = stream->info.config;
      // Set at creation (with a value), or changed since: not the default.
      auto source = [&](const char* name, bool changed = false) {
        auto it = stored.find(name);
        return changed || (it != stored.end() && it->is_string()) ? kConfigSourceDynamicTopic : kConfigSourceDefault;
      };
      const metastore::StreamConfig defaults;
      const int64_t age = std::min<int64_t>(cfg.retention_age_s, INT64_MAX / 1000);
      const bool log_append_time = cfg.timestamping == metastore::TimestampingMode::kArrival;
      values = {
          {"cleanup.policy", "delete", source("cleanup.policy")},
          {"max.message.bytes", std::to_string(MaxMessageBytesOf(table->config)), source("max.message.bytes")},
          {"message.timestamp.type", log_append_time ? "LogAppendTime" : "CreateTime",
           source("message.timestamp.type", log_append_time)},
          {"retention.ms", RetentionMsOf(stored, cfg.retention_age_s, age),
           source("retention.ms", cfg.retention_age_s != defaults.retention_age_s)},
      };
      for (auto& [name, value] : stored.items()) {
        if (std::any_of(values.begin(), values.end(), [&](const ConfigValue& c) { return c.name == name; })) continue;
        const bool set = value.is_string();
        values.push_back(ConfigValue{name, set ? std::optional(value.get<std::string>()) : std::nullopt,
                                     set ? kConfigSourceDynamicTopic : kConfigSourceDefault});
      }
    } else if (res.resource_type == kConfigResourceBroker) {
      if (!res.resource_name.empty() && res.resource_name != std::to_string(options_.node_id)) {
        out.error_code = ErrorCode::kInvalidRequest;
        out.error_message = fmt::format("this is broker {}, not {}", options_.node_id, res.resource_name);
        resp.results.push_back(std::move(out));
        continue;
      }
      const int8_t b = kConfigSourceStaticBroker;
      values = {
          {"auto.create.topics.enable", options_.auto_create_partitions > 0 ? "true" : "false", b},
          {"broker.id", std::to_string(options_.node_id), b},
          {"group.max.session.timeout.ms", Ms(options_.groups.max_session_timeout), b},
          {"group.min.session.timeout.ms", Ms(options_.groups.min_session_timeout), b},
          {"message.max.bytes", std::to_string(options_.max_batch_bytes), b},
          {"num.partitions", std::to_string(options_.default_partitions), b},
          {"offsets.retention.minutes",
           std::to_string(std::chrono::duration_cast<std::chrono::minutes>(options_.offsets_retention).count()), b},
      };
    } else {
      out.error_code = ErrorCode::kInvalidRequest;
      out.error_message = fmt::format("config resource type {} is not supported (2: topic, 4: broker)",
                                      static_cast<int>(res.resource_type));
      resp.results.push_back(std::move(out));
      continue;
    }
    std::sort(values.begin(), values.end(), [](const ConfigValue& a, const ConfigValue& b) { return a.name < b.name; });
    for (ConfigValue& c : values) {
      // Null or empty: every config (as Kafka reads an empty list).
      if (res.configuration_keys && !res.configuration_keys->empty() &&
          std::find(res.configuration_keys->begin(), res.configuration_keys->end(), c.name) ==
              res.configuration_keys->end()) {
        continue;
      }
      DescribeConfigsEntry e;
      e.name = c.name;
      e.value = c.value;
      e.read_only = res.resource_type == kConfigResourceBroker;
      if (version == 0) {
        e.is_default = c.source == kConfigSourceDefault;
      } else {
        e.config_source = c.source;
        if (in.include_synonyms) e.synonyms.push_back(DescribeConfigsSynonym{c.name, c.value, c.source});
      }
      out.configs.push_back(std::move(e));
    }
    resp.results.push_back(std::move(out));
  }
  Send(req, resp, EncodeDescribeConfigsResponse);
}

void Broker::DeleteTopics(const std::shared_ptr<Request>& req) {
  auto& in = req->body<DeleteTopicsRequest>();
  DeleteTopicsResponse resp;
  for (auto& name : in.topic_names) {
    DeletableTopicResult r;
    r.name = name;
    Status st = engine_->DeleteTable(options_.basin, name);
    if (st.code() == Code::kNotFound) {
      r.error_code = ErrorCode::kUnknownTopicOrPartition;
    } else if (!st.ok()) {
      Log().warn("kafka: deleting topic {}: {}", name, st.ToString());
      // Retryable (the metastore away, or this process superseded) as such.
      r.error_code = AdminFailure(st);
    } else {
      metrics_.topics_deleted++;  // with its committed offsets (EngineOptions::group_offsets_basin)
    }
    resp.responses.push_back(std::move(r));
  }
  Send(req, resp, EncodeDeleteTopicsResponse);
}

}  // namespace weir::kafka
