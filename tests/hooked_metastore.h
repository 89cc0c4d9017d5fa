// A Metastore that forwards every call to another, with hooks for tests:
// run code just before MintEpoch, or rewrite what CommitSettle answers (to
// make a commit that landed look ambiguous). Owned by the test; any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "metastore/metastore.h"

namespace weir::testing {

class HookedMetastore final : public metastore::Metastore {
 public:
  explicit HookedMetastore(std::shared_ptr<metastore::Metastore> inner) : m_(std::move(inner)) {}

  std::function<void()> before_mint;                     // runs once, then is cleared
  std::function<Status()> fail_mint;                     // non-OK: MintEpoch answers it (and changes nothing)
  // Non-OK: MintEpoch mints, then answers it instead (the answer was lost).
  std::function<Status()> lose_mint_answer;
  std::function<Status()> fail_get_node;  // non-OK: GetNode answers it
  std::function<Status()> fail_await_commits;  // non-OK: AwaitCommitsInFlight answers it
  // Runs once when AwaitCommitsInFlight is called, then is cleared: a commit
  // still in flight (its answer lost) ends while the caller waits for it.
  std::function<void()> commit_in_flight;
  // Non-OK: UpdateStreamConfig and UpdateTableConfig answer it without changing anything.
  std::function<Status()> fail_update_config;
  // Maps the real answer of UpdateStreamConfig and UpdateTableConfig (after
  // the change ran): a change that landed with its answer lost.
  std::function<Status(Status)> map_update_config_answer;
  std::function<void()> before_commit_settle;            // runs once, then is cleared
  std::function<Status(Status)> after_commit_settle;     // maps the real answer
  // Non-OK for a stream id: DeleteSegmentsBelow with a cut of it answers it (removing nothing).
  std::function<Status(uint64_t)> fail_delete_segments;
  // Maps DeleteSegmentsBelow's real answer (after the delete ran): rows removed with the answer lost.
  std::function<Status(Status)> map_delete_segments_answer;
  std::function<Status(Status)> after_replace_segments;  // maps the real answer
  std::function<void()> after_list_stream_states;        // runs once, then is cleared
  std::function<Status()> fail_commit_settle;            // non-OK: CommitSettle answers it without committing
  std::function<Status()> fail_find_segments;            // non-OK: FindSegments answers it
  std::function<void()> after_delete_stream;             // runs once after DeleteStream or DeleteTable committed
  // Maps the real answer of DeleteStream, DeleteEmptyStream and DeleteTable
  // (after the delete ran): a delete that landed with its answer lost.
  std::function<Status(Status)> map_delete_answer;
  // Non-OK: DeleteStream, DeleteEmptyStream and DeleteTable answer it without deleting.
  std::function<Status()> fail_delete;
  std::function<Status()> fail_get_stream_by_id;  // non-OK: GetStreamById answers it
  std::function<Status()> fail_get_stream;        // non-OK: GetStream (by name) answers it
  std::function<Status()> fail_get_stream_state;  // non-OK: GetStreamState answers it
  std::function<Status()> fail_get_table;         // non-OK: GetTable answers it
  // Non-OK: CreateStream, CreateTable and AddBuckets answer it without creating.
  std::function<Status()> fail_create;
  // Maps the real answer of CreateStream, CreateTable and AddBuckets (after
  // the create ran): a create that landed with its answer lost.
  std::function<Status(Status)> map_create_answer;
  std::function<void()> before_commit_group_offsets;  // runs once, then is cleared
  std::function<void()> before_delete_group_offsets;  // runs once, then is cleared
  std::function<void()> before_expire_group_offsets;  // runs once, then is cleared
  // Non-OK: FetchGroupOffsets, FetchPartitionOffsets and GroupHasOffsets answer it.
  std::function<Status()> fail_fetch_group_offsets;
  std::function<Status()> fail_allocate_producer_id;  // non-OK: AllocateProducerId answers it
  // Maps RaiseTrimPoint's real answer (after it ran): a trim stored with its answer lost.
  std::function<Status(Status)> map_raise_trim_answer;
  std::atomic<int> delete_empty_stream_calls{0};
  std::atomic<int> await_commits_calls{0};
  std::atomic<int> list_streams_by_id_calls{0};
  std::atomic<int> list_segments_calls{0};
  std::atomic<int> list_stream_states_calls{0};
  std::atomic<int> get_stream_by_id_calls{0};
  std::atomic<int> find_segments_calls{0};
  std::atomic<int> delete_segments_calls{0};

  using BasinInfo = metastore::BasinInfo;
  using BasinConfig = metastore::BasinConfig;
  using StreamInfo = metastore::StreamInfo;
  using StreamConfig = metastore::StreamConfig;
  using StreamState = metastore::StreamState;
  using TableInfo = metastore::TableInfo;
  using GroupOffset = metastore::GroupOffset;
  using NodeState = metastore::NodeState;
  using ChainPosition = metastore::ChainPosition;
  using SegmentInfo = metastore::SegmentInfo;

  using Metastore::CreateBasin;
  Status CreateBasin(const BasinInfo& b, const metastore::EpochCheck& by, size_t max_basins) override {
    return m_->CreateBasin(b, by, max_basins);
  }
  Result<BasinInfo> GetBasin(std::string_view n) override { return m_->GetBasin(n); }
  Status ReconfigureBasin(std::string_view n, const BasinConfig& c, const metastore::EpochCheck& by) override {
    return m_->ReconfigureBasin(n, c, by);
  }
  Result<std::vector<BasinInfo>> ListBasins(std::string_view p, std::string_view a, size_t l) override {
    return m_->ListBasins(p, a, l);
  }
  Status DeleteBasin(std::string_view n, const metastore::EpochCheck& by) override { return m_->DeleteBasin(n, by); }
  Result<std::string> CreateToken(std::string_view b, std::string_view s) override { return m_->CreateToken(b, s); }
  Result<StreamInfo> CreateStream(const StreamInfo& i, const metastore::EpochCheck& by) override {
    if (Status st = FailCreate(); !st.ok()) return st;
    return MapCreate(m_->CreateStream(i, by));
  }
  template <typename T>
  Result<T> MapCreate(Result<T> r) {
    if (!map_create_answer) return r;
    Status mapped = map_create_answer(r.ok() ? Status::Ok() : r.status());
    if (!mapped.ok()) return mapped;
    return r;
  }
  Status FailCreate() { return fail_create ? fail_create() : Status::Ok(); }
  Result<StreamInfo> GetStream(std::string_view b, std::string_view n) override {
    if (fail_get_stream) {
      if (Status st = fail_get_stream(); !st.ok()) return st;
    }
    return m_->GetStream(b, n);
  }
  Result<StreamInfo> GetStreamById(uint64_t id) override {
    ++get_stream_by_id_calls;
    if (fail_get_stream_by_id) {
      if (Status st = fail_get_stream_by_id(); !st.ok()) return st;
    }
    return m_->GetStreamById(id);
  }
  Result<std::vector<StreamInfo>> ListStreams(std::string_view b, std::string_view p, std::string_view a,
                                              size_t l) override {
    return m_->ListStreams(b, p, a, l);
  }
  Status UpdateStreamConfig(uint64_t id, const StreamConfig& c, const metastore::EpochCheck& by) override {
    return UpdatingConfig([&] { return m_->UpdateStreamConfig(id, c, by); });
  }
  Status RaiseTrimPoint(std::string_view n, uint64_t e, uint64_t id, uint64_t t) override {
    Status st = m_->RaiseTrimPoint(n, e, id, t);
    return map_raise_trim_answer ? map_raise_trim_answer(std::move(st)) : st;
  }
  Result<std::vector<std::string>> DeleteStream(uint64_t id, const metastore::EpochCheck& by) override {
    if (fail_delete) {
      if (Status st = fail_delete(); !st.ok()) return st;
    }
    auto r = m_->DeleteStream(id, by);
    if (auto hook = std::exchange(after_delete_stream, nullptr); r.ok() && hook) hook();
    return MapDelete(std::move(r));
  }
  Result<std::vector<std::string>> DeleteEmptyStream(uint64_t id, std::string_view n, uint64_t e) override {
    delete_empty_stream_calls++;
    if (fail_delete) {
      if (Status st = fail_delete(); !st.ok()) return st;
    }
    return MapDelete(m_->DeleteEmptyStream(id, n, e));
  }
  Result<std::vector<std::string>> MapDelete(Result<std::vector<std::string>> r) {
    if (!map_delete_answer) return r;
    Status mapped = map_delete_answer(r.ok() ? Status::Ok() : r.status());
    if (!mapped.ok()) return mapped;
    return r;
  }
  Result<StreamState> GetStreamState(uint64_t id) override {
    if (fail_get_stream_state) {
      if (Status st = fail_get_stream_state(); !st.ok()) return st;
    }
    return m_->GetStreamState(id);
  }
  Result<std::vector<StreamInfo>> ListStreamsById(uint64_t after, size_t l) override {
    ++list_streams_by_id_calls;
    return m_->ListStreamsById(after, l);
  }
  Result<std::vector<SegmentInfo>> ListSegmentsFrom(uint64_t id, uint64_t from, size_t l) override {
    ++list_segments_calls;
    return m_->ListSegmentsFrom(id, from, l);
  }
  Result<std::vector<StreamState>> ListStreamStates(uint64_t after, size_t l) override {
    ++list_stream_states_calls;
    auto states = m_->ListStreamStates(after, l);
    if (auto hook = std::exchange(after_list_stream_states, nullptr)) hook();
    return states;
  }
  Result<std::pair<TableInfo, std::vector<StreamInfo>>> CreateTable(const TableInfo& t, const StreamConfig& c,
                                                                    const metastore::EpochCheck& by) override {
    if (Status st = FailCreate(); !st.ok()) return st;
    return MapCreate(m_->CreateTable(t, c, by));
  }
  Result<TableInfo> GetTable(std::string_view b, std::string_view n) override {
    if (fail_get_table) {
      if (Status st = fail_get_table(); !st.ok()) return st;
    }
    return m_->GetTable(b, n);
  }
  Result<std::vector<TableInfo>> ListTables(std::string_view b, std::string_view p, std::string_view a,
                                            size_t l) override {
    return m_->ListTables(b, p, a, l);
  }
  Result<std::vector<std::string>> DeleteTable(uint64_t id, bool with_group_offsets,
                                               const metastore::EpochCheck& by) override {
    if (fail_delete) {
      if (Status st = fail_delete(); !st.ok()) return st;
    }
    auto r = m_->DeleteTable(id, with_group_offsets, by);
    if (auto hook = std::exchange(after_delete_stream, nullptr); r.ok() && hook) hook();
    return MapDelete(std::move(r));
  }
  Result<std::pair<TableInfo, std::vector<StreamInfo>>> AddBuckets(uint64_t id, uint32_t n, const StreamConfig& c,
                                                                   int64_t ms, const metastore::EpochCheck& by) override {
    if (Status st = FailCreate(); !st.ok()) return st;
    return MapCreate(m_->AddBuckets(id, n, c, ms, by));
  }
  Status UpdateTableConfig(uint64_t id, std::string_view c, const std::vector<std::pair<uint64_t, StreamConfig>>& s,
                           const metastore::EpochCheck& by) override {
    return UpdatingConfig([&] { return m_->UpdateTableConfig(id, c, s, by); });
  }
  Status CommitGroupOffsets(std::string_view g, const std::vector<GroupOffset>& o,
                            const metastore::EpochCheck& by) override {
    if (auto hook = std::exchange(before_commit_group_offsets, nullptr)) hook();
    return m_->CommitGroupOffsets(g, o, by);
  }
  Result<std::vector<GroupOffset>> FetchGroupOffsets(std::string_view g) override {
    if (fail_fetch_group_offsets) {
      if (Status st = fail_fetch_group_offsets(); !st.ok()) return st;
    }
    return m_->FetchGroupOffsets(g);
  }
  Result<std::vector<GroupOffset>> FetchPartitionOffsets(
      std::string_view g, const std::vector<std::pair<std::string, int32_t>>& p) override {
    if (fail_fetch_group_offsets) {
      if (Status st = fail_fetch_group_offsets(); !st.ok()) return st;
    }
    return m_->FetchPartitionOffsets(g, p);
  }
  Result<bool> GroupHasOffsets(std::string_view g) override {
    if (fail_fetch_group_offsets) {
      if (Status st = fail_fetch_group_offsets(); !st.ok()) return st;
    }
    return m_->GroupHasOffsets(g);
  }
  Status DeletePartitionOffsets(std::string_view g, const std::vector<std::pair<std::string, int32_t>>& p,
                                const metastore::EpochCheck& by) override {
    return m_->DeletePartitionOffsets(g, p, by);
  }
  Result<std::vector<std::string>> ListOffsetGroups(size_t limit) override { return m_->ListOffsetGroups(limit); }
  Result<bool> DeleteAllGroupOffsets(std::string_view g, const metastore::EpochCheck& by) override {
    if (auto f = std::exchange(before_delete_group_offsets, nullptr)) f();
    return m_->DeleteAllGroupOffsets(g, by);
  }
  Result<std::vector<std::string>> ExpireGroupOffsets(int64_t ms, const std::vector<std::string>& k,
                                                      const metastore::EpochCheck& by) override {
    if (auto hook = std::exchange(before_expire_group_offsets, nullptr)) hook();
    return m_->ExpireGroupOffsets(ms, k, by);
  }
  Result<NodeState> GetNode(std::string_view n) override {
    if (fail_get_node) {
      if (Status st = fail_get_node(); !st.ok()) return st;
    }
    return m_->GetNode(n);
  }
  Result<std::vector<NodeState>> ListNodes() override { return m_->ListNodes(); }
  Status AwaitCommitsInFlight() override {
    await_commits_calls.fetch_add(1);
    if (auto hook = std::exchange(commit_in_flight, nullptr)) hook();
    if (fail_await_commits) {
      if (Status st = fail_await_commits(); !st.ok()) return st;
    }
    return m_->AwaitCommitsInFlight();
  }
  Result<NodeState> MintEpoch(std::string_view n, uint64_t e, uint32_t w, uint64_t minter = 0) override {
    if (auto hook = std::exchange(before_mint, nullptr)) hook();
    if (fail_mint) {
      if (Status st = fail_mint(); !st.ok()) return st;
    }
    auto minted = m_->MintEpoch(n, e, w, minter);
    if (lose_mint_answer && minted.ok()) {
      if (Status st = lose_mint_answer(); !st.ok()) return st;
    }
    return minted;
  }
  Status Heartbeat(std::string_view n, uint64_t e, int64_t window) override { return m_->Heartbeat(n, e, window); }
  Status CheckNoOtherLiveNode(std::string_view n, int64_t window) override {
    return m_->CheckNoOtherLiveNode(n, window);
  }
  Result<uint64_t> AllocateProducerId() override {
    if (fail_allocate_producer_id) {
      if (Status st = fail_allocate_producer_id(); !st.ok()) return st;
    }
    return m_->AllocateProducerId();
  }
  Result<uint64_t> LastStreamId() override { return m_->LastStreamId(); }
  Result<uint64_t> LastProducerId() override { return m_->LastProducerId(); }
  Result<uint64_t> DeploymentId() override { return m_->DeploymentId(); }
  Status CommitSettle(std::string_view n, uint64_t e, const ChainPosition& x, const ChainPosition& next,
                      const std::vector<SegmentInfo>& segs, const std::vector<StreamState>& states) override {
    if (auto hook = std::exchange(before_commit_settle, nullptr)) hook();
    if (fail_commit_settle) {
      if (Status failed = fail_commit_settle(); !failed.ok()) return failed;
    }
    Status st = m_->CommitSettle(n, e, x, next, segs, states);
    return after_commit_settle ? after_commit_settle(std::move(st)) : st;
  }
  Result<std::vector<SegmentInfo>> FindSegments(uint64_t id, uint64_t from, size_t l) override {
    ++find_segments_calls;
    if (fail_find_segments) {
      if (Status st = fail_find_segments(); !st.ok()) return st;
    }
    return m_->FindSegments(id, from, l);
  }
  Result<std::optional<SegmentInfo>> FindSegmentByTimestamp(uint64_t id, int64_t ms) override {
    return m_->FindSegmentByTimestamp(id, ms);
  }
  Result<std::vector<SegmentInfo>> DeleteSegmentsBelow(std::string_view n, uint64_t e,
                                                       const std::vector<metastore::SegmentCut>& cuts) override {
    ++delete_segments_calls;
    if (fail_delete_segments) {
      for (const auto& cut : cuts) {
        if (Status st = fail_delete_segments(cut.stream_id); !st.ok()) return st;
      }
    }
    auto r = m_->DeleteSegmentsBelow(n, e, cuts);
    if (!map_delete_segments_answer) return r;
    if (Status mapped = map_delete_segments_answer(r.ok() ? Status::Ok() : r.status()); !mapped.ok()) return mapped;
    return r;
  }
  Status ReplaceSegments(std::string_view n, uint64_t e, uint64_t id, const std::vector<SegmentInfo>& replaced,
                         const SegmentInfo& merged) override {
    Status st = m_->ReplaceSegments(n, e, id, replaced, merged);
    return after_replace_segments ? after_replace_segments(std::move(st)) : st;
  }
  const metastore::MetastoreCounters& counters() const override { return m_->counters(); }
  std::string Describe() const override { return m_->Describe(); }

 private:
  template <typename Change>
  Status UpdatingConfig(Change change) {
    if (fail_update_config) {
      if (Status st = fail_update_config(); !st.ok()) return st;
    }
    Status st = change();
    return map_update_config_answer ? map_update_config_answer(st) : st;
  }

  std::shared_ptr<metastore::Metastore> m_;
};

}  // namespace weir::testing
