// The Kafka broker: decodes request frames, runs one handler per API on the
// stream engine, and encodes the responses (DESIGN.md §8, docs/kafka.md).
// Topics are log tables of the `weir-kafka` basin; partition p of topic t is
// the stream "t/p". Produce goes through the same append path (one WAL,
// group-committed) as the REST API.
//
// Ownership and threads: the server front-end owns one Broker and hands it
// to its TcpServer. Handle runs on an I/O thread; handlers that may block
// (metastore, reads from the object store) move to a worker thread with
// Reply::Post; append completions arrive on WAL threads. One internal thread
// ticks the group coordinator.
//
// Guarantees: a produced batch is acknowledged only once durable; a request
// that cannot be decoded closes its connection and changes nothing; every
// decoded request gets exactly one response (none for acks=0).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "base/clock.h"
#include "base/keyed_mutex.h"
#include "kafka/group_coordinator.h"
#include "kafka/messages.h"
#include "kafka/tcp_server.h"
#include "log/engine.h"
#include "metastore/metastore.h"

namespace weir::kafka {

inline constexpr const char* kKafkaBasin = "weir-kafka";

struct ProduceJob;
struct ProduceRun;
struct FetchState;

struct BrokerOptions {
  int32_t node_id = 1;
  std::string advertised_host = "127.0.0.1";
  int32_t advertised_port = 9092;
  std::string cluster_id = "weir";
  std::string basin = kKafkaBasin;
  // Partitions of a topic created on first use (Metadata, Produce); 0 = no auto-creation.
  int32_t auto_create_partitions = 1;
  // Partitions of a CreateTopics request that asks for the default (-1).
  int32_t default_partitions = 1;
  int32_t max_partitions = 10000;
  // A Fetch response holds at most this many bytes whatever the client asks.
  size_t max_fetch_bytes = 64u << 20;
  size_t max_offset_metadata_bytes = 4096;  // Kafka's offset.metadata.max.bytes
  // A produced batch larger than this gets MESSAGE_TOO_LARGE (keep it equal
  // to the engine's max_batch_bytes).
  size_t max_batch_bytes = 1048588;
  GroupOptions groups;
  // Committed offsets of a group with no members whose newest commit is
  // older than this are deleted (Kafka's offsets.retention.minutes, 7 days),
  // checked every offsets_retention_check; a group that had members within
  // this (or within this of the broker's start) keeps them (groups are
  // looked at once a minute, or every check if that is more often).
  Duration offsets_retention = std::chrono::hours(7 * 24);
  Duration offsets_retention_check = std::chrono::minutes(10);
};

struct BrokerMetrics {
  std::atomic<uint64_t> requests_by_api[64] = {};
  std::atomic<uint64_t> bad_requests{0}, produce_batches{0}, produce_bytes{0}, produce_errors{0};
  std::atomic<uint64_t> fetch_bytes{0}, topics_created{0}, topics_deleted{0}, offset_commits{0};
  std::atomic<uint64_t> offset_groups_expired{0};  // groups whose offsets retention removed
  std::atomic<uint64_t> offset_expiry_checks{0};   // runs of the offsets retention check
  std::atomic<uint64_t> groups_deleted{0};         // by DeleteGroups
  std::atomic<uint64_t> fetches_without_room{0};   // fetch passes that found the response budget full
  std::atomic<int64_t> fetches_waiting{0};         // long polls: fetches in waiting_fetches_
};

class Broker : public FrameHandler {
 public:
  Broker(BrokerOptions options, log::Engine* engine, std::shared_ptr<metastore::Metastore> meta);
  ~Broker() override;
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  // Creates the Kafka basin if missing. Call once before serving.
  // kInvalidArgument unless the engine's group_offsets_basin is the
  // Kafka basin (a deleted topic's offsets would outlive it).
  Status Init();
  // The address clients are told to use (Metadata, FindCoordinator); call
  // before serving.
  void SetAdvertised(std::string host, int32_t port) {
    options_.advertised_host = std::move(host);
    options_.advertised_port = port;
  }
  void Handle(Frame frame, std::shared_ptr<Reply> reply) override;
  // Answers waiting group joins and long-polling fetches, and stops the
  // coordinator's ticks; fetches after it answer at once.
  void Stop();

  const BrokerMetrics& metrics() const { return metrics_; }
  const GroupCoordinator& groups() const { return groups_; }

  struct Request;  // one decoded request in flight (broker.cc)

 private:
  void Dispatch(const std::shared_ptr<Request>& req);
  // `on_worker`: free to block (else on an I/O thread).
  void Produce(const std::shared_ptr<Request>& req, bool on_worker);
  // Appends the batches, none waiting for admission: room held by `ticket`
  // (TryAdmission), or taken now, or the batch gets REQUEST_TIMED_OUT
  // (retriable).
  void ProduceAppend(const std::shared_ptr<Request>& req, std::shared_ptr<ProduceResponse> resp,
                     std::vector<ProduceJob> jobs, const std::shared_ptr<log::AdmissionTicket>& ticket);
  // From ordered work on a worker: appends the batches once the WAL has room
  // for them (ProduceAppend when it has now), without holding the worker
  // while they wait (the connection's ordered work is suspended meanwhile;
  // admission is looked at every few ms, up to one engine
  // admission_timeout for the request). Batches that cannot fit the WAL pool
  // at once wait in groups that do (WaitForAdmission). Retries of batches
  // already appended are answered before the wait (they need no room).
  void ProduceWhenAdmissible(const std::shared_ptr<Request>& req, std::shared_ptr<ProduceResponse> resp,
                             std::vector<ProduceJob> jobs);
  // Appends run->jobs from `from` on, a group fitting the pool at a time as
  // admission has room for it; then resumes the connection's ordered work.
  void WaitForAdmission(const std::shared_ptr<Request>& req, const std::shared_ptr<ProduceRun>& run, size_t from);
  // Appends run->jobs[i] (room from `ticket` if it holds some); the last
  // batch done answers the request.
  void AppendJob(const std::shared_ptr<Request>& req, const std::shared_ptr<ProduceRun>& run, size_t i,
                 const std::shared_ptr<log::AdmissionTicket>& ticket);
  // What answers run->jobs[i]'s partition once its append is done; the last
  // batch done answers the request.
  log::AppendCallback JobDone(const std::shared_ptr<Request>& req, const std::shared_ptr<ProduceRun>& run, size_t i);
  void FinishProduce(const std::shared_ptr<Request>& req, const ProduceResponse& r);
  void Fetch(const std::shared_ptr<Request>& req);
  // Reads every partition once; answers, or (unless final) waits for data.
  void FetchOnce(const std::shared_ptr<Request>& req, const std::shared_ptr<FetchState>& state, bool final);
  void FinishFetch(const std::shared_ptr<Request>& req, const std::shared_ptr<FetchState>& state, bool final);
  void ListOffsets(const std::shared_ptr<Request>& req);
  void ListOffsetsNow(const std::shared_ptr<Request>& req);
  void Metadata(const std::shared_ptr<Request>& req);
  void OffsetCommit(const std::shared_ptr<Request>& req);
  void OffsetFetch(const std::shared_ptr<Request>& req);
  void FindCoordinator(const std::shared_ptr<Request>& req);
  void JoinGroup(const std::shared_ptr<Request>& req);
  void Heartbeat(const std::shared_ptr<Request>& req);
  void LeaveGroup(const std::shared_ptr<Request>& req);
  void SyncGroup(const std::shared_ptr<Request>& req);
  void ApiVersions(const std::shared_ptr<Request>& req);
  void CreateTopics(const std::shared_ptr<Request>& req);
  void DeleteTopics(const std::shared_ptr<Request>& req);
  void InitProducerId(const std::shared_ptr<Request>& req);
  void DescribeGroups(const std::shared_ptr<Request>& req);
  void ListGroups(const std::shared_ptr<Request>& req);
  void DeleteGroups(const std::shared_ptr<Request>& req);
  // Kafka DeleteGroups' metastore part, as this node at its epoch: whether the group had offsets.
  Result<bool> DeleteAllOffsetsOf(const std::string& group);
  void OffsetDelete(const std::shared_ptr<Request>& req);
  void DescribeConfigs(const std::shared_ptr<Request>& req);
  void CreatePartitions(const std::shared_ptr<Request>& req);
  void DeleteRecords(const std::shared_ptr<Request>& req);
  void AlterConfigs(const std::shared_ptr<Request>& req);
  void IncrementalAlterConfigs(const std::shared_ptr<Request>& req);
  // AlterConfigs helpers. AlterEachTopic runs `apply(resource, table, &result)`
  // under create_mu_ for each resource that names an existing topic once,
  // and answers the others with their error. CheckConfigResource: false
  // (with the error in `out`) unless a topic is named once.
  // ReplaceTopicConfigs: checks `set`, the topic's whole new config set, and
  // (unless validate_only) applies it; the caller holds create_mu_.
  template <typename Resource, typename Apply>
  AlterConfigsResponse AlterEachTopic(const std::vector<Resource>& resources, Apply&& apply);
  static bool CheckConfigResource(int8_t resource_type, int times_named, AlterConfigsResult* out);
  // With `named` (IncrementalAlterConfigs: the configs the request changes),
  // the partitions' stream configs change only in those (they may have been
  // changed otherwise, through the REST API); without (AlterConfigs), in all.
  void ReplaceTopicConfigs(const std::string& topic, const std::vector<AlterConfigsEntry>& set, bool validate_only,
                           AlterConfigsResult* out, const std::set<std::string>* named = nullptr);

  // The partition count of a topic, creating it with `partitions` if it is
  // missing and partitions > 0. kNotFound if missing (and not created).
  Result<uint32_t> TopicPartitions(const std::string& topic, int32_t create_partitions);
  // kInvalidArgument if another topic's name is this one's with '.' and '_'
  // taken as one (Kafka refuses such a topic: their metric names collide).
  Status CheckTopicCollision(const std::string& topic);
  Status CreateTopic(const std::string& topic, int32_t partitions, const std::string& config_json,
                     const metastore::StreamConfig& stream_config);
  void TickLoop();
  void ExpireOffsets();     // offsets retention; on the expiry thread
  void NoteActiveGroups();  // into last_active_ms_; on the expiry thread

  BrokerOptions options_;
  log::Engine* engine_;
  std::shared_ptr<metastore::Metastore> meta_;
  GroupCoordinator groups_;
  // A group's offset changes, one at a time: a commit's generation check and
  // its write, OffsetDelete's and DeleteGroups' checks and deletes. So a
  // commit validated for a generation that then ends lands before any commit
  // of the next generation, never after it.
  KeyedMutex group_offsets_mu_;
  BrokerMetrics metrics_;
  std::mutex create_mu_;  // one topic creation or growth at a time (check, then change)
  // A topic's max.message.bytes (default options_.max_batch_bytes, also for
  // a topic that does not exist), read from its catalog entry once and kept
  // until any table changes (created, deleted or reconfigured, by Kafka or
  // REST: Engine::TablesVersion); an error, not kept, when the catalog could
  // not be read.
  Result<size_t> MaxMessageBytes(const std::string& topic);
  size_t MaxMessageBytesOf(const std::string& table_config) const;  // from a catalog entry's config
  std::optional<size_t> KeptMaxMessageBytes(const std::string& topic);  // without a metastore read
  // Under limits_mu_: drops the kept limits if the tables changed since.
  void DropStaleLimits();
  std::mutex limits_mu_;
  std::map<std::string, size_t> max_message_bytes_;
  uint64_t limits_tables_version_ = 0;  // the Engine::TablesVersion they were read at

  // Fetches waiting for data (long poll), so Stop can answer them: their
  // requests are otherwise held only by engine tail watches.
  std::mutex fetches_mu_;
  bool fetches_stopped_ = false;  // fetches_mu_
  std::map<const FetchState*, std::pair<std::weak_ptr<Request>, std::weak_ptr<FetchState>>> waiting_fetches_;
  void AnswerWaitingFetches();

  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;
  std::thread tick_thread_;
  // Offset expiry (ExpiryLoop, its own thread): when this broker started, and
  // when each group last had members (wall ms), looked at once a minute.
  void ExpiryLoop();
  std::thread expiry_thread_;
  const int64_t started_ms_ = WallMillis();
  // Groups seen with members within the offsets retention, when last seen;
  // at most about kMaxGroupsRemembered (those seen longest ago go first).
  static constexpr size_t kMaxGroupsRemembered = 100000;
  std::map<std::string, int64_t> last_active_ms_;  // expiry thread only
};

// Kafka's topic name rule: 1..249 of [a-zA-Z0-9._-], not "." or "..".
Status ValidateTopicName(const std::string& name);

}  // namespace weir::kafka
