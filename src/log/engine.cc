#include "log/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <random>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "base/bytes.h"
#include "base/log.h"
#include "base/thread.h"
#include "base/utf8.h"
#include "log/engine_internal.h"
#include "log/producer_window.h"
#include "wal/fence.h"
#include "wal/quorum_store.h"
#include "wal/slot_format.h"

namespace weir::log {

namespace {
size_t Metered(size_t body, const std::optional<std::string>& key, const std::vector<wal::RecordHeader>& headers) {
  size_t n = kMeteredRecordBytes + body + (key ? key->size() : 0);
  for (const auto& h : headers) n += MeteredBytes(h);
  return n;
}
}  // namespace

size_t MeteredBytes(const AppendRecord& r) { return Metered(r.body.size(), r.key, r.headers); }

size_t MeteredBytes(const wal::Record& r) { return Metered(r.value ? r.value->size() : 0, r.key, r.headers); }

size_t ServedMeteredBytes(const wal::Record& r) {
  return Metered(r.value ? r.value->size() : 0, std::nullopt, r.headers);
}

Status CheckClientTimestamps(const metastore::StreamConfig& config, const std::vector<AppendRecord>& records) {
  if (config.timestamping != metastore::TimestampingMode::kClientRequire) return Status::Ok();
  for (size_t i = 0; i < records.size(); ++i) {
    if (!records[i].timestamp_ms) return InvalidArgument("record {}: this stream requires client timestamps", i);
  }
  return Status::Ok();
}

namespace {

uint64_t RandomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;
}

// What a mint of `epoch` by the process of `nonce` stores as its minter:
// tied to the epoch, so a row left naming this process's mint of an earlier
// epoch (a build before schema 8 minted the next one, keeping the column)
// never reads as this mint.
uint64_t MinterOf(uint64_t nonce, uint64_t epoch) {
  uint64_t z = epoch + 0x9E3779B97F4A7C15u;  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
  return nonce ^ z ^ (z >> 31);
}

// What a superseded process answers for its streams.
Status SupersededError(const std::string& node) {
  return Fenced("node {} was superseded by another process, which serves its streams now", node);
}

// A read whose object stayed missing though the stream is there (not a race
// with settle or retention, which a second look resolves): its records are
// lost, which "not found" would misreport as a missing stream.
Status ObjectMissing(const std::string& stream, const Status& why) {
  return Corruption("stream \"{}\": an object holding these records is missing from the store ({})", stream,
                    why.message());
}

}  // namespace

Status ValidateBasinName(const std::string& name) {
  if (name.size() < 8 || name.size() > 48) {
    return InvalidArgument("basin name \"{}\" must be 8 to 48 characters", name);
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
      return InvalidArgument("basin name \"{}\" may hold only lowercase letters, digits and hyphens", name);
    }
  }
  if (name.front() == '-' || name.back() == '-') {
    return InvalidArgument("basin name \"{}\" must not start or end with a hyphen", name);
  }
  return Status::Ok();
}

Status ValidateStreamName(const std::string& name) {
  if (name.empty() || name.size() > 512) return InvalidArgument("stream name must be 1 to 512 bytes");
  if (name.find('\0') != std::string::npos) return InvalidArgument("stream name must not contain NUL");
  if (name == "." || name == "..") return InvalidArgument("stream name must not be \"{}\"", name);
  if (!IsValidUtf8(name)) return InvalidArgument("stream name must be UTF-8");
  return Status::Ok();
}

Engine::Engine(EngineOptions options, std::shared_ptr<objstore::ObjectStore> store,
               std::shared_ptr<metastore::Metastore> meta)
    : options_(std::move(options)),
      store_(std::move(store)),
      meta_(std::move(meta)),
      segment_indexes_(options_.segment_index_cache_bytes),
      opened_ms_(WallMillis()) {
  wal_store_ = options_.wal_store ? options_.wal_store : store_;
}

Engine::~Engine() { Close(); }

void Engine::Close() {
  if (closing_.exchange(true)) return;
  {
    std::lock_guard lk(settle_wait_mu_);
    settle_cv_.notify_all();
  }
  {
    std::lock_guard lk(backlog_mu_);
    backlog_cv_.notify_all();
  }
  // The heartbeat goes on until Close has finished (its drain and final
  // settle may take long: another node must not start meanwhile), and is
  // cleared only once everything acknowledged is settled, so that another
  // node may serve at once. Otherwise it goes stale (node_live_window).
  struct StopHeartbeat {
    Engine* e;
    bool clear = false;
    ~StopHeartbeat() {
      {
        std::lock_guard lk(e->heartbeat_mu_);
        e->heartbeat_stop_ = true;
        e->heartbeat_cv_.notify_all();
      }
      if (e->heartbeat_thread_.joinable()) e->heartbeat_thread_.join();
      if (!clear) return;
      // A successor of this node's minted a later epoch: the metastore refuses, and it is not ours.
      if (Status hb = e->Heartbeat(false); !hb.ok() && hb.code() != Code::kPreconditionFailed) {
        Log().warn("clearing this node's heartbeat: {}", hb.ToString());
      }
    }
  } stop_heartbeat{this};
  if (settle_thread_.joinable()) settle_thread_.join();
  std::thread halt;
  {
    std::lock_guard lk(mu_);
    halt = std::move(halt_thread_);
  }
  if (halt.joinable()) halt.join();
  // The eviction thread runs until the drain's acks are in.
  struct StopEvicting {
    Engine* e;
    ~StopEvicting() {
      {
        std::lock_guard lk(e->evict_wait_mu_);
        e->evict_stop_ = true;
        e->evict_cv_.notify_all();
      }
      if (e->evict_thread_.joinable()) e->evict_thread_.join();
    }
  } stop_evicting{this};
  if (!wal_) return;
  wal_->Close();  // drains: every admitted append is acknowledged (or failed)
  if (!options_.settle_on_close) return;
  // Settle what was acknowledged, so the next start has little to replay.
  final_settle_ = true;
  Status st = SettleNow();
  if (!st.ok()) Log().warn("final settle: {}", st.ToString());
  // Appends the WAL failed while closing may still land past the settled
  // checkpoint: the heartbeat stays set, so that whichever node starts next
  // replays them (this one's restart, or a takeover) before serving.
  const bool clean = wal_->closed_clean();
  if (st.ok() && !clean) {
    Log().warn("leaving node {}'s heartbeat set: appends the WAL failed while closing may still land, and the "
               "next start must replay them",
               options_.node);
  }
  stop_heartbeat.clear = st.ok() && clean;
}

Status Engine::Heartbeat(bool beating) {
  const int64_t window =
      beating ? std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(options_.node_live_window).count())
              : 0;
  return meta_->Heartbeat(options_.node, epoch_.load(), window);
}

void Engine::HeartbeatLoop() {
  SetThreadName("heartbeat");
  std::unique_lock lk(heartbeat_mu_);
  while (!heartbeat_stop_) {
    heartbeat_cv_.wait_for(lk, options_.heartbeat_interval, [&] { return heartbeat_stop_; });
    if (heartbeat_stop_ || superseded_) break;  // a successor's: every beat would be refused (said once)
    lk.unlock();
    if (Status st = Heartbeat(true); !st.ok()) {
      // Refused: a successor may hold the node (when a settle round holds
      // settle_mu_, the next beat asks).
      if (!TryNoteIfSuperseded(st)) Log().warn("heartbeat: {}", st.ToString());
    }
    lk.lock();
  }
}

std::pair<uint64_t, Status> Engine::SupersededCut(const wal::ChainRef& chain, uint64_t halted) {
  // The slots below the halt are committed only up to the successor's
  // poison, which is where the chain halted only when the halt met it: a
  // halt at another writer's flight, or at an envelope that stayed
  // unreadable, may lie above a slot whose PUT has not landed and that the
  // successor's walk poisoned (or will find missing). So each slot not yet
  // released is read (only read: the node is the successor's now): our
  // flights are committed (its walk, done or to come, finds them); from the
  // first that is not, nothing is acknowledged. At a poison nothing from
  // there on is replayed (not written); at a missing or unreadable slot, or
  // another writer's flight (the walk counts it and goes on), the
  // successor's walk may still take ours (unknown). The halted slot itself is
  // read too: ours (landed, its envelope read back garbled until the halt)
  // means the successor's walk goes on past it, into slots whose PUTs may
  // have landed (unknown from the next one on).
  const auto [released_epoch, released_seq] = wal_->released_below();
  uint64_t seq = released_epoch == chain.epoch ? released_seq : 0;
  for (; seq <= halted; ++seq) {
    auto probe = wal::ProbeSlot(*wal_store_, chain, seq);
    if (!probe.ok()) {
      return {seq, Unavailable("node {} was superseded, and its WAL slot {} could not be classified ({}): "
                               "whether the append landed is unknown",
                               options_.node, seq, probe.status().message())};
    }
    if (probe->state == wal::SlotState::kMissing) {
      // Its PUT may still land before the successor's walk reaches it.
      return {seq, Unavailable("node {} was superseded before its WAL slot {} landed: whether the append is "
                               "kept is unknown",
                               options_.node, seq)};
    }
    if (probe->state == wal::SlotState::kPoison) break;  // nothing from here on is replayed
    if (probe->envelope.nonce != wal_->nonce()) {
      // Another writer's flight: the successor's walk counts it committed
      // and may go on to our slots past it.
      return {seq, Unavailable("node {} was superseded, and its WAL slot {} holds another writer's flight: "
                               "whether the appends from there on are kept is unknown",
                               options_.node, seq)};
    }
  }
  if (seq > halted) {
    return {seq, Unavailable("node {} was superseded past its WAL slot {}: whether the appends from there on "
                             "are kept is unknown",
                             options_.node, halted)};
  }
  return {seq, Fenced("node {} was superseded", options_.node)};
}

bool Engine::DeleteGarbageIfStillOurs(const wal::ChainRef& chain, uint64_t cut, uint64_t window) {
  // A successor that minted since our mint may have fenced this chain, then
  // settled and deleted its slots: our walk then met a deleted slot, and the
  // slots past that cut are ones it still needs. After the probe below a
  // successor's fence meets our poison, and the slots past it are garbage to
  // it too.
  const std::optional<bool> superseded = LearnIfSuperseded();
  if (superseded.value_or(false)) return false;
  if (!superseded) {
    Log().warn("garbage probe of {}/{}: skipped, since whether this process still holds the node could not be read",
               chain.node, chain.epoch);
    return true;
  }
  auto garbage = wal::DeleteGarbage(*wal_store_, chain, cut, window);
  if (!garbage.ok()) Log().warn("garbage probe of {}/{}: {}", chain.node, chain.epoch, garbage.status().ToString());
  return true;
}

Status Engine::OwnFlights(const wal::ChainRef& chain, uint64_t from, uint64_t to, uint64_t* failed_at) {
  for (uint64_t seq = from; seq < to; ++seq) {
    if (failed_at) *failed_at = seq;
    // An envelope that does not decode is read again, as the writer reads it
    // before it halts: the store garbled reads just now.
    auto probe = wal::ProbeSlot(*wal_store_, chain, seq);
    for (int read = 1; !probe.ok() && probe.status().code() == Code::kCorruption &&
                       read < wal::Writer::kUnreadableEnvelopeReads;
         ++read) {
      probe = wal::ProbeSlot(*wal_store_, chain, seq);
    }
    if (!probe.ok()) {
      return Unavailable("WAL chain {}/{}: slot {} could not be read back ({}): whether the append landed is unknown",
                         chain.node, chain.epoch, seq, probe.status().message());
    }
    if (probe->state != wal::SlotState::kFlight) {
      return Unavailable("WAL chain {}/{}: slot {} changed while it was fenced: whether the append landed is unknown",
                         chain.node, chain.epoch, seq);
    }
    if (probe->envelope.nonce != wal_->nonce()) {
      return Corruption("WAL chain {}/{} holds another writer's slots from {} on", chain.node, chain.epoch, seq);
    }
  }
  return Status::Ok();
}

void Engine::HandleHalt(uint64_t epoch) {
  SetThreadName("wal-halt");
  wal::ChainRef chain{options_.node, epoch};
  std::lock_guard settle(settle_mu_);  // the checkpoint must not move meanwhile
  // Fails what cannot be acknowledged. Every cut below is one whose slots
  // below it are committed; the writer refuses a cut past its halt, which may
  // have moved lower meanwhile (an upload below it found its key taken): then
  // from there, as unknown (the slots below the lower halt are committed too).
  auto abandon = [&](uint64_t cut, const Status& why, const Status& unwritten = Status::Ok(),
                     std::optional<uint64_t> read_back_from = std::nullopt) {
    Status st = wal_->Abandon(cut, why, unwritten, read_back_from);
    if (std::optional<uint64_t> halted = wal_->halted_seq();
        st.code() == Code::kInvalidArgument && halted && *halted < cut) {
      st = wal_->Abandon(*halted,
                         Unavailable("WAL chain {}/{}: slot {} was found taken while the halt was handled: whether "
                                     "the appends from there on landed is unknown",
                                     options_.node, epoch, *halted),
                         unwritten);
    }
    if (!st.ok()) Log().error("abandoning WAL chain {}/{} from slot {}: {}", options_.node, epoch, cut, st.ToString());
  };
  // Minted first: a successor that fenced this epoch may since have settled
  // and deleted slots above our checkpoint, so fencing from it (a new poison
  // below the successor's) and probing for garbage after it are ours to do
  // only while we still hold the node. Only a successor's epoch
  // (kPreconditionFailed) means the node is gone; a metastore that fails
  // otherwise (busy, unreachable) is asked again.
  // An attempt that failed otherwise may have minted, its answer lost: the
  // node row then names this process's minter for the next epoch. Looked
  // up at once (meanwhile client changes are refused as if superseded), and
  // again should a later attempt be refused.
  const uint64_t minter = MinterOf(nonce_, epoch + 1);
  Result<metastore::NodeState> minted = Status();
  bool asked = false;
  for (;;) {
    minted = meta_->MintEpoch(options_.node, epoch, static_cast<uint32_t>(options_.wal.window), minter);
    const bool refused = minted.status().code() == Code::kPreconditionFailed;
    if (minted.ok() || (refused && !asked) || closing_) break;
    Log().error("minting the epoch after {}: {}", epoch, minted.status().ToString());
    asked = true;
    auto node = meta_->GetNode(options_.node);
    if (node.ok() && node->epoch == epoch + 1 && node->minted_by == minter) {
      Log().warn("minting the epoch after {}: an attempt whose answer was lost minted {}", epoch, node->epoch);
      minted = std::move(*node);
      break;
    }
    if (refused && node.ok()) break;  // a successor's
    if (!node.ok()) Log().error("reading node {}: {}", options_.node, node.status().ToString());
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (!minted.ok()) {
    if (closing_) return;  // Close fails what cannot be acknowledged
    std::optional<uint64_t> halted = wal_->halted_seq();
    Log().error("node {} was superseded ({}); abandoning its streams", options_.node, minted.status().ToString());
    MarkSuperseded();
    if (halted) {
      // Appends never cut into a slot were not written, whatever the slots'.
      const auto [cut, why] = SupersededCut(chain, *halted);
      // A cut past the halted slot: SupersededCut read it back as ours.
      abandon(cut, why, Fenced("node {} was superseded", options_.node), *halted);
    }
    return;
  }
  // The metastore holds the new epoch now: epoch-fenced calls outside
  // settle_mu_ (TrimTo) use it from here on.
  epoch_ = minted->epoch;
  uint64_t from = checkpoint_.epoch == epoch ? checkpoint_.seq : 0;
  // Every slot below the released position is committed and still there
  // (settle may have left the checkpoint well below it): the walk starts there.
  if (const auto [rel_epoch, rel_seq] = wal_->released_below(); rel_epoch == epoch) from = std::max(from, rel_seq);
  Result<wal::FenceResult> fence = Status();
  for (;;) {
    fence = wal::Fence(*wal_store_, chain, from, nonce_);
    // Corruption: an object at one of our keys that is no slot of this
    // chain (unreadable, or naming another slot). No retry reads it otherwise.
    if (fence.ok() || closing_ || fence.status().code() == Code::kCorruption) break;
    Log().error("fencing our own halted epoch {}: {}; retrying", epoch, fence.status().ToString());
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (!fence.ok()) {
    if (closing_) return;  // Close fails what cannot be acknowledged
    // Where the walk stopped is not known here: every append not yet
    // acknowledged (all are past the checkpoint) is failed, as one whose
    // outcome is unknown, since slots below the object may have landed (a
    // restart replays them). The writer takes no more appends.
    std::optional<uint64_t> halted = wal_->halted_seq();
    Log().error("fencing our own halted epoch {}: {}; failing the appends not yet acknowledged", epoch,
                fence.status().ToString());
    if (halted) {
      abandon(std::min(from, *halted),
              Unavailable("WAL chain {}/{} cannot be fenced ({}); whether the append landed is unknown", options_.node,
                          epoch, fence.status().message()));
    }
    return;
  }
  // The fence counts any occupant as committed, so a cut past the slot our
  // PUT found taken means it read an occupant there: another writer's slots
  // at our epoch's keys, or our own (a PUT that landed with its answer lost,
  // whose envelope read back garbled until the writer halted). Ours are
  // committed and resumed past; otherwise nothing at or after the halted
  // slot can be acknowledged (the slots below it were read back first).
  // The halt may move lower while this runs (an upload below it finding its
  // key taken too): the slots from the new halt are read back as well, and
  // the writer refuses a resume past a halt lower than what was read back.
  // First the slots below the halt not yet released (PUTs still out, say
  // retrying after a 5xx): one holding another writer's flight is not ours
  // to acknowledge.
  if (std::optional<uint64_t> halted = wal_->halted_seq()) {
    const auto [rel_epoch, rel_seq] = wal_->released_below();
    uint64_t failed_at = 0;
    if (Status theirs = OwnFlights(chain, rel_epoch == epoch ? rel_seq : 0, std::min(*halted, fence->cut), &failed_at);
        !theirs.ok()) {
      Log().error("WAL chain {}/{}: failing appends from slot {} on: {}", options_.node, epoch, failed_at,
                  theirs.ToString());
      abandon(failed_at, theirs);
      return;
    }
  }
  std::optional<uint64_t> read_back_from;  // slots [it, fence->cut) are our own flights
  auto halted_past_read_back = [&]() -> std::optional<uint64_t> {
    std::optional<uint64_t> halted = wal_->halted_seq();
    if (!halted || fence->cut <= *halted || (read_back_from && *read_back_from <= *halted)) return std::nullopt;
    return halted;
  };
  Status st;
  for (bool garbage_probed = false;;) {
    if (std::optional<uint64_t> halted = halted_past_read_back()) {
      if (Status theirs = OwnFlights(chain, *halted, read_back_from.value_or(fence->cut)); !theirs.ok()) {
        Log().error("WAL chain {}/{}: failing appends from slot {} on: {}", options_.node, epoch, *halted,
                    theirs.ToString());
        abandon(*halted, theirs);
        return;
      }
      Log().warn("WAL chain {}/{}: slots {} to {} are our own flights after all; resuming past them",
                 options_.node, epoch, *halted, fence->cut - 1);
      read_back_from = *halted;
      continue;
    }
    if (!garbage_probed) {
      garbage_probed = true;
      epoch_cuts_[epoch] = fence->cut;
      if (!DeleteGarbageIfStillOurs(chain, fence->cut, static_cast<uint64_t>(options_.wal.window))) {
        // A successor minted after us, and fenced (perhaps replayed, settled
        // and deleted) this chain: it holds the slots from our cut on, or
        // poisoned them. Nothing is resumed into an epoch it has fenced too.
        abandon(fence->cut,
                Unavailable("node {} was superseded while its WAL halt was handled: whether the append landed is "
                            "unknown",
                            options_.node),
                Fenced("node {} was superseded", options_.node), read_back_from);
        return;
      }
      continue;  // the probe takes a while: look at the halt again
    }
    st = wal_->Resume(minted->epoch, fence->cut, read_back_from);
    if (st.ok()) return;
    if (st.code() != Code::kInvalidArgument || !halted_past_read_back()) break;
  }
  // Left halted, its pending appends would wait for ever: fail them.
  Log().error("resuming the WAL in epoch {}: {}; failing its pending appends", minted->epoch, st.ToString());
  abandon(fence->cut, st, Status::Ok(), read_back_from);
}

Result<std::unique_ptr<Engine>> Engine::Open(EngineOptions options, std::shared_ptr<objstore::ObjectStore> store,
                                             std::shared_ptr<metastore::Metastore> meta) {
  if (!store || !meta) return InvalidArgument("the engine needs an object store and a metastore");
  // Before Recover mints an epoch: a start with bad WAL options must not
  // fence the node's running process and then give up.
  wal::WriterOptions wal_options = options.wal;
  wal_options.node = options.node;
  WEIR_RETURN_IF_ERROR(wal::ValidateWriterOptions(wal_options));
  std::unique_ptr<Engine> e(new Engine(std::move(options), std::move(store), std::move(meta)));
  try {
    WEIR_RETURN_IF_ERROR(e->Recover());
  } catch (const std::system_error& ex) {  // a thread that could not start
    return ResourceExhausted("starting the engine: {}", ex.what());
  }
  return e;
}

// The object naming the metastore a store is served with: two metastores
// over one store would each take the other's segments for garbage (stream
// ids and epochs repeat across metastores) and delete them.
constexpr std::string_view kDeploymentKey = "_weir/deployment";

Status Engine::CheckDeployment(objstore::ObjectStore& store, std::string_view what, const std::string& key) {
  WEIR_ASSIGN_OR_RETURN(const uint64_t id, meta_->DeploymentId());
  const std::string ours = fmt::format("{:016x}\n", id);
  for (int attempt = 1;; ++attempt) {
    auto found = store.Get(key);
    if (found.ok()) {
      if (*found == ours) return Status::Ok();
      std::string theirs = found->substr(0, 64);
      while (!theirs.empty() && (theirs.back() == '\n' || theirs.back() == '\r')) theirs.pop_back();
      return PreconditionFailed(
          "the {} {} is used with another metastore: its {} names deployment \"{}\", and the metastore {} "
          "is deployment {:016x}. Point --metastore at the one this store was used with, or use another bucket, "
          "prefix or database (if this metastore is that one, restored from a backup older than the marker, "
          "delete the object {} and start again)",
          what, store.Describe(), key, theirs, meta_->Describe(), id, key);
    }
    if (found.status().code() != Code::kNotFound) {
      return found.status().WithContext(fmt::format("reading the deployment marker of the {} {}", what, store.Describe()));
    }
    if (attempt == 1 && &store == store_.get()) WEIR_RETURN_IF_ERROR(CheckUnmarkedStoreIsOurs(key, id));
    // Unclaimed (a new store, or one from before the marker): ours, unless
    // another metastore's server claims it first. The claim is read back,
    // whatever its answer: one whose outcome is unknown may have landed, and
    // a store that emulates create-only PUTs (HEAD, then PUT) lets two
    // claims both succeed (the last one holds).
    Status put = store.Put(key, ours, objstore::PutOptions{.if_none_match = true});
    if (put.ok() && attempt < 3) continue;
    if (put.ok()) return Status::Ok();
    const bool read_back = put.code() == Code::kPreconditionFailed || put.code() == Code::kTimeout ||
                           put.code() == Code::kUnavailable;
    if (read_back && attempt < 3) continue;
    if (put.retryable() || put.code() == Code::kIOError) {
      // A store refusing writes now (the WAL will say so too): the marker
      // guards, it holds no data; the next start claims the store.
      Log().warn("could not write the deployment marker {} to the {} {}: {}", key, what,
                 store.Describe(), put.ToString());
      return Status::Ok();
    }
    return put.WithContext(fmt::format("writing the deployment marker to the {} {}", what, store.Describe()));
  }
}

// An object store without the marker that holds nothing at all, while the
// metastore says records are there (segments it indexes, or, with the WAL
// in the object store, a node whose heartbeat is set: stopped without
// settling all it acknowledged, or live), is not this metastore's store: a
// mistyped bucket or prefix, a store emptied or made again. Served, its
// fences would move the nodes' checkpoints past their WAL, and the next
// start on the right store would delete those slots as settled.
Status Engine::CheckUnmarkedStoreIsOurs(const std::string& key, uint64_t id) {
  WEIR_ASSIGN_OR_RETURN(const auto any, store_->List("", "", 1));
  if (!any.objects.empty()) return Status::Ok();
  std::string what;
  WEIR_ASSIGN_OR_RETURN(const auto segments, meta_->ListSegmentsFrom(0, 0, 1));
  if (!segments.empty()) what = fmt::format("indexes segments in it (e.g. {})", segments.front().object_key);
  if (what.empty() && !options_.wal_store) {
    WEIR_ASSIGN_OR_RETURN(const auto nodes, meta_->ListNodes());
    for (const auto& n : nodes) {
      if (n.heartbeat_ms <= 0) continue;
      what = fmt::format("has node {} holding records in its WAL there (its heartbeat is set: it is live, or "
                         "stopped without settling all it acknowledged)",
                         n.node);
      break;
    }
  }
  if (what.empty()) return Status::Ok();
  return PreconditionFailed(
      "the object store {} is empty (not even its deployment marker {}), but the metastore {} {}: it is not the "
      "store this metastore was used with (a mistyped bucket or prefix, or a store emptied or made again). "
      "Point --object-store at the right one; to serve this metastore from this store anyway (what the "
      "metastore holds there is lost), write the line \"{:016x}\" to the object {} and start again",
      store_->Describe(), key, meta_->Describe(), what, id, key);
}

// A --wal-store is shared state as the object store is: two deployments on
// one (a PostgreSQL database, the same buckets) would write the same slot
// keys for a node id, and one's sweep would delete the other's unsettled
// slots. The marker is the node's (deployments with distinct node ids may
// share a WAL store: their slot keys differ). Each store of a quorum
// carries it; up to K-W of them may fail to answer (as they may for slots).
Status Engine::CheckWalStoreDeployment() {
  if (!options_.wal_store) return Status::Ok();
  std::vector<objstore::ObjectStore*> stores;
  size_t may_fail = 0;
  if (auto* quorum = dynamic_cast<wal::QuorumStore*>(wal_store_.get())) {
    for (size_t i = 0; i < quorum->store_count(); ++i) stores.push_back(&quorum->store(i));
    may_fail = quorum->store_count() - quorum->write_quorum();
  } else {
    stores.push_back(wal_store_.get());
  }
  size_t failed = 0;
  for (objstore::ObjectStore* s : stores) {
    Status st = CheckDeployment(*s, fmt::format("WAL store of node {}", options_.node),
                                fmt::format("_weir/wal-deployment/{}", options_.node));
    if (st.ok()) continue;
    if (st.code() == Code::kPreconditionFailed || ++failed > may_fail) return st;
    Log().warn("{} (the quorum's other stores answered)", st.ToString());
  }
  return Status::Ok();
}

std::string Engine::WalStoreMarkerKey() const { return fmt::format("_weir/wal-store/{}", options_.node); }

namespace {
// No marker means the object store (the default, and every build before
// the marker): a moved data dir or a renamed bucket is still the same WAL.
constexpr std::string_view kSameStore = "the object store";
}  // namespace

std::string Engine::OurWalStore() const {
  return options_.wal_store ? wal_store_->Location() : std::string(kSameStore);
}

Result<std::string> Engine::RecordedWalStore(const std::string& node) const {
  const std::string key = fmt::format("_weir/wal-store/{}", node);
  auto found = store_->Get(key);
  if (!found.ok() && found.status().code() != Code::kNotFound) {
    return found.status().WithContext("reading " + key);
  }
  std::string theirs = found.ok() ? *found : std::string(kSameStore);
  while (!theirs.empty() && (theirs.back() == '\n' || theirs.back() == '\r')) theirs.pop_back();
  return theirs;
}

Status Engine::CheckTakeoverWalStores() {
  WEIR_ASSIGN_OR_RETURN(const std::vector<metastore::NodeState> nodes, meta_->ListNodes());
  const std::string ours = OurWalStore();
  for (const metastore::NodeState& n : nodes) {
    if (n.node == options_.node || n.heartbeat_ms == 0 || !n.takeover) continue;  // as TakeOverDeadNodes
    WEIR_ASSIGN_OR_RETURN(const std::string theirs, RecordedWalStore(n.node));
    if (theirs == ours) continue;
    return PreconditionFailed(
        "node {} stopped without settling everything it acknowledged, so this start must take its WAL over, "
        "and node {}'s WAL is in {} where this start's WAL store is {}: start with --wal-store as node {} had "
        "it (this start changed nothing)",
        n.node, n.node, theirs, ours, n.node);
  }
  return Status::Ok();
}

Result<std::optional<std::string>> Engine::CheckWalStore(const metastore::NodeState& prev) {
  const std::string key = WalStoreMarkerKey();
  const std::string ours = OurWalStore();
  WEIR_ASSIGN_OR_RETURN(const std::string theirs, RecordedWalStore(options_.node));
  if (theirs == ours) return std::optional<std::string>();
  if (prev.epoch != 0) {
    // A clean stop clears the heartbeat once everything is settled: then
    // nothing is left in the old WAL store.
    if (prev.heartbeat_ms != 0) {
      return PreconditionFailed(
          "node {}'s WAL is in {}, and this start's WAL store is {}: the node is running, or stopped without "
          "settling everything it acknowledged, so its unsettled records are only there. Start it with its "
          "earlier WAL store (--wal-store as before) and stop it cleanly before changing it (or, to start "
          "without what it left unsettled, replace the object {} in {} with the line \"{}\")",
          options_.node, theirs, ours, key, store_->Describe(), ours);
    }
    Log().info("node {}: the WAL moves from {} to {}", options_.node, theirs, ours);
  }
  if (taking_over_) return std::optional<std::string>();  // recorded by the node's own starts only
  return std::optional<std::string>(ours + "\n");
}

Status Engine::Recover() {
  WEIR_ASSIGN_OR_RETURN(metastore::NodeState prev, meta_->GetNode(options_.node));
  if (prev.epoch == 0) {
    // A metastore that never saw this node over a store holding its WAL, or
    // a metastore that never had a stream over a store holding segments: a
    // reset or mismatched metastore. Starting would write epoch 1's slots
    // and new segments where old ones are (or replay them into new streams).
    WEIR_ASSIGN_OR_RETURN(auto slots, wal_store_->List(fmt::format("wal/{}/", options_.node), "", 1));
    std::optional<std::string> found;
    if (!slots.objects.empty()) found = slots.objects.front().key;
    WEIR_ASSIGN_OR_RETURN(uint64_t last_stream_id, meta_->LastStreamId());
    if (!found && last_stream_id == 0) {
      WEIR_ASSIGN_OR_RETURN(auto segments, store_->List("seg/", "", 1));
      if (!segments.objects.empty()) found = segments.objects.front().key;
    }
    if (found) {
      return PreconditionFailed(
          "the {} {} holds {} ({}), but the metastore has no record of node {}{}: it is not the "
          "metastore this store was used with, or it was reset. Point --metastore at the right one, or empty the "
          "store (or use another prefix) to start afresh",
          found->starts_with("wal/") && options_.wal_store ? "WAL store" : "object store",
          found->starts_with("wal/") ? wal_store_->Describe() : store_->Describe(),
          found->starts_with("wal/") ? "this node's WAL" : "settled segments", *found,
          options_.node, last_stream_id == 0 ? " or of any stream" : "");
    }
  }
  if (!taking_over_) {
    WEIR_RETURN_IF_ERROR(CheckDeployment(*store_, "object store", std::string(kDeploymentKey)));
    WEIR_RETURN_IF_ERROR(CheckWalStoreDeployment());
  }
  WEIR_ASSIGN_OR_RETURN(const std::optional<std::string> wal_marker, CheckWalStore(prev));
  if (!taking_over_) {
    // Asked again (in the heartbeat's transaction) after the mint, for a
    // start racing this one; asked first so that a start refused mints no
    // epoch (each would cost the next start a fence of its chain).
    const int64_t live_ms = std::chrono::duration_cast<std::chrono::milliseconds>(options_.node_live_window).count();
    WEIR_RETURN_IF_ERROR(meta_->CheckNoOtherLiveNode(options_.node, std::max<int64_t>(1, live_ms)));
    // Likewise a takeover this start could not do (TakeOverDeadNodes, after
    // the mint, checks again): refused after the mint, the start left its
    // heartbeat and WAL store recorded, which held up every later start.
    WEIR_RETURN_IF_ERROR(CheckTakeoverWalStores());
  }
  uint32_t window = static_cast<uint32_t>(options_.wal.window);
  // This process's nonce: its mints and its fences carry it.
  nonce_ = RandomNonce();
  WEIR_ASSIGN_OR_RETURN(metastore::NodeState now,
                        meta_->MintEpoch(options_.node, prev.epoch, window, MinterOf(nonce_, prev.epoch + 1)));
  epoch_ = now.epoch;
  if (!taking_over_) {
    // No other node may be serving this metastore (its streams would have two
    // sequencers). Renewed from here on: recovery may take longer than the window.
    WEIR_RETURN_IF_ERROR(Heartbeat(true));
    if (options_.heartbeat_interval > Duration::zero()) heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
    // Recorded once the node is this process's (a start racing it cannot
    // have changed the record since: its mint would have failed, or ours).
    if (wal_marker) {
      // A plain overwrite: safe to send again after a timeout.
      Status put;
      Duration backoff = std::chrono::milliseconds(20);
      for (int attempt = 1;; ++attempt) {
        put = store_->Put(WalStoreMarkerKey(), *wal_marker);
        if (put.ok() || !put.retryable() || attempt == 8) break;
        std::this_thread::sleep_for(backoff);
        backoff = std::min<Duration>(backoff * 2, std::chrono::seconds(1));
      }
      WEIR_RETURN_IF_ERROR(put.WithContext("recording the WAL store"));
    }
    // Before the streams load: they must include what dead nodes acknowledged.
    WEIR_RETURN_IF_ERROR(TakeOverDeadNodes());
  }
  // The checkpoint as of the mint, not as read before it: a process of this
  // node still running may have settled (and deleted slots) in between, and
  // the fence must start at its chain's live part, or that process is never
  // fenced. After the mint it can settle no more (CommitSettle checks the epoch).
  const auto checkpoint = now.checkpoint;

  // Read before the streams: every id up to it is loaded below or was
  // deleted, which tells the start's sweep whose segments are garbage.
  WEIR_ASSIGN_OR_RETURN(last_stream_id_at_start_, meta_->LastStreamId());
  // Streams as of their last settle.
  WEIR_RETURN_IF_ERROR(LoadStreams());

  // Fence and replay every earlier epoch of this node from the checkpoint.
  const uint64_t nonce = nonce_;
  wal::RetryPolicy retry;
  // Slots read at once, each up to the slot cap: within the WAL's memory
  // budget (32 at the defaults), at least 2.
  retry.parallelism = static_cast<int>(
      std::clamp<size_t>(options_.wal.budget_bytes / std::max<size_t>(options_.wal.slot_cap_bytes, 1), 2, 32));
  uint64_t first = std::max<uint64_t>(checkpoint.epoch, 1);
  uint64_t slots = 0;
  for (uint64_t e = first; e < epoch_; ++e) {
    wal::ChainRef chain{options_.node, e};
    uint64_t from = e == checkpoint.epoch ? checkpoint.seq : 0;
    auto fenced = wal::FenceAndWalk(*wal_store_, chain, from, nonce,
                          [&](uint64_t seq, const wal::SlotIndex& index, std::string_view bytes) {
                            ++slots;
                            for (const auto& c : index.chunks) {
                              size_t pos = c.offset;
                              Status bs = wal::ForEachBatch(
                                  bytes.substr(c.offset, c.length),
                                  [&](const wal::BatchHeader& h, std::string_view batch) {
                                    wal::AckInfo where{e, seq, pos, static_cast<uint32_t>(batch.size())};
                                    pos += h.total_size();
                                    return ReplayBatch(c.stream_id, batch, where);
                                  });
                              if (!bs.ok()) return bs;
                            }
                            return Status::Ok();
                          }, retry);
    if (!fenced.ok()) return fenced.status().WithContext(fmt::format("replaying WAL epoch {}", e));
    const wal::FenceResult& fence = *fenced;
    epoch_cuts_[e] = fence.cut;
    uint64_t garbage_window = e + 1 == epoch_ && prev.window > 0 ? prev.window : window;
    std::unique_lock settle(settle_mu_);
    if (!DeleteGarbageIfStillOurs(chain, fence.cut, garbage_window)) {
      return SupersededError(options_.node).WithContext(fmt::format("replaying WAL epoch {}", e));
    }
  }
  if (first < epoch_) {
    Log().info("node {} recovered epochs {}..{} ({} slots), now epoch {}", options_.node, first, epoch_ - 1, slots,
               epoch_);
  } else {
    Log().info("node {}: nothing to recover, now epoch {}", options_.node, epoch_);
  }
  for (auto& [id, s] : by_id_) s->durable_trim_point = s->live.trim_point;  // all of it is durable

  wal::WriterOptions wo = options_.wal;
  wo.node = options_.node;
  wo.epoch = epoch_;
  wo.first_seq = 0;
  wo.on_halt = [this](uint64_t epoch, uint64_t, const Status&) {
    // A new halt can only follow the previous handler's Resume, its last step;
    // joined outside mu_, which that handler's acknowledgements may need.
    std::thread previous;
    {
      std::lock_guard lk(mu_);
      if (closing_) return;
      previous = std::move(halt_thread_);
    }
    if (previous.joinable()) previous.join();
    std::lock_guard lk(mu_);
    if (closing_) return;  // Close joins only a thread it finds here
    try {
      halt_thread_ = std::thread([this, epoch] { HandleHalt(epoch); });
    } catch (const std::system_error& e) {
      // On a WAL upload thread: nothing may escape. The writer stays halted.
      Log().error("WAL halted at epoch {}, and its handler thread could not start ({}): this node takes no "
                  "appends until it restarts",
                  epoch, e.what());
    }
  };
  evict_thread_ = std::thread([this] { EvictLoop(); });
  WEIR_ASSIGN_OR_RETURN(wal_, wal::Writer::Start(wal_store_, wo));
  checkpoint_ = checkpoint;
  Status swept = SweepGarbage();
  if (!swept.ok()) Log().warn("sweeping garbage: {}", swept.ToString());
  last_retention_ = Now();
  if (options_.settle_interval > Duration::zero()) settle_thread_ = std::thread([this] { SettleLoop(); });
  return Status::Ok();
}

Status Engine::TakeOverDeadNodes() {
  WEIR_ASSIGN_OR_RETURN(std::vector<metastore::NodeState> nodes, meta_->ListNodes());
  for (const metastore::NodeState& n : nodes) {
    // A heartbeat still set: that node stopped without settling everything
    // it acknowledged (a clean stop clears it), and it is stale (this start's
    // Heartbeat refused a live one). Its chain is recovered as its own next
    // start would: its epoch is minted (a process of it still running is
    // superseded, and the fence stops its WAL), its slots from the
    // checkpoint are replayed and settled, and its heartbeat is cleared.
    if (n.node == options_.node || n.heartbeat_ms == 0) continue;
    if (!n.takeover) {
      // Left by a build that did not take dead nodes over: others may have
      // served since without its records, so replaying them now could put
      // them after newer ones. Only its own --node-id replays its WAL.
      Log().warn("node {} left its heartbeat set under an older build: it is not taken over (only --node-id {} "
                 "replays its WAL)",
                 n.node, n.node);
      continue;
    }
    Log().warn("node {} left its heartbeat set (it stopped without settling everything it acknowledged, or lost "
               "the metastore): taking over its WAL from epoch {}, checkpoint {}/{}",
               n.node, n.epoch, n.checkpoint.epoch, n.checkpoint.seq);
    EngineOptions o = options_;
    o.node = n.node;
    o.settle_interval = Duration::zero();
    o.merge_interval = Duration::zero();
    o.heartbeat_interval = Duration::zero();
    o.settle_on_close = true;
    std::unique_ptr<Engine> dead(new Engine(std::move(o), store_, meta_));
    dead->taking_over_ = true;
    Status st = dead->Recover();
    if (st.ok()) st = dead->SettleNow();
    dead->Close();  // clears its heartbeat once everything it replayed is settled
    if (!st.ok()) return st.WithContext(fmt::format("taking over the unsettled WAL of node {}", n.node));
  }
  return Status::Ok();
}

bool MayHoldCommands(std::string_view batch) {
  // Walks the records without decoding them: a command record has exactly one
  // header, whose key is empty. Malformed batches answer true. Compressed
  // ones answer false: weir writes command records uncompressed only, and
  // records of a compressed (Kafka) batch are never commands.
  auto h = wal::ParseBatchHeader(batch);
  if (!h.ok()) return true;
  if (h->compression() != 0) return false;
  ByteReader r(batch.substr(wal::kRecordBatchHeaderSize, h->total_size() - wal::kRecordBatchHeaderSize));
  for (int32_t i = 0; i < h->record_count; ++i) {
    int64_t len = 0, key_len = 0, value_len = 0, headers = 0, ts = 0, off = 0;
    uint8_t attrs = 0;
    if (!r.GetVarint(&len) || len < 0) return true;
    size_t end = r.position() + static_cast<size_t>(len);
    if (!r.GetU8(&attrs) || !r.GetVarint(&ts) || !r.GetVarint(&off) || !r.GetVarint(&key_len)) return true;
    if (key_len > 0 && !r.Skip(static_cast<size_t>(key_len))) return true;
    if (!r.GetVarint(&value_len)) return true;
    if (value_len > 0 && !r.Skip(static_cast<size_t>(value_len))) return true;
    if (!r.GetVarint(&headers)) return true;
    if (headers == 1) {
      int64_t hk = 0;
      if (!r.GetVarint(&hk) || hk == 0) return true;
    }
    if (end < r.position() || !r.Skip(end - r.position())) return true;
  }
  return false;
}

Status ApplyBatch(StreamFacts* f, std::string_view batch, bool verified, bool commands) {
  WEIR_ASSIGN_OR_RETURN(wal::BatchHeader h, verified ? wal::ParseBatchHeader(batch) : wal::VerifyBatch(batch));
  uint64_t base = static_cast<uint64_t>(h.base_offset);
  uint64_t end = static_cast<uint64_t>(h.last_offset()) + 1;
  if (end <= f->next_offset) return Status::Ok();  // already applied
  if (base != f->next_offset) {
    return Corruption("batch at offset {} does not follow offset {}", base, f->next_offset);
  }
  std::vector<wal::DecodedRecord> records;
  if (commands && MayHoldCommands(batch)) {
    WEIR_ASSIGN_OR_RETURN(records, wal::DecodeRecords(batch));
  }
  for (const auto& r : records) {
    if (!IsCommand(r.record)) continue;
    const auto& cmd = r.record.headers[0].value;
    if (cmd == "fence") f->fencing_token = r.record.value.value_or("");
    if (cmd == "trim" && r.record.value && r.record.value->size() == 8) {
      // As on S2: a trim command can trim through itself, not past itself.
      f->trim_point =
          std::max(f->trim_point, std::min(LoadBE64(r.record.value->data()), static_cast<uint64_t>(r.offset) + 1));
    }
  }
  if (h.producer_id >= 0) {
    f->producers.Record(static_cast<uint64_t>(h.producer_id), h.producer_epoch,
                        ProducerBatch{h.base_sequence, LastSeq(h.base_sequence, h.record_count), base, end,
                                      h.base_timestamp, h.max_timestamp});
  }
  f->next_offset = end;
  f->last_timestamp_ms = std::max(f->last_timestamp_ms, h.max_timestamp);
  return Status::Ok();
}

Result<std::shared_ptr<Engine::Stream>> Engine::MakeStream(metastore::StreamInfo info,
                                                           const metastore::StreamState& st,
                                                           std::vector<metastore::SegmentInfo> segments) {
  auto s = std::make_shared<Stream>();
  s->info = std::move(info);
  s->live.next_offset = s->tail = st.settled_offset;
  s->live.trim_point = s->durable_trim_point = st.trim_point;  // stored: durable
  s->live.fencing_token = st.fencing_token;
  s->live.last_timestamp_ms = s->tail_timestamp_ms = st.last_timestamp_ms;
  WEIR_ASSIGN_OR_RETURN(s->live.producers, ProducerWindows::Deserialize(st.producer_state));
  s->settled = s->live;
  s->segments.Assign(std::move(segments));
  return s;
}

Result<std::shared_ptr<Engine::Stream>> Engine::StreamFromState(const metastore::StreamState& st) {
  WEIR_ASSIGN_OR_RETURN(auto info, meta_->GetStreamById(st.stream_id));
  std::vector<metastore::SegmentInfo> segments;
  for (uint64_t from = 0;;) {
    WEIR_ASSIGN_OR_RETURN(auto segs, meta_->FindSegments(info.id, from, 1000));
    if (segs.empty()) break;
    from = segs.back().end_offset;
    for (auto& seg : segs) segments.push_back(std::move(seg));
  }
  return MakeStream(std::move(info), st, std::move(segments));
}

Status Engine::LoadStreams() {
  const size_t kStreamPage = options_.load_page_streams;
  const size_t kSegmentPage = options_.load_page_segments;
  std::unordered_map<uint64_t, metastore::StreamInfo> rows;
  for (uint64_t after = 0;;) {
    WEIR_ASSIGN_OR_RETURN(auto page, meta_->ListStreamsById(after, kStreamPage));
    if (page.empty()) break;
    after = page.back().id;
    for (auto& info : page) rows.emplace(info.id, std::move(info));
    if (page.size() < kStreamPage) break;
  }
  std::unordered_map<uint64_t, std::vector<metastore::SegmentInfo>> segments;
  for (uint64_t id = 0, from = 0;;) {
    WEIR_ASSIGN_OR_RETURN(auto page, meta_->ListSegmentsFrom(id, from, kSegmentPage));
    if (page.empty()) break;
    id = page.back().stream_id;
    from = page.back().start_offset + 1;
    for (auto& seg : page) segments[seg.stream_id].push_back(std::move(seg));
    if (page.size() < kSegmentPage) break;
  }
  for (uint64_t after = 0;;) {
    WEIR_ASSIGN_OR_RETURN(auto page, meta_->ListStreamStates(after, kStreamPage));
    if (page.empty()) break;
    after = page.back().stream_id;
    for (const auto& st : page) {
      auto row = rows.find(st.stream_id);
      if (row == rows.end()) continue;  // deleted (by a process still serving until this one minted)
      auto seg = segments.find(st.stream_id);
      WEIR_ASSIGN_OR_RETURN(auto s, MakeStream(std::move(row->second), st,
                                               seg == segments.end() ? std::vector<metastore::SegmentInfo>{}
                                                                     : std::move(seg->second)));
      // Under mu_: the heartbeat thread runs already, and a refused beat
      // walks by_id_ (MarkSuperseded).
      std::lock_guard lk(mu_);
      by_name_[{s->info.basin, s->info.name}] = s->info.id;
      by_id_[s->info.id] = std::move(s);
    }
    if (page.size() < kStreamPage) break;
  }
  return Status::Ok();
}

Status Engine::LoadStream(const metastore::StreamState& st) {
  WEIR_ASSIGN_OR_RETURN(auto s, StreamFromState(st));
  std::lock_guard lk(mu_);  // as in LoadStreams
  by_name_[{s->info.basin, s->info.name}] = s->info.id;
  by_id_[s->info.id] = std::move(s);
  return Status::Ok();
}

Status Engine::Adopt(const std::vector<metastore::StreamInfo>& found) {
  Status first_error;
  for (const auto& info : found) {
    {
      std::lock_guard lk(mu_);
      if (by_id_.count(info.id) != 0 || by_name_.count({info.basin, info.name}) != 0) continue;
    }
    auto state = meta_->GetStreamState(info.id);
    auto s = state.ok() ? StreamFromState(*state) : Result<std::shared_ptr<Stream>>(state.status());
    if (!s.ok()) {
      Log().warn("stream {}/{} exists but could not be loaded: {}", info.basin, info.name, s.status().ToString());
      if (first_error.ok()) first_error = s.status().WithContext(fmt::format("loading stream {}", info.name));
      continue;
    }
    std::lock_guard lk(mu_);
    if (by_id_.count(info.id) != 0 || by_name_.count({info.basin, info.name}) != 0) continue;
    Log().info("stream {}/{} (id {}) exists in the metastore but was not loaded: loaded now", info.basin, info.name,
               info.id);
    by_name_[{info.basin, info.name}] = info.id;
    by_id_[info.id] = std::move(*s);
  }
  return first_error;
}

Status Engine::ReplayBatch(uint64_t stream_id, std::string_view batch, const wal::AckInfo& where) {
  auto it = by_id_.find(stream_id);
  if (it == by_id_.end()) {
    // Created after the streams were listed (by a predecessor still serving
    // while this process started, which acknowledged appends to it before
    // the fence), or deleted: the metastore tells.
    if (stream_id <= last_stream_id_at_start_) return Status::Ok();  // listed then if it existed: deleted
    auto st = meta_->GetStreamState(stream_id);
    if (!st.ok() && st.status().code() == Code::kNotFound) return Status::Ok();  // deleted
    if (!st.ok()) return st.status().WithContext(fmt::format("replaying stream {}", stream_id));
    if (Status loaded = LoadStream(*st); loaded.code() == Code::kNotFound) {
      return Status::Ok();  // deleted meanwhile
    } else if (!loaded.ok()) {
      return loaded.WithContext(fmt::format("replaying stream {}", stream_id));
    }
    it = by_id_.find(stream_id);
  }
  Stream& s = *it->second;
  uint64_t before = s.live.next_offset;
  Status st = ApplyBatch(&s.live, batch);
  if (!st.ok()) return st.WithContext(fmt::format("stream {}", stream_id));
  if (s.live.next_offset == before) return Status::Ok();  // already settled
  s.tail = s.live.next_offset;
  s.tail_timestamp_ms = s.live.last_timestamp_ms;
  std::shared_ptr<const std::string> bytes;
  if (cache_bytes_.load() + batch.size() <= options_.log_cache_bytes) {
    bytes = std::make_shared<const std::string>(batch);
    cache_bytes_ += batch.size();
  }
  auto h = wal::ParseBatchHeader(batch);
  // Acknowledged before this start, for how long is not known: due at once
  // (a start replays the same slots again until they settle).
  s.durable.push_back(BatchRef{before, s.live.next_offset, h->max_timestamp, where, std::move(bytes), true, {}});
  unsettled_bytes_ += where.length;
  unsettled_batches_++;
  return Status::Ok();
}

// ---- Basins and streams -------------------------------------------------------

Status Engine::CreateBasin(const std::string& name, const std::string& request_token,
                           const metastore::BasinConfig& config, BasinCreator creator) {
  WEIR_RETURN_IF_ERROR(ValidateBasinName(name));
  const metastore::BasinInfo info{name, WallMillis(), request_token, config};
  const size_t cap = creator == BasinCreator::kClient ? options_.max_basins : SIZE_MAX;
  return AsThisNode([&](const metastore::EpochCheck& by) { return meta_->CreateBasin(info, by, cap); });
}

Status Engine::ReconfigureBasin(const std::string& name, const metastore::BasinConfig& config) {
  return AsThisNode([&](const metastore::EpochCheck& by) { return meta_->ReconfigureBasin(name, config, by); });
}

Result<bool> Engine::CreateIfConfigured(const std::string& basin, const std::string& name, AutoCreate when,
                                        const std::function<Status(const metastore::StreamConfig&)>& admit,
                                        const metastore::StreamConfigLayer& requested) {
  WEIR_ASSIGN_OR_RETURN(metastore::BasinInfo b, meta_->GetBasin(basin));
  const bool wanted =
      when == AutoCreate::kOnAppend ? b.config.create_stream_on_append : b.config.create_stream_on_read;
  if (!wanted) return false;
  const metastore::StreamConfig config = requested.Over(b.config.default_stream_config).Resolve();
  if (admit) WEIR_RETURN_IF_ERROR(admit(config));
  auto created = CreateStream(basin, name, config);
  if (created.ok()) return true;
  if (created.status().code() != Code::kAlreadyExists) return created.status();
  // A racing create won, and registered the stream before we could look (CreateStream).
  return HasStream(basin, name);
}

bool Engine::HasStream(const std::string& basin, const std::string& name) {
  std::lock_guard lk(mu_);
  return by_name_.count({basin, name}) != 0;
}

std::optional<uint64_t> Engine::StreamIdOf(const std::string& basin, const std::string& name) {
  std::lock_guard lk(mu_);
  auto it = by_name_.find({basin, name});
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

Result<std::string> Engine::CreateToken(const std::string& basin, const std::string& stream) {
  return meta_->CreateToken(basin, stream);
}

Result<std::vector<metastore::BasinInfo>> Engine::ListBasins(const std::string& prefix, const std::string& start_after,
                                                             size_t limit) {
  return meta_->ListBasins(prefix, start_after, limit);
}

Result<metastore::BasinInfo> Engine::GetBasin(const std::string& name) { return meta_->GetBasin(name); }

Status Engine::DeleteBasin(const std::string& name) {
  return AsThisNode([&](const metastore::EpochCheck& by) { return meta_->DeleteBasin(name, by); });
}

Status Engine::CheckAppendRecords(const std::vector<AppendRecord>& records) const {
  if (records.empty()) return InvalidArgument("an append needs at least one record");
  if (records.size() > options_.max_append_records) {
    return InvalidArgument("an append holds at most {} records, got {}", options_.max_append_records, records.size());
  }
  size_t metered = 0;
  for (const auto& r : records) metered += MeteredBytes(r);
  if (metered > options_.max_append_bytes) {
    return InvalidArgument("an append holds at most {} metered bytes, got {}", options_.max_append_bytes, metered);
  }
  for (size_t i = 0; i < records.size(); ++i) {
    const AppendRecord& r = records[i];
    const bool command = r.headers.size() == 1 && r.headers[0].key.empty();  // IsCommand, before encoding
    if (!command) {
      for (size_t h = 0; h < r.headers.size(); ++h) {
        if (r.headers[h].key.empty()) {
          return InvalidArgument("record {}: header {} has an empty name, which only a command record (one "
                                 "header) may have",
                                 i, h);
        }
      }
      continue;
    }
    const auto& cmd = r.headers[0].value;
    if (cmd == "fence") {
      if (r.body.size() > 36) return InvalidArgument("record {}: a fencing token is at most 36 bytes", i);
      // As S2: a token is text (an append's fencing_token could never match one that is not).
      if (!IsValidUtf8(r.body)) return InvalidArgument("record {}: a fencing token must be UTF-8", i);
    } else if (cmd == "trim") {
      if (r.body.size() != 8) {
        return InvalidArgument("record {}: a trim command's body is an 8-byte big-endian offset", i);
      }
    } else {
      return InvalidArgument("record {}: unknown command \"{}\"", i, cmd.value_or(""));
    }
  }
  return Status::Ok();
}

namespace {
Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const Result<T>& r) {
  return r.status();
}
}  // namespace

std::optional<bool> Engine::LearnIfSuperseded() {
  if (superseded_) return true;
  auto node = meta_->GetNode(options_.node);
  if (!node.ok()) return std::nullopt;
  if (node->epoch <= epoch_.load()) return false;
  Log().error("node {} was superseded (its epoch is now {}, this process holds {}): settle, merges and retention "
              "stop",
              options_.node, node->epoch, epoch_.load());
  MarkSuperseded();
  return true;
}

bool Engine::NoteIfSuperseded(const Status& st) {
  return st.code() == Code::kPreconditionFailed && LearnIfSuperseded().value_or(false);
}

bool Engine::CreatedObjectsAreOurs(const Status& refused) {
  // Refused past the epoch check (which comes first): a stream gone, a row
  // already there or malformed.
  if (refused.code() != Code::kPreconditionFailed) return true;
  return HoldsItsNode();
}

bool Engine::HoldsItsNode() {
  const std::optional<bool> superseded = LearnIfSuperseded();
  return superseded.has_value() && !*superseded;
}

bool Engine::TryNoteIfSuperseded(const Status& st) {
  std::unique_lock settle(settle_mu_, std::try_to_lock);
  return settle.owns_lock() && NoteIfSuperseded(st);
}

void Engine::MarkSuperseded() {
  if (superseded_.exchange(true)) return;
  {
    std::lock_guard lk(backlog_mu_);  // appends waiting for settle room: none will come
    backlog_cv_.notify_all();
  }
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lk(mu_);
    streams.reserve(by_id_.size());
    for (const auto& [id, s] : by_id_) streams.push_back(s);
  }
  // Set before each stream's lock is taken: a read or watch that locks it
  // after this sees the flag; one that waited before is woken here.
  for (const auto& s : streams) {
    std::map<uint64_t, std::pair<uint64_t, TailCallback>> watchers;
    {
      std::lock_guard lk(s->mu);
      s->cv.notify_all();
      watchers.swap(s->watchers);
    }
    for (auto& [id, w] : watchers) w.second();
  }
  std::lock_guard lk(on_superseded_mu_);
  superseded_announced_ = true;
  if (on_superseded_) on_superseded_();
}

void Engine::OnSuperseded(std::function<void()> fn) {
  std::lock_guard lk(on_superseded_mu_);
  on_superseded_ = std::move(fn);
  // Before that, MarkSuperseded runs it (once).
  if (on_superseded_ && superseded_announced_) on_superseded_();
}

Status Engine::RefuseIfSuperseded(std::string_view what) const {
  if (!superseded_) return Status::Ok();
  return PreconditionFailed("no {}: node {} was superseded by another process", what, options_.node);
}

template <typename Change>
auto Engine::AsThisNode(Change change) -> decltype(change(metastore::EpochCheck{})) {
  for (int attempt = 1;; ++attempt) {
    const uint64_t epoch = epoch_.load();
    auto done = change(metastore::EpochCheck{options_.node, epoch});
    const Status st = StatusOf(done);
    // A halt may have minted this process's next epoch meanwhile: once more with it.
    if (st.code() == Code::kPreconditionFailed && attempt == 1 && epoch_.load() != epoch) continue;
    if (st.code() == Code::kPreconditionFailed) {
      // Superseded (a successor minted a later epoch): not a conflict the
      // client made, and this process will serve no more.
      auto node = meta_->GetNode(options_.node);
      if (node.ok() && node->epoch != epoch_.load()) {
        // Learnt now rather than at the next heartbeat (no caller holds settle_mu_).
        TryNoteIfSuperseded(st);
        return Unavailable("node {} was superseded (its epoch is now {}, this process holds {}): {}", options_.node,
                           node->epoch, epoch_.load(), st.message());
      }
    }
    return done;
  }
}

Status Engine::RunAsThisNode(const std::function<Status(const metastore::EpochCheck&)>& change) {
  return AsThisNode([&](const metastore::EpochCheck& by) { return change(by); });
}

namespace {

// After a create that failed with `failed`, the row may be there anyway: this
// create's answer was lost, or an earlier one's (whose stream never loaded),
// or another process of this node made it. `load` looks the row up and loads
// what it names, so a thing that exists is never left unfindable until a
// restart. Returns the row when it is this create's (`ours`) and loaded: the
// create landed. Otherwise `failed`, and the next create of the name loads
// what `load` could not. Looks only once no commit is in flight (a create
// whose answer was lost may still be committing).
template <class Load, class Ours>
auto ResolveFailedCreate(metastore::Metastore& meta, const Status& failed, Load load, Ours ours) -> decltype(load()) {
  if (failed.code() == Code::kInvalidArgument || failed.code() == Code::kNotFound) return failed;
  if (!meta.AwaitCommitsInFlight().ok()) return failed;
  auto row = load();
  if (!row.ok()) return failed;
  if (failed.code() != Code::kAlreadyExists && ours(*row)) return row;
  return failed;
}

}  // namespace

Result<metastore::StreamInfo> Engine::CreateStream(const std::string& basin, const std::string& name,
                                                   const metastore::StreamConfig& config,
                                                   const std::string& request_token) {
  WEIR_RETURN_IF_ERROR(ValidateStreamName(name));
  // Kafka resolves a partition by its stream's name: a plain stream there
  // would take a topic's name (or take Kafka's records as one).
  if (!options_.group_offsets_basin.empty() && basin == options_.group_offsets_basin) {
    return PreconditionFailed("basin {} holds Kafka topics, whose partitions are its streams: create a topic "
                              "(Kafka CreateTopics, or a table through Arrow Flight) instead of stream {}",
                              basin, name);
  }
  // Create and register as one step, so a create that finds the name taken
  // (CreateIfConfigured losing a race) finds the stream registered too.
  std::lock_guard create(create_mu_);
  // A name that exists needs no room: the create answers kAlreadyExists
  // (a request token's retry, a racing create-on-append).
  StreamRoom room(this);
  if (!HasStream(basin, name)) WEIR_RETURN_IF_ERROR(room.Reserve(1, fmt::format("stream {}/{}", basin, name)));
  metastore::StreamInfo info;
  info.basin = basin;
  info.name = name;
  info.config = config;
  info.created_at_ms = WallMillis();
  info.request_token = request_token;
  auto created = AsThisNode([&](const metastore::EpochCheck& by) { return meta_->CreateStream(info, by); });
  if (created.ok()) {
    Register({*created}, &room);
    return created;
  }
  return ResolveFailedCreate(
      *meta_, created.status(),
      [&]() -> Result<metastore::StreamInfo> {
        WEIR_ASSIGN_OR_RETURN(metastore::StreamInfo row, meta_->GetStream(basin, name));
        std::lock_guard tables(tables_mu_);  // a table's bucket is created and deleted under it
        WEIR_RETURN_IF_ERROR(Adopt({row}));
        return row;
      },
      [&](const metastore::StreamInfo& row) {
        return row.created_at_ms == info.created_at_ms && row.config == info.config;
      });
}

void Engine::Register(const std::vector<metastore::StreamInfo>& created, StreamRoom* room) {
  std::lock_guard lk(mu_);
  if (room) room->ReleaseLocked();
  for (const auto& info : created) {
    // Never replaces a stream object appends may already hold.
    if (by_id_.count(info.id) != 0) continue;
    auto s = std::make_shared<Stream>();
    s->info = info;
    by_name_[{info.basin, info.name}] = info.id;
    by_id_[info.id] = std::move(s);
  }
}

Result<std::shared_ptr<Engine::Stream>> Engine::Find(const std::string& basin, const std::string& name) {
  if (superseded_) return SupersededError(options_.node);
  return FindAny(basin, name);
}

Result<std::shared_ptr<Engine::Stream>> Engine::FindAny(const std::string& basin, const std::string& name) {
  std::lock_guard lk(mu_);
  auto it = by_name_.find({basin, name});
  if (it == by_name_.end()) return NotFound("stream \"{}\" not found in basin \"{}\"", name, basin);
  return by_id_.at(it->second);
}

Result<StreamSummary> Engine::GetStream(const std::string& basin, const std::string& name) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, name));
  std::lock_guard lk(s->mu);
  return StreamSummary{s->info, s->tail, s->tail_timestamp_ms, s->durable_trim_point, s->live.fencing_token, LogStart(*s)};
}

Result<std::vector<metastore::StreamInfo>> Engine::ListStreams(const std::string& basin, const std::string& prefix,
                                                               const std::string& start_after, size_t limit) {
  return meta_->ListStreams(basin, prefix, start_after, limit);
}

Status Engine::ReconfigureStream(const std::string& basin, const std::string& name,
                                 const metastore::StreamConfig& config) {
  return ReconfigureStream(basin, name, [&](const metastore::StreamConfig&) { return config; }).status();
}

Result<metastore::StreamConfig> Engine::ReconfigureStream(
    const std::string& basin, const std::string& name,
    const std::function<Result<metastore::StreamConfig>(const metastore::StreamConfig&)>& change) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, name));
  std::lock_guard config_lk(config_mu_);
  WEIR_RETURN_IF_ERROR(RefuseUnknownConfigsLocked({s}));
  metastore::StreamConfig old;
  {
    std::lock_guard lk(s->mu);
    old = s->info.config;
  }
  WEIR_ASSIGN_OR_RETURN(const metastore::StreamConfig config, change(old));
  Status changed =
      AsThisNode([&](const metastore::EpochCheck& by) { return meta_->UpdateStreamConfig(s->info.id, config, by); });
  if (!changed.ok()) {
    AfterFailedConfigChange({s}, changed);
    return changed;
  }
  std::lock_guard lk(s->mu);
  s->info.config = config;
  s->config_unknown = false;
  return config;
}

void Engine::AfterFailedConfigChange(const std::vector<std::shared_ptr<Stream>>& streams, const Status& failed) {
  // Refused: nothing changed (kPreconditionFailed: the epoch check; a
  // superseded process gets kUnavailable, and serves no more anyway).
  if (failed.code() == Code::kInvalidArgument || failed.code() == Code::kNotFound ||
      failed.code() == Code::kPreconditionFailed) {
    return;
  }
  ReloadConfigsLocked(streams);
}

void Engine::ReloadConfigsLocked(const std::vector<std::shared_ptr<Stream>>& streams) {
  Status failed = meta_->AwaitCommitsInFlight();
  for (const auto& s : streams) {
    // After the first failure, the rest are marked unknown without a read
    // (each would wait out the same unreachable metastore).
    Result<metastore::StreamInfo> row = failed;
    if (failed.ok()) row = meta_->GetStreamById(s->info.id);
    std::lock_guard lk(s->mu);
    if (row.ok()) {
      s->info.config = row->config;
      s->config_unknown = false;
      continue;
    }
    if (failed.ok()) failed = row.status();
    if (!s->config_unknown) {
      Log().warn("stream {}/{}: a config change may have landed ({}); retention expires nothing of it, and it is "
                 "neither deleted when empty nor reconfigured, until its stored config is read",
                 s->info.basin, s->info.name, failed.ToString());
    }
    s->config_unknown = true;
  }
}

Status Engine::RefuseUnknownConfigsLocked(const std::vector<std::shared_ptr<Stream>>& streams) {
  std::vector<std::shared_ptr<Stream>> unknown;
  for (const auto& s : streams) {
    std::lock_guard lk(s->mu);
    if (s->config_unknown) unknown.push_back(s);
  }
  if (unknown.empty()) return Status::Ok();
  // The change was built on the config memory held; read, it may differ.
  ReloadConfigsLocked(unknown);
  return Unavailable("stream {}/{}: an earlier config change's answer was lost, and its stored config is read "
                     "again now; retry",
                     unknown.front()->info.basin, unknown.front()->info.name);
}

Result<uint64_t> Engine::TrimTo(const std::string& basin, const std::string& name, uint64_t offset) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, name));
  {
    std::lock_guard lk(s->mu);
    if (s->deleted) return NotFound("stream \"{}\" was deleted", name);
    if (offset > s->tail) return OutOfRange("offset {} is past the tail {}", offset, s->tail);
    // At or below a durable trim point there is nothing to store (a trim
    // command still pending might fail, so live.trim_point is no guide).
    if (offset <= s->durable_trim_point) return LogStart(*s);
  }
  // Stored first (settle commits never lower it), then applied: reads stop
  // returning the records only once the trim survives a restart. A
  // superseded process gets kUnavailable.
  Status stored = AsThisNode([&](const metastore::EpochCheck& by) {
    return meta_->RaiseTrimPoint(by.node, by.epoch, s->info.id, offset);
  });
  if (!stored.ok()) {
    // Its answer may have been lost with the trim stored: memory takes the
    // stored trim point (once a commit in flight has ended), so reads do not
    // return until a restart what a restart would then drop. If it cannot be
    // read, memory keeps the lower one (records kept a little longer).
    const Code c = stored.code();
    if (c != Code::kInvalidArgument && c != Code::kNotFound && c != Code::kPreconditionFailed &&
        c != Code::kOutOfRange && meta_->AwaitCommitsInFlight().ok()) {
      if (auto state = meta_->GetStreamState(s->info.id); state.ok()) {
        std::lock_guard lk(s->mu);
        s->live.trim_point = std::max(s->live.trim_point, state->trim_point);
        s->durable_trim_point = std::max(s->durable_trim_point, state->trim_point);
      }
    }
    return stored;
  }
  std::lock_guard lk(s->mu);
  s->live.trim_point = std::max(s->live.trim_point, offset);
  s->durable_trim_point = std::max(s->durable_trim_point, offset);
  return LogStart(*s);
}

Status Engine::DeleteStream(const std::string& basin, const std::string& name) {
  auto found = Find(basin, name);
  if (!found.ok() && found.status().code() == Code::kNotFound) {
    // A row memory does not hold (a create whose answer was lost, say) is
    // loaded, so it can be deleted like any other. Under create_mu_, as
    // creates load and register: never one stream object for another.
    std::lock_guard create(create_mu_);
    std::lock_guard tables(tables_mu_);  // a table's bucket is created and deleted under it
    found = Find(basin, name);
    if (!found.ok() && found.status().code() == Code::kNotFound) {
      if (auto row = meta_->GetStream(basin, name); row.ok()) {
        WEIR_RETURN_IF_ERROR(Adopt({*row}));
        found = Find(basin, name);
      }
    }
  }
  WEIR_ASSIGN_OR_RETURN(auto s, std::move(found));
  auto deleted = AsThisNode([&](const metastore::EpochCheck& by) { return meta_->DeleteStream(s->info.id, by); });
  if (!deleted.ok()) {
    // Its row may be gone anyway (an answer lost; kNotFound: such an earlier
    // delete): then it is forgotten as on success, never left to acknowledge
    // appends whose rows settle would skip.
    std::vector<std::string> held = AfterFailedDelete(s);
    if (!IsForgotten(*s)) return deleted.status();
    DeleteObjects(std::move(held), fmt::format("segments of stream {}", name));
    return Status::Ok();
  }
  std::vector<std::string> keys = std::move(*deleted);
  // Gone from memory at once: a settle round committing from now on (its
  // rows of this stream are skipped) sees it deleted and removes its segment.
  std::vector<std::string> held = Forget(s);
  keys.insert(keys.end(), held.begin(), held.end());
  DeleteObjects(std::move(keys), fmt::format("segments of stream {}", name));
  return Status::Ok();
}

void Engine::DeleteObjects(std::vector<std::string> keys, std::string_view what, bool expired) {
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  if (keys.empty()) return;
  Status st = store_->DeleteMany(keys);
  if (st.ok()) {
    if (expired) metrics_.segments_deleted.fetch_add(keys.size());
    return;
  }
  metrics_.segment_delete_failures.fetch_add(1);
  size_t kept = 0;
  {
    std::lock_guard lk(undeleted_mu_);
    for (std::string& key : keys) {
      if (undeleted_objects_.size() >= kMaxUndeletedObjects) break;
      if (undeleted_objects_.emplace(std::move(key), expired).second) ++kept;
    }
    metrics_.segments_undeleted.store(static_cast<int64_t>(undeleted_objects_.size()));
  }
  Log().warn("deleting {} ({} objects): {}; {} of them are tried again by the next retention pass{}", what,
             keys.size(), st.ToString(), kept, kept < keys.size() ? ", the rest by the next start's sweep" : "");
}

void Engine::RetryUndeletedObjects() {
  std::vector<std::pair<std::string, bool>> retry;
  {
    std::lock_guard lk(undeleted_mu_);
    if (undeleted_objects_.empty()) return;
    for (const auto& entry : undeleted_objects_) {
      if (retry.size() >= kUndeletedRetryPerPass) break;
      retry.push_back(entry);
    }
  }
  // In chunks, each let go once deleted: a key the store keeps refusing
  // holds back only its own chunk.
  for (size_t begin = 0; begin < retry.size(); begin += kUndeletedRetryChunk) {
    const size_t end = std::min(retry.size(), begin + kUndeletedRetryChunk);
    std::vector<std::string> keys;
    for (size_t i = begin; i < end; ++i) keys.push_back(retry[i].first);
    if (Status st = store_->DeleteMany(keys); !st.ok()) {
      metrics_.segment_delete_failures.fetch_add(1);
      Log().warn("deleting {} segment objects whose deletes failed before: {}", keys.size(), st.ToString());
      continue;
    }
    size_t expired_deleted = 0;
    std::lock_guard lk(undeleted_mu_);
    for (size_t i = begin; i < end; ++i) {
      expired_deleted += retry[i].second ? 1 : 0;
      undeleted_objects_.erase(retry[i].first);
    }
    metrics_.segments_deleted.fetch_add(expired_deleted);
    metrics_.segments_undeleted.store(static_cast<int64_t>(undeleted_objects_.size()));
  }
}

Result<bool> Engine::StreamRowGone(const Stream& s) {
  WEIR_RETURN_IF_ERROR(meta_->AwaitCommitsInFlight());  // the delete may still be committing
  auto row = meta_->GetStreamById(s.info.id);
  if (row.ok()) return false;
  if (row.status().code() == Code::kNotFound) return true;
  return row.status();
}

std::vector<std::string> Engine::AfterFailedDelete(const std::shared_ptr<Stream>& s) {
  Result<bool> gone = StreamRowGone(*s);
  if (gone.ok() && *gone) return Forget(s);
  std::lock_guard lk(s->mu);
  s->delete_unknown = !gone.ok();
  if (!gone.ok()) {
    Log().warn("stream {}/{}: a delete may have landed ({}); refusing appends until that is known",
               s->info.basin, s->info.name, gone.status().ToString());
  }
  return {};
}

bool Engine::IsForgotten(Stream& s) {
  std::lock_guard lk(s.mu);
  return s.deleted;
}

std::vector<std::string> Engine::Forget(const std::shared_ptr<Stream>& s) {
  std::map<uint64_t, std::pair<uint64_t, TailCallback>> watchers;
  std::vector<std::string> held;
  uint64_t released = 0, released_batches = 0;
  {
    std::lock_guard lk(s->mu);
    if (s->deleted) return {};  // forgotten already (by a racing delete)
    s->deleted = true;
    s->cv.notify_all();
    watchers.swap(s->watchers);
    for (const auto& seg : s->segments) held.push_back(seg.object_key);
    // Its unsettled batches will never settle: they leave the cache and the backlog.
    for (const BatchRef& b : s->durable) {
      if (b.bytes) cache_bytes_ -= b.bytes->size();
      released += b.where.length;
    }
    released_batches = s->durable.size();
    s->durable.clear();
  }
  {
    std::lock_guard lk(mu_);
    // The name may already belong to a stream created since (a new id).
    auto it = by_name_.find({s->info.basin, s->info.name});
    if (it != by_name_.end() && it->second == s->info.id) by_name_.erase(it);
    by_id_.erase(s->info.id);
  }
  if (released_batches > 0) SettledBytes(released, released_batches);
  for (auto& [id, w] : watchers) w.second();
  return held;
}

void Engine::SettledBytes(uint64_t n, uint64_t batches) {
  unsettled_bytes_ -= n;
  unsettled_batches_ -= batches;
  std::lock_guard lk(backlog_mu_);
  backlog_cv_.notify_all();
}

bool Engine::BacklogFull() const {
  return unsettled_bytes_.load(std::memory_order_relaxed) > options_.max_unsettled_bytes ||
         unsettled_batches_.load(std::memory_order_relaxed) > options_.max_unsettled_batches;
}

bool Engine::AdmissionMayWait(size_t bytes) const {
  if (BacklogFull()) return true;
  if (!wal_) return false;
  const auto pooled = static_cast<uint64_t>(std::max<int64_t>(wal_->metrics().pool_bytes.load(), 0));
  // A margin of one slot: the pool fills by many appends at once.
  return pooled + bytes + options_.wal.slot_cap_bytes > options_.wal.budget_bytes;
}

namespace {
// Admission is looked at first after the shortest interval, then at twice
// the last, up to the longest: a short wait costs little latency, a long
// one little CPU.
constexpr Duration kAdmissionLookFirst = std::chrono::milliseconds(1);
constexpr Duration kAdmissionLookMax = std::chrono::milliseconds(16);

struct AdmissionLook {
  Engine* engine;
  size_t bytes, appends;
  TimePoint deadline;
  Engine::AfterFn after;
  std::function<bool()> abandon;
  std::function<void(Engine::AdmissionWait, std::shared_ptr<AdmissionTicket>)> ready;
  Duration interval = kAdmissionLookFirst;
  bool waited = false;  // the first look found no room (counted as a wait)
};

void LookAgain(const std::shared_ptr<AdmissionLook>& w);

// Whether the wait is over (and `ready` called).
bool Look(const std::shared_ptr<AdmissionLook>& w) {
  using W = Engine::AdmissionWait;
  auto& m = w->engine->metrics();
  if (w->abandon && w->abandon()) {
    if (w->waited) m.admission_waits_abandoned.fetch_add(1, std::memory_order_relaxed);
    w->ready(W::kAbandoned, nullptr);
  } else if (auto ticket = w->engine->TryAdmission(w->bytes, w->appends)) {
    w->ready(W::kRoom, std::move(ticket));
  } else if (Now() >= w->deadline) {
    m.admission_wait_timeouts.fetch_add(1, std::memory_order_relaxed);
    w->ready(W::kExpired, nullptr);
  } else {
    return false;
  }
  return true;
}

void LookAgain(const std::shared_ptr<AdmissionLook>& w) {
  w->engine->HurrySettleIfBehind();
  const Duration delay = w->interval;
  w->interval = std::min(w->interval * 2, kAdmissionLookMax);
  w->after(delay, [w] {
    if (!Look(w)) LookAgain(w);
  });
}
}  // namespace

void Engine::WhenAdmissible(size_t bytes, size_t appends, TimePoint deadline, AfterFn after,
                            std::function<bool()> abandon,
                            std::function<void(AdmissionWait, std::shared_ptr<AdmissionTicket>)> ready) {
  auto w = std::make_shared<AdmissionLook>(
      AdmissionLook{this, bytes, appends, deadline, std::move(after), std::move(abandon), std::move(ready)});
  if (Look(w)) return;
  w->waited = true;
  (BacklogFull() ? metrics_.admission_waits_backlog : metrics_.admission_waits_pool)
      .fetch_add(1, std::memory_order_relaxed);
  LookAgain(w);
}

void Engine::HurrySettleIfBehind() {
  if (BacklogFull()) RequestSettle();
}

bool Engine::FitsPoolAtOnce(size_t bytes, size_t appends) const {
  return !wal_ || bytes + appends * wal::Writer::kEntryOverhead <= options_.wal.budget_bytes;
}

Engine::AdmissionGroup Engine::NextAdmissionGroup(size_t from, size_t count,
                                                  const std::function<size_t(size_t)>& room_of) const {
  AdmissionGroup g{from + 1, room_of(from)};
  for (; g.end < count; ++g.end) {
    const size_t next = room_of(g.end);
    if (!FitsPoolAtOnce(g.bytes + next, g.end + 1 - from)) break;
    g.bytes += next;
  }
  return g;
}

std::shared_ptr<AdmissionTicket> Engine::TryAdmission(size_t bytes, size_t appends) {
  // Closing or superseded: no room will come; the appends are refused at once.
  if (closing_.load() || superseded_.load()) return std::make_shared<AdmissionTicket>(std::nullopt);
  if (BacklogFull()) return nullptr;
  // Never all at once: each append then takes (or not) its own room.
  if (!wal_ || !FitsPoolAtOnce(bytes, appends)) return std::make_shared<AdmissionTicket>(std::nullopt);
  auto room = wal_->TryReserve(bytes, appends);
  // No room now; none ever once the WAL was abandoned (a halt that could
  // not resume): refused at once then, as when closing.
  if (!room) return wal_->takes_no_appends() ? std::make_shared<AdmissionTicket>(std::nullopt) : nullptr;
  return std::make_shared<AdmissionTicket>(std::move(room));
}

Status Engine::WaitForSettleRoom(TimePoint deadline) {
  if (!BacklogFull()) return Status::Ok();
  RequestSettle();
  std::unique_lock lk(backlog_mu_);
  // A superseded process settles no more: it waits no longer (Find refuses).
  bool room = backlog_cv_.wait_until(lk, deadline, [&] {
    return closing_ || superseded_ || !BacklogFull();
  });
  if (room) return Status::Ok();
  metrics_.settle_backlog_timeouts.fetch_add(1, std::memory_order_relaxed);
  return ResourceExhausted(
      "{} bytes in {} batches are acknowledged but not yet settled (limits {} bytes, {} batches): settle is behind; "
      "retry later",
      unsettled_bytes_.load(), unsettled_batches_.load(), options_.max_unsettled_bytes, options_.max_unsettled_batches);
}

namespace {
// Bumps Engine::tables_version_ when a table change ends, whatever its outcome.
// A local of the table-changing Engine method (its caller's thread, under tables_mu_);
// the bump runs in its destructor, so an early return or an error still makes it.
struct TablesChange {
  explicit TablesChange(std::atomic<uint64_t>* v) : version(v) {}
  ~TablesChange() { version->fetch_add(1, std::memory_order_acq_rel); }
  TablesChange(const TablesChange&) = delete;
  TablesChange& operator=(const TablesChange&) = delete;
  std::atomic<uint64_t>* version;
};
}  // namespace

Result<metastore::TableInfo> Engine::CreateTable(const metastore::TableInfo& table,
                                                 const metastore::StreamConfig& config) {
  if (table.name.empty() || table.name.find('/') != std::string::npos) {
    return InvalidArgument("table name \"{}\" must be non-empty and must not contain '/'", table.name);
  }
  WEIR_RETURN_IF_ERROR(ValidateStreamName(metastore::BucketStreamName(table.name, table.bucket_count)));
  std::lock_guard tables(tables_mu_);
  // A table that exists needs no room (its create answers kAlreadyExists).
  StreamRoom room(this);
  if (table.bucket_count > 0 && !HasStream(table.basin, metastore::BucketStreamName(table.name, 0))) {
    WEIR_RETURN_IF_ERROR(room.Reserve(table.bucket_count, fmt::format("table {}/{}", table.basin, table.name)));
  }
  TablesChange change(&tables_version_);
  metastore::TableInfo t = table;
  t.created_at_ms = WallMillis();
  auto created = AsThisNode([&](const metastore::EpochCheck& by) { return meta_->CreateTable(t, config, by); });
  if (created.ok()) {
    Register(created->second, &room);
    return created->first;
  }
  return ResolveFailedCreate(
      *meta_, created.status(), [&] { return AdoptTableLocked(t.basin, t.name); },
      [&](const metastore::TableInfo& row) { return row.created_at_ms == t.created_at_ms; });
}

size_t Engine::stream_count() {
  std::lock_guard lk(mu_);
  return by_id_.size();
}

Status Engine::CheckStreamRoom(size_t n, std::string_view what) {
  return StreamRoom(this).Reserve(n, what, /*count=*/false);
}

Status Engine::StreamRoom::Reserve(size_t n, std::string_view what, bool count) {
  std::lock_guard lk(e_->mu_);
  const size_t held = e_->by_id_.size() + e_->streams_reserved_;
  if (held + n > e_->options_.max_streams) {
    if (count) e_->metrics_.stream_creates_refused.fetch_add(1, std::memory_order_relaxed);
    return QuotaExhausted("creating {} needs {} stream{}, and this server holds {} of its {} (--max-streams)", what, n,
                          n == 1 ? "" : "s", held, e_->options_.max_streams);
  }
  e_->streams_reserved_ += n;
  n_ += n;
  return Status::Ok();
}

void Engine::StreamRoom::ReleaseLocked() {
  e_->streams_reserved_ -= n_;
  n_ = 0;
}

Engine::StreamRoom::~StreamRoom() {
  if (n_ == 0) return;
  std::lock_guard lk(e_->mu_);
  ReleaseLocked();
}

Result<metastore::TableInfo> Engine::AdoptTableLocked(const std::string& basin, const std::string& name) {
  WEIR_ASSIGN_OR_RETURN(metastore::TableInfo table, meta_->GetTable(basin, name));
  std::vector<metastore::StreamInfo> buckets;
  for (uint32_t b = 0; b < table.bucket_count; ++b) {
    WEIR_ASSIGN_OR_RETURN(metastore::StreamInfo s, meta_->GetStream(basin, metastore::BucketStreamName(name, b)));
    buckets.push_back(std::move(s));
  }
  WEIR_RETURN_IF_ERROR(Adopt(buckets));
  return table;
}

bool Engine::LacksBuckets(const metastore::TableInfo& table) {
  if (table.bucket_count == 0) return false;
  std::pair<std::string, std::string> last{table.basin, metastore::BucketStreamName(table.name, table.bucket_count - 1)};
  std::lock_guard lk(mu_);
  return by_name_.count(last) == 0;
}

Status Engine::LoadTable(const std::string& basin, const std::string& name) {
  std::lock_guard tables(tables_mu_);
  return AdoptTableLocked(basin, name).status();
}

Result<metastore::TableInfo> Engine::GetTable(const std::string& basin, const std::string& name) {
  constexpr size_t kTableCacheEntries = 10000;
  auto key = std::make_pair(basin, name);
  {
    std::lock_guard lk(table_cache_mu_);
    if (table_cache_version_ == tables_version_.load(std::memory_order_acquire)) {
      if (auto it = table_cache_.find(key); it != table_cache_.end()) return it->second;
    }
  }
  std::lock_guard tables(tables_mu_);
  // No change is in progress: what is read holds until the next one ends.
  const uint64_t version = tables_version_.load(std::memory_order_acquire);
  auto table = meta_->GetTable(basin, name);
  // Buckets the metastore has and memory lacks: a create or a bucket increase
  // whose answer was lost and could not be read back then (the metastore
  // away). Loaded now, or every append and read of them would fail until a
  // restart; until they are, the table is not remembered.
  bool loaded = true;
  if (table.ok() && LacksBuckets(*table)) {
    if (Status st = AdoptTableLocked(basin, name).status(); !st.ok()) {
      Log().warn("table {}/{}: loading buckets memory lacks: {}", basin, name, st.ToString());
      loaded = false;
    }
  }
  // A missing table is remembered only under a name a table could have
  // (clients send any name: at most 10,000 entries of about 1 KiB each).
  constexpr size_t kLongestName = 512;
  if ((table.ok() && loaded) ||
      (table.status().code() == Code::kNotFound && basin.size() + name.size() <= kLongestName)) {
    std::lock_guard lk(table_cache_mu_);
    if (table_cache_version_ != version || table_cache_.size() >= kTableCacheEntries) {
      table_cache_.clear();
      table_cache_version_ = version;
    }
    table_cache_.insert_or_assign(std::move(key), table);
  }
  return table;
}

Result<std::vector<metastore::TableInfo>> Engine::ListTables(const std::string& basin, const std::string& prefix,
                                                             const std::string& start_after, size_t limit) {
  std::lock_guard tables(tables_mu_);
  return meta_->ListTables(basin, prefix, start_after, limit);
}

Result<metastore::TableInfo> Engine::AddTableBuckets(const std::string& basin, const std::string& name,
                                                     uint32_t new_bucket_count) {
  WEIR_RETURN_IF_ERROR(ValidateStreamName(metastore::BucketStreamName(name, new_bucket_count)));
  std::lock_guard tables(tables_mu_);
  TablesChange change(&tables_version_);
  WEIR_ASSIGN_OR_RETURN(auto table, meta_->GetTable(basin, name));
  WEIR_ASSIGN_OR_RETURN(auto first, GetStream(basin, metastore::BucketStreamName(name, 0)));
  StreamRoom room(this);
  if (new_bucket_count > table.bucket_count) {
    WEIR_RETURN_IF_ERROR(room.Reserve(new_bucket_count - table.bucket_count,
                                      fmt::format("{} more buckets of table {}/{}",
                                                  new_bucket_count - table.bucket_count, basin, name)));
  }
  const int64_t now_ms = WallMillis();
  auto added = AsThisNode([&](const metastore::EpochCheck& by) {
    return meta_->AddBuckets(table.id, new_bucket_count, first.info.config, now_ms, by);
  });
  if (added.ok()) {
    Register(added->second, &room);
    return added->first;
  }
  return ResolveFailedCreate(
      *meta_, added.status(), [&] { return AdoptTableLocked(basin, name); },
      [&](const metastore::TableInfo& row) { return row.id == table.id && row.bucket_count == new_bucket_count; });
}

Status Engine::ReconfigureTable(const std::string& basin, const std::string& name, const std::string& config,
                                const std::function<metastore::StreamConfig(const metastore::StreamConfig&)>& apply) {
  std::lock_guard tables(tables_mu_);
  TablesChange change(&tables_version_);
  std::lock_guard config_lk(config_mu_);
  WEIR_ASSIGN_OR_RETURN(auto table, meta_->GetTable(basin, name));
  std::vector<std::shared_ptr<Stream>> buckets;
  std::vector<std::pair<uint64_t, metastore::StreamConfig>> configs;
  for (uint32_t b = 0; b < table.bucket_count; ++b) {
    WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, metastore::BucketStreamName(name, b)));
    std::lock_guard lk(s->mu);
    configs.emplace_back(s->info.id, apply(s->info.config));
    buckets.push_back(std::move(s));
  }
  WEIR_RETURN_IF_ERROR(RefuseUnknownConfigsLocked(buckets));
  Status changed = AsThisNode(
      [&](const metastore::EpochCheck& by) { return meta_->UpdateTableConfig(table.id, config, configs, by); });
  if (!changed.ok()) {
    AfterFailedConfigChange(buckets, changed);
    return changed;
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    std::lock_guard lk(buckets[i]->mu);
    buckets[i]->info.config = configs[i].second;
    buckets[i]->config_unknown = false;
  }
  return Status::Ok();
}

Status Engine::DeleteTable(const std::string& basin, const std::string& name) {
  std::vector<std::string> keys;
  Status failed;
  {
    std::lock_guard tables(tables_mu_);
    TablesChange change(&tables_version_);
    WEIR_ASSIGN_OR_RETURN(auto table, meta_->GetTable(basin, name));
    // Found before the delete, forgotten right after it (as DeleteStream), and
    // only then their objects deleted.
    std::vector<std::shared_ptr<Stream>> buckets;
    for (uint32_t b = 0; b < table.bucket_count; ++b) {
      auto s = Find(basin, metastore::BucketStreamName(name, b));
      if (s.ok()) buckets.push_back(std::move(*s));
    }
    const bool topic = !options_.group_offsets_basin.empty() && basin == options_.group_offsets_basin;
    auto deleted =
        AsThisNode([&](const metastore::EpochCheck& by) { return meta_->DeleteTable(table.id, topic, by); });
    if (!deleted.ok()) {
      // As DeleteStream: buckets whose rows are gone anyway are forgotten.
      bool all = true;
      for (const auto& s : buckets) {
        std::vector<std::string> held = AfterFailedDelete(s);
        keys.insert(keys.end(), held.begin(), held.end());
        all = all && IsForgotten(*s);
      }
      if (!all || buckets.empty()) failed = deleted.status();
    } else {
      keys = std::move(*deleted);
    }
    for (const auto& s : buckets) {
      if (!failed.ok()) break;
      std::vector<std::string> held = Forget(s);
      keys.insert(keys.end(), held.begin(), held.end());
    }
  }
  // Nothing refers to them any more: deleted without holding table changes
  // (and offset commits, WithTablesSteady) off for as long as the store takes.
  DeleteObjects(std::move(keys), fmt::format("segments of table {}", name));
  return failed;
}

Result<uint64_t> Engine::AllocateProducerId() {
  WEIR_ASSIGN_OR_RETURN(const uint64_t id, meta_->AllocateProducerId());
  SeeProducerIds(id);
  return id;
}

Result<bool> Engine::ProducerIdAllocated(uint64_t id) {
  if (id == 0) return false;
  if (KnowsProducerId(id)) return true;
  WEIR_ASSIGN_OR_RETURN(const uint64_t last, meta_->LastProducerId());
  SeeProducerIds(last);
  return id <= last;
}

void Engine::SeeProducerIds(uint64_t up_to) {
  uint64_t seen = producer_ids_seen_.load();
  while (seen < up_to && !producer_ids_seen_.compare_exchange_weak(seen, up_to)) {
  }
}

// ---- Appends ------------------------------------------------------------------

// At least the size EncodeRecordBatch gives `records` (every varint counted
// at its widest): what an append reserves in the WAL pool before it encodes.
size_t Engine::AdmissionBytes(const std::vector<AppendRecord>& records) {
  size_t n = wal::kRecordBatchHeaderSize;
  for (const AppendRecord& r : records) {
    n += 64 + (r.key ? r.key->size() : 0) + r.body.size();
    for (const wal::RecordHeader& h : r.headers) n += 20 + h.key.size() + (h.value ? h.value->size() : 0);
  }
  return n;
}

std::optional<AppendOutcome> Engine::RefusedByANewStream(const AppendOptions& options, size_t count) {
  // AppendAsync's checks, in its order, against an empty stream.
  if (options.producer) {
    const ProducerRef& p = *options.producer;
    auto check = ProducerWindows{}.Check(p.id, p.epoch, p.seq, static_cast<int32_t>(count), p.unknown_starts_anywhere);
    if (!check.ok()) {
      return AppendOutcome{check.status(), {}, std::nullopt, std::nullopt};
    }
  }
  if (options.fencing_token && !options.fencing_token->empty()) {
    return AppendOutcome{PreconditionFailed("fencing token mismatch"), {}, std::nullopt, std::string()};
  }
  if (options.match_seq_num && *options.match_seq_num != 0) {
    return AppendOutcome{PreconditionFailed("match_seq_num {} does not match the tail 0", *options.match_seq_num),
                         {},
                         uint64_t{0},
                         std::nullopt};
  }
  return std::nullopt;
}

bool Engine::AppendAsync(const std::string& basin, const std::string& stream, std::vector<AppendRecord> records,
                         const AppendOptions& options, AppendCallback done) {
  auto fail = [&](Status st) {
    done(AppendOutcome{std::move(st), {}, std::nullopt, std::nullopt});
    return false;
  };
  if (Status checked = CheckAppendRecords(records); !checked.ok()) return fail(checked);
  if (options.producer && options.producer->id > static_cast<uint64_t>(INT64_MAX)) {
    // Batches carry it as Kafka's signed producer id: above this it would
    // read as none, and the window would not survive settle or a restart.
    return fail(InvalidArgument("producer id {} is above {}", options.producer->id, INT64_MAX));
  }
  auto admitted =
      Admit(basin, stream, options.producer, records.size(), AdmissionBytes(records), options.may_wait, done,
            options.ticket.get(), options.stream_id);
  if (!admitted) return false;
  std::shared_ptr<Stream> s = std::move(admitted->stream);
  auto& room = admitted->room;

  std::unique_lock lk(s->mu);
  if (s->deleted) {
    lk.unlock();  // callbacks never run under a stream lock
    return fail(NotFound("stream \"{}\" was deleted", stream));
  }
  if (s->deleting) {
    lk.unlock();
    done(DeletionPending(stream));
    return false;
  }
  if (s->delete_unknown) {
    lk.unlock();
    return fail(Unavailable("stream \"{}\" may have been deleted (the metastore's answer was lost); retry", stream));
  }
  // A producer's retry of an accepted batch gets that batch's ack, whatever
  // the fencing token and tail are now; the conditions apply to new batches.
  if (options.producer && HandledByProducerWindow(lk, s, *options.producer, records.size(), done)) return false;
  // A refusal that names a state still on its way to the WAL waits for it
  // (or gets its failure): the tail or token it names is then real.
  auto refuse = [&](AppendOutcome o) {
    if (!s->pending.empty()) {
      s->pending.back()->refusals.emplace_back(std::move(done), std::move(o));
      return true;
    }
    lk.unlock();
    done(std::move(o));
    return true;
  };
  if (options.fencing_token && *options.fencing_token != s->live.fencing_token) {
    return refuse(AppendOutcome{PreconditionFailed("fencing token mismatch"), {}, std::nullopt, s->live.fencing_token});
  }
  if (options.match_seq_num && *options.match_seq_num != s->live.next_offset) {
    return refuse(AppendOutcome{PreconditionFailed("match_seq_num {} does not match the tail {}",
                                                   *options.match_seq_num, s->live.next_offset),
                                {}, s->live.next_offset, std::nullopt});
  }

  // Timestamps: per the stream's mode, capped at arrival unless uncapped, and
  // never below the stream's last timestamp.
  const metastore::StreamConfig& cfg = s->info.config;
  if (Status st = CheckClientTimestamps(cfg, records); !st.ok()) {
    lk.unlock();
    return fail(st);
  }
  int64_t arrival = WallMillis();
  int64_t last_ts = s->live.last_timestamp_ms;
  std::vector<wal::Record> recs(records.size());
  bool commands = false;
  std::string token = s->live.fencing_token;
  uint64_t trim_point = s->live.trim_point;
  for (size_t i = 0; i < records.size(); ++i) {
    AppendRecord& in = records[i];
    int64_t ts = arrival;
    if (cfg.timestamping != metastore::TimestampingMode::kArrival && in.timestamp_ms) {
      ts = cfg.uncapped_timestamps ? *in.timestamp_ms : std::min(*in.timestamp_ms, arrival);
    }
    ts = std::max(ts, last_ts);
    last_ts = ts;
    wal::Record& r = recs[i];
    r.timestamp = ts;
    r.key = std::move(in.key);
    r.headers = std::move(in.headers);
    r.value = std::move(in.body);
    if (IsCommand(r)) {  // checked by CheckAppendRecords: a fence or a trim, well formed
      commands = true;
      if (r.headers[0].value == "fence") {
        token = *r.value;
      } else {
        trim_point = std::max(trim_point, std::min(LoadBE64(r.value->data()), s->live.next_offset + i + 1));
      }
    }
  }

  wal::EncodeOptions eo;
  eo.base_offset = static_cast<int64_t>(s->live.next_offset);
  if (options.producer) {
    eo.producer_id = static_cast<int64_t>(options.producer->id);
    eo.producer_epoch = options.producer->epoch;
    eo.base_sequence = options.producer->seq;
  }
  std::string batch;
  Status st = wal::EncodeRecordBatch(recs, eo, &batch);
  if (!st.ok()) {
    lk.unlock();
    return fail(st);
  }
  Submit(lk, s, std::move(batch), recs.size(), recs.front().timestamp, last_ts, options.producer, std::move(token),
         trim_point, std::move(done), room, /*log_append_time=*/false, commands);
  return false;
}

std::optional<Engine::Admitted> Engine::Admit(const std::string& basin, const std::string& stream,
                                              const std::optional<ProducerRef>& producer, size_t count, size_t bytes,
                                              bool may_wait, AppendCallback& done, AdmissionTicket* ticket,
                                              std::optional<uint64_t> stream_id) {
  auto fail = [&](Status st) {
    AppendOutcome o{std::move(st), {}, std::nullopt, std::nullopt};
    o.not_admitted = true;
    done(std::move(o));
    return std::nullopt;
  };
  // A pinned stream is looked up first, once: another stream of the name
  // is not this append's (not found, whatever its windows or room would
  // answer); one deleted during the waits is refused by the caller.
  std::shared_ptr<Stream> pinned;
  if (stream_id) {
    auto found = FindAs(basin, stream, stream_id);
    if (!found.ok()) return fail(found.status());
    pinned = std::move(*found);
  }
  auto find = [&]() -> Result<std::shared_ptr<Stream>> {
    if (pinned) return pinned;
    return Find(basin, stream);
  };
  if (producer && DuplicateAnsweredBeforeAdmission(basin, stream, *producer, count, bytes, done)) return std::nullopt;
  // Room waited for and held (the settle backlog had room then): no wait.
  if (auto held = ticket ? ticket->Take(bytes) : std::nullopt) {
    auto found = find();
    if (!found.ok()) return fail(found.status());
    return Admitted{std::move(*found), std::move(*held)};
  }
  // One admission_timeout for both waits (settle room, then pool budget).
  const TimePoint admit_by = may_wait ? Now() + options_.admission_timeout : Now();
  if (Status room = WaitForSettleRoom(admit_by); !room.ok()) return fail(room);
  auto found = find();
  if (!found.ok()) return fail(found.status());
  auto room = wal_->Reserve(bytes, admit_by);
  if (!room.ok()) {
    AppendOutcome o{room.status(), {}, std::nullopt, std::nullopt};
    o.too_large = room.status().code() == Code::kInvalidArgument;  // past the whole budget
    o.not_admitted = true;
    done(std::move(o));
    return std::nullopt;
  }
  return Admitted{std::move(*found), std::move(*room)};
}

bool Engine::DuplicateAnsweredBeforeAdmission(const std::string& basin, const std::string& stream,
                                              const ProducerRef& p, size_t count, size_t bytes, AppendCallback& done) {
  return AdmissionMayWait(bytes) && AnswerDuplicate(basin, stream, p, count, done);
}

bool Engine::AnswerDuplicate(const std::string& basin, const std::string& stream, const ProducerRef& p, size_t count,
                             AppendCallback& done) {
  auto found = Find(basin, stream);
  if (!found.ok()) return false;  // the full path answers
  const std::shared_ptr<Stream>& s = *found;
  std::unique_lock lk(s->mu);
  if (s->deleted || s->deleting || s->delete_unknown) return false;
  // Only duplicates: a refusal (a gap, say) could change once batches
  // waiting for admission ahead of this one are in.
  auto check = s->live.producers.Check(p.id, p.epoch, p.seq, static_cast<int32_t>(count), p.unknown_starts_anywhere);
  if (!check.ok() || check->kind != ProducerCheck::kDuplicate) return false;
  return HandledByProducerWindow(lk, s, p, count, done);
}

AppendOutcome Engine::DeletionPending(const std::string& stream) {
  AppendOutcome o{Unavailable("stream \"{}\" is being deleted (delete_on_empty)", stream), {}, std::nullopt,
                  std::nullopt};
  o.deletion_pending = true;
  o.not_admitted = true;  // nothing was written
  return o;
}

bool Engine::ProducerWindowHolds(const std::string& basin, const std::string& stream, const ProducerRef& p,
                                 size_t count) {
  auto found = Find(basin, stream);
  if (!found.ok()) return false;
  std::lock_guard lk((*found)->mu);
  auto check = (*found)->live.producers.Check(p.id, p.epoch, p.seq, static_cast<int32_t>(count), p.unknown_starts_anywhere);
  return check.ok() && check->kind == ProducerCheck::kDuplicate;
}

bool Engine::AnswerRetriedBatch(const std::string& basin, const std::string& stream, std::string_view batch,
                                AppendCallback& done) {
  auto h = wal::ParseBatchHeader(batch);
  if (!h.ok() || h->producer_id < 0 || h->record_count <= 0) return false;
  const ProducerRef p{static_cast<uint64_t>(h->producer_id), h->producer_epoch, h->base_sequence, true};
  const auto count = static_cast<size_t>(h->record_count);
  // The look first, so a new batch is not checked twice (here and on append).
  if (!ProducerWindowHolds(basin, stream, p, count) || !CheckBatch(batch).ok()) return false;
  // Whether this batch alone would wait does not matter: its request's do.
  return AnswerDuplicate(basin, stream, p, count, done);
}

bool Engine::AnswerRetriedAppend(const std::string& basin, const std::string& stream,
                                 const std::vector<AppendRecord>& records, const AppendOptions& options,
                                 AppendCallback& done) {
  if (!options.producer || records.empty() || options.producer->id > static_cast<uint64_t>(INT64_MAX)) return false;
  const ProducerRef& p = *options.producer;
  if (!ProducerWindowHolds(basin, stream, p, records.size()) || !CheckAppendRecords(records).ok()) return false;
  return AnswerDuplicate(basin, stream, p, records.size(), done);
}

bool Engine::HandledByProducerWindow(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s,
                                     const ProducerRef& p, size_t count, AppendCallback& done) {
  auto check = s->live.producers.Check(p.id, p.epoch, p.seq, static_cast<int32_t>(count), p.unknown_starts_anywhere);
  if (!check.ok()) {
    AppendOutcome o{check.status(), {}, std::nullopt, std::nullopt};
    o.producer_fenced = check.status().code() == Code::kFenced;
    lk.unlock();
    done(std::move(o));
    return true;
  }
  if (check->kind != ProducerCheck::kDuplicate) return false;
  const ProducerBatch& b = check->original;
  if (b.end_offset <= s->tail) {
    AppendAck ack{b.start_offset, b.end_offset, s->tail, b.first_timestamp_ms, b.last_timestamp_ms, true,
                  LogStart(*s)};
    // As for the original: an arrival-time stream stamped it (Kafka's LogAppendTime).
    ack.log_append_time = s->info.config.timestamping == metastore::TimestampingMode::kArrival;
    ack.tail_timestamp_ms = s->tail_timestamp_ms;
    lk.unlock();
    done(AppendOutcome{Status::Ok(), ack, std::nullopt, std::nullopt});
    return true;
  }
  for (auto& pend : s->pending) {
    if (pend->start == b.start_offset) {
      pend->waiters.emplace_back(std::move(done), true);
      return true;
    }
  }
  // Neither durable nor pending: the original failed as the WAL was
  // abandoned or closed (a halt or shutdown racing this retry), and this
  // process takes no more appends. Retryable, as the original's failure was.
  lk.unlock();
  done(AppendOutcome{Unavailable("the original append of this batch (offset {}) failed as the node stopped taking "
                                 "appends; retry",
                                 b.start_offset),
                     {}, std::nullopt, std::nullopt});
  return true;
}

void Engine::Submit(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s, std::string batch,
                    size_t count, int64_t first_ts, int64_t last_ts, const std::optional<ProducerRef>& producer,
                    std::string token, uint64_t trim_point, AppendCallback done, wal::Writer::Reservation& room,
                    bool log_append_time, bool commands) {
  s->last_append_ms = WallMillis();
  auto pend = std::make_shared<Pending>();
  pend->log_append_time = log_append_time;
  pend->commands = commands;
  pend->start = s->live.next_offset;
  pend->end = s->live.next_offset + count;
  pend->first_timestamp_ms = first_ts;
  pend->last_timestamp_ms = last_ts;
  // One copy of the bytes, shared by the WAL pool and (once durable) the log cache.
  pend->bytes = std::make_shared<const std::string>(std::move(batch));
  pend->waiters.emplace_back(std::move(done), false);
  pend->trim_point = trim_point;
  // Submitting under the stream lock keeps pool order == offset order.
  Status st = wal_->Append(s->info.id, pend->bytes,
                           [this, s, pend](const Status& result, const wal::AckInfo& where) {
                             OnDurable(s, pend, result, where);
                           },
                           &room);
  if (!st.ok()) {
    // The WAL took nothing (the writer stopped, or the batch cannot fit a
    // slot: the batch itself was checked before).
    AppendCallback cb = std::move(pend->waiters.front().first);
    lk.unlock();
    AppendOutcome o{st, {}, std::nullopt, std::nullopt};
    o.not_admitted = true;
    o.too_large = st.code() == Code::kInvalidArgument;
    return cb(std::move(o));
  }
  // Commit the sequencer state only once the WAL has admitted the batch.
  if (producer) {
    s->live.producers.Record(producer->id, producer->epoch,
                             ProducerBatch{producer->seq, LastSeq(producer->seq, static_cast<int64_t>(count)),
                                           pend->start, pend->end, first_ts, last_ts});
  }
  s->live.next_offset = pend->end;
  s->live.last_timestamp_ms = std::max(s->live.last_timestamp_ms, last_ts);
  s->live.fencing_token = std::move(token);
  s->live.trim_point = trim_point;
  s->pending.push_back(std::move(pend));
}

Result<Engine::CheckedBatch> Engine::CheckBatch(std::string_view batch) const {
  if (batch.size() > options_.max_batch_bytes) {
    return InvalidArgument("a record batch holds at most {} bytes, got {}", options_.max_batch_bytes, batch.size());
  }
  // The CRC only: fields it covers that make no sense (a negative record
  // count) were sent so, and are refused below as kInvalidArgument.
  WEIR_ASSIGN_OR_RETURN(wal::BatchHeader h, wal::VerifyBatchCrc(batch));
  if (h.total_size() != batch.size()) {
    return InvalidArgument("{} bytes follow the record batch", batch.size() - h.total_size());
  }
  if (h.record_count <= 0 || h.last_offset_delta != h.record_count - 1) {
    return InvalidArgument("record batch: {} records with lastOffsetDelta {}", h.record_count, h.last_offset_delta);
  }
  // The log assigns offsets: a baseOffset sent (producers send 0) is
  // replaced, unchecked, as Kafka's broker does.
  if (h.attributes & (wal::kTransactionalFlag | wal::kControlFlag)) {
    return NotSupported("transactional and control batches are not supported");
  }
  if (h.compression() > 4) return InvalidArgument("unknown compression codec {}", h.compression());
  // The records themselves, decompressed if need be (as Kafka's broker does):
  // a batch stored as sent must be one every reader can decode.
  int64_t max_ts = h.max_timestamp;
  // The records' own times, even under a producer's LogAppendTime bit (which
  // AppendBatchAsync clears, or replaces with the stream's clock).
  wal::BatchHeader created = h;
  created.attributes = static_cast<int16_t>(created.attributes & ~wal::kTimestampLogAppendTime);
  // A batch whose CRC holds but whose records do not parse was built wrong,
  // not damaged on the way: kInvalidArgument (Kafka's INVALID_RECORD, which
  // producers do not retry), not kCorruption (CORRUPT_MESSAGE, retried).
  // Only that: running out of memory to decompress stays retryable.
  // Compressed or not: a command-shaped record in a producer's batch would
  // read as a command that was never applied.
  int32_t command_at = -1;
  if (Status valid = wal::ValidateRecords(created, batch, wal::kMaxDecompressedRecordsBytes, &max_ts, &command_at);
      !valid.ok()) {
    return valid.code() == Code::kCorruption ? InvalidArgument("{}", valid.message()) : valid;
  }
  if (command_at >= 0) {
    return InvalidArgument("record at offset delta {} has one header with an empty name, which is reserved for S2 "
                           "command records",
                           command_at);
  }
  return CheckedBatch{h, max_ts};
}

void Engine::AppendBatchAsync(const std::string& basin, const std::string& stream, std::string batch,
                              AppendCallback done, bool may_wait, std::shared_ptr<AdmissionTicket> ticket) {
  auto fail = [&](Status st) {  // every refusal here comes before offsets
    AppendOutcome o{std::move(st), {}, std::nullopt, std::nullopt};
    o.not_admitted = true;
    done(std::move(o));
  };
  auto checked = CheckBatch(batch);
  if (!checked.ok()) return fail(checked.status());
  wal::BatchHeader h = checked->header;
  // maxTimestamp feeds timestamp lookups and retention: as Kafka's broker
  // does, it is the records' largest, whatever the producer wrote there, and
  // the timestamp type is the stream's, not the producer's (a LogAppendTime
  // bit the producer set would make readers take its maxTimestamp for every
  // record). An arrival-timestamped stream stamps the batch below.
  if ((h.attributes & wal::kTimestampLogAppendTime) || checked->max_timestamp_ms != h.max_timestamp) {
    wal::SetCreateTime(&batch, checked->max_timestamp_ms);
    h.attributes = static_cast<int16_t>(h.attributes & ~wal::kTimestampLogAppendTime);
    h.max_timestamp = checked->max_timestamp_ms;
  }
  std::optional<ProducerRef> producer;
  // Without a producer id the epoch and sequence mean nothing (kafkajs sends
  // 0 and 0 there); Kafka ignores them too.
  if (h.producer_id >= 0) {
    producer = ProducerRef{static_cast<uint64_t>(h.producer_id), h.producer_epoch, h.base_sequence, true};
  }
  auto admitted =
      Admit(basin, stream, producer, static_cast<size_t>(h.record_count), batch.size(), may_wait, done, ticket.get());
  if (!admitted) return;
  std::shared_ptr<Stream> s = std::move(admitted->stream);
  auto& room = admitted->room;

  std::unique_lock lk(s->mu);
  if (s->deleted) {
    lk.unlock();
    return fail(NotFound("stream \"{}\" was deleted", stream));
  }
  if (s->deleting) {
    lk.unlock();
    return done(DeletionPending(stream));
  }
  if (s->delete_unknown) {
    lk.unlock();
    return fail(Unavailable("stream \"{}\" may have been deleted (the metastore's answer was lost); retry", stream));
  }
  if (producer && HandledByProducerWindow(lk, s, *producer, static_cast<size_t>(h.record_count), done)) return;
  int64_t first_ts = h.base_timestamp;
  int64_t last_ts = h.max_timestamp;
  if (s->info.config.timestamping == metastore::TimestampingMode::kArrival) {
    // Kafka's LogAppendTime: the broker's clock stamps the batch, as Kafka's
    // does, not raised to the stream's newest time: a producer's clock far
    // ahead (CreateTime, before the topic switched) would otherwise stamp
    // every later batch in the future, and retention would never expire it.
    last_ts = first_ts = WallMillis();
    wal::SetLogAppendTime(&batch, last_ts);
  }
  wal::SetBaseOffset(&batch, 0, static_cast<int64_t>(s->live.next_offset));
  bool stamped = s->info.config.timestamping == metastore::TimestampingMode::kArrival;
  // CheckBatch refused command-shaped records: none here.
  Submit(lk, s, std::move(batch), static_cast<size_t>(h.record_count), first_ts, last_ts, producer,
         s->live.fencing_token, s->live.trim_point, std::move(done), room, stamped, /*commands=*/false);
}

void Engine::OnDurable(const std::shared_ptr<Stream>& s, const std::shared_ptr<Pending>& p, const Status& st,
                       const wal::AckInfo& where) {
  std::vector<std::pair<AppendCallback, bool>> waiters;
  std::vector<std::pair<AppendCallback, AppendOutcome>> refusals;
  std::vector<TailCallback> woken;
  AppendAck ack;
  Status result = st;
  bool evict = false;
  bool settle_early = false;
  {
    std::lock_guard lk(s->mu);
    // Durable, but in no stream a reader can find (nor will replay): the
    // stream was deleted meanwhile.
    if (st.ok() && s->deleted) result = NotFound("stream \"{}\" was deleted before the append was durable", s->info.name);
    auto it = std::find(s->pending.begin(), s->pending.end(), p);
    if (it != s->pending.end()) s->pending.erase(it);
    waiters = std::move(p->waiters);
    refusals = std::move(p->refusals);
    if (st.ok()) {
      s->tail = p->end;
      // The largest so far (as recovery computes it): Kafka batches need not
      // be in time order.
      s->tail_timestamp_ms = std::max(s->tail_timestamp_ms, p->last_timestamp_ms);
      s->durable_trim_point = std::max(s->durable_trim_point, p->trim_point);
      std::erase_if(s->watchers, [&](auto& w) {
        if (w.second.first >= s->tail) return false;
        woken.push_back(std::move(w.second.second));
        return true;
      });
      size_t size = p->bytes->size();
      // The newest batch is cached even when the cache is full: older ones
      // make room (EvictCache), since tailing readers want the newest.
      bool cache = !s->deleted && size <= options_.log_cache_bytes;
      if (!s->deleted) {  // a deleted stream settles nothing more
        s->durable.push_back(
            BatchRef{p->start, p->end, p->last_timestamp_ms, where, cache ? p->bytes : nullptr, p->commands, Now()});
        unsettled_bytes_ += where.length;
        unsettled_batches_++;
      }
      if (cache) {
        const size_t cached = cache_bytes_ += size;
        if (cached > options_.log_cache_bytes / 4) settle_early = true;
        evict = cached > options_.log_cache_bytes;
      }
      s->cv.notify_all();
      ack = AppendAck{p->start, p->end, s->tail, p->first_timestamp_ms, p->last_timestamp_ms, false, LogStart(*s)};
      ack.log_append_time = p->log_append_time;
      ack.tail_timestamp_ms = s->tail_timestamp_ms;
    }
    p->bytes.reset();
  }
  for (auto& fn : woken) fn();
  for (auto& [cb, dup] : waiters) {
    AppendAck a = ack;
    a.duplicated = dup;
    cb(AppendOutcome{result, a, std::nullopt, std::nullopt});
  }
  for (auto& [cb, refusal] : refusals) {
    if (result.ok()) {
      cb(std::move(refusal));
    } else {
      cb(AppendOutcome{Status(result.code(), fmt::format("nothing of this append was written (its conditions waited "
                                                         "for appends before it, which failed: {})",
                                                         result.message())),
                       {}, std::nullopt, std::nullopt});
    }
  }
  if (settle_early || evict) RequestSettle();
  if (evict) RequestEvict();
}

void Engine::RequestEvict() {
  std::lock_guard lk(evict_wait_mu_);
  if (evict_requested_) return;
  evict_requested_ = true;
  evict_cv_.notify_all();
}

void Engine::EvictLoop() {
  SetThreadName("cache-evict");
  std::unique_lock lk(evict_wait_mu_);
  while (true) {
    evict_cv_.wait(lk, [&] { return evict_stop_ || evict_requested_; });
    if (evict_stop_) return;
    evict_requested_ = false;
    lk.unlock();
    EvictCache();
    lk.lock();
  }
}

void Engine::RequestSettle() {
  if (settle_requested_.exchange(true)) return;
  std::lock_guard lk(settle_wait_mu_);  // so the loop cannot miss the wake-up
  settle_cv_.notify_all();
}

void Engine::EvictCache() {
  // Drops the oldest cached batches across streams (by WAL slot: a stream's
  // batches are in slot order) until the cache is at 3/4 of its budget;
  // tailing readers keep finding the newest. Evicted batches are read back
  // from their WAL slot. Runs on the eviction thread only.
  const size_t goal = options_.log_cache_bytes * 3 / 4;
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lk(mu_);
    if (cache_bytes_.load() <= goal) return;
    for (auto& [id, s] : by_id_) streams.push_back(s);
  }
  // Bytes cached per (stream, slot): a stream's batches in a slot are
  // adjacent, so one entry each, not one per batch. Oldest slot first, the
  // cut is the newest slot to empty.
  struct SlotBytes {
    std::pair<uint64_t, uint64_t> slot;
    size_t bytes;
  };
  std::vector<SlotBytes> per_slot;
  for (auto& s : streams) {
    std::lock_guard lk(s->mu);
    const size_t first = per_slot.size();
    for (const auto& b : s->durable) {
      if (!b.bytes) continue;
      const std::pair slot{b.where.epoch, b.where.seq};
      if (per_slot.size() > first && per_slot.back().slot == slot) {
        per_slot.back().bytes += b.bytes->size();
      } else {
        per_slot.push_back(SlotBytes{slot, b.bytes->size()});
      }
    }
  }
  std::sort(per_slot.begin(), per_slot.end(), [](const SlotBytes& a, const SlotBytes& b) { return a.slot < b.slot; });
  const size_t now = cache_bytes_.load();
  if (now <= goal) return;
  size_t freed = 0;
  std::pair<uint64_t, uint64_t> cut{0, 0};
  for (const auto& [slot, bytes] : per_slot) {
    cut = slot;
    if ((freed += bytes) >= now - goal) break;
  }
  for (auto& s : streams) {
    std::lock_guard lk(s->mu);
    for (auto& b : s->durable) {
      if (std::pair{b.where.epoch, b.where.seq} > cut) break;
      if (!b.bytes) continue;
      cache_bytes_ -= b.bytes->size();
      b.bytes.reset();
    }
  }
}

AppendOutcome Engine::Append(const std::string& basin, const std::string& stream, std::vector<AppendRecord> records,
                             const AppendOptions& options) {
  std::promise<AppendOutcome> promise;
  auto future = promise.get_future();
  AppendAsync(basin, stream, std::move(records), options,
              [&promise](AppendOutcome o) { promise.set_value(std::move(o)); });
  return future.get();
}

// ---- Reads --------------------------------------------------------------------

Result<uint64_t> Engine::CheckTail(const std::string& basin, const std::string& stream) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, stream));
  std::lock_guard lk(s->mu);
  return s->tail;
}

Result<uint64_t> Engine::WatchTail(const std::string& basin, const std::string& stream, uint64_t offset,
                                   TailCallback fn, std::optional<uint64_t> stream_id) {
  WEIR_ASSIGN_OR_RETURN(auto s, FindAs(basin, stream, stream_id));
  std::lock_guard lk(s->mu);
  if (superseded_) return SupersededError(options_.node);  // under mu: MarkSuperseded fires no watch added after it
  if (s->deleted || s->tail > offset) return uint64_t{0};
  uint64_t id = next_watch_id_++;
  s->watchers.emplace(id, std::pair{offset, std::move(fn)});
  return id;
}

void Engine::UnwatchTail(const std::string& basin, const std::string& stream, uint64_t id) {
  auto s = FindAny(basin, stream);
  if (!s.ok()) return;
  std::lock_guard lk((*s)->mu);
  (*s)->watchers.erase(id);
}

size_t Engine::TailWatchCount(const std::string& basin, const std::string& stream) {
  auto s = FindAny(basin, stream);
  if (!s.ok()) return 0;
  std::lock_guard lk((*s)->mu);
  return (*s)->watchers.size();
}

Result<std::shared_ptr<Engine::Stream>> Engine::FindAs(const std::string& basin, const std::string& stream,
                                                       std::optional<uint64_t> stream_id) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, stream));
  if (stream_id && s->info.id != *stream_id) {
    return NotFound("stream \"{}\" was deleted (the name now names a stream created since)", stream);
  }
  return s;
}

Result<ReadResult> Engine::Read(const std::string& basin, const std::string& stream, const ReadStart& start,
                                size_t max_records, size_t max_bytes, std::optional<TimePoint> wait_until,
                                std::optional<uint64_t> stream_id) {
  // Every attempt reads the stream the first found: never one created since.
  WEIR_ASSIGN_OR_RETURN(auto found, FindAs(basin, stream, stream_id));
  const uint64_t id = found->info.id;
  found.reset();
  // A settle (slot deleted after its batches moved into a segment), a merge
  // or retention (segments deleted) can race with a read's fetch: look
  // again. Only a miss while the sources stayed as they were counts towards
  // calling the object lost (a read can lose one race per merge of a pass).
  for (int attempt = 1, strikes = 0;; ++attempt) {
    const uint64_t before = SourceChanges(basin, stream, id);
    auto r = ReadOnce(basin, stream, start, max_records, max_bytes, wait_until, id);
    if (r.ok() || r.status().code() != Code::kNotFound) return r;
    // The stream itself is gone, or this process was superseded meanwhile
    // (its successor's merges and retention delete what it still lists).
    if (auto again = FindAs(basin, stream, id); !again.ok()) {
      return again.status().code() == Code::kFenced ? again.status() : r.status();
    }
    if (!LookAgainAfterMiss(attempt, SourceChanges(basin, stream, id) != before, &strikes)) {
      return AnswerForMiss(basin, stream, id, r.status());
    }
  }
}

bool Engine::LookAgainAfterMiss(int attempt, bool sources_moved, int* strikes) {
  if (!sources_moved || attempt >= kMaxReadRaces) ++*strikes;
  if (*strikes >= 3) return false;
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * std::min(attempt, 4)));  // a settle or retention finishing
  return true;
}

uint64_t Engine::SourceChanges(const std::string& basin, const std::string& stream, uint64_t stream_id) {
  auto s = FindAs(basin, stream, stream_id);
  if (!s.ok()) return 0;
  std::lock_guard lk((*s)->mu);
  return (*s)->segments.changes();
}

Status Engine::AnswerForMiss(const std::string& basin, const std::string& stream, uint64_t stream_id,
                             const Status& miss) {
  // A superseded process's objects go with its successor's merges and
  // retention: not a loss of this one's records, nor a missing stream (also
  // before this process has learnt it: the node's epoch tells). Its readers
  // are told to go to the successor.
  if (superseded_) return SupersededError(options_.node);
  auto s = FindAs(basin, stream, stream_id);
  if (!s.ok()) return miss;  // deleted, or deleted and created again
  {
    std::lock_guard lk((*s)->mu);
    if ((*s)->deleted) return miss;
  }
  auto node = meta_->GetNode(options_.node);
  if (!node.ok()) {
    // Loss is not told from a successor's deletes without the metastore:
    // answered as the outage it may be, not as lost records.
    return Unavailable("stream {}: an object is missing ({}), and the metastore cannot tell whether another process "
                       "took this node over ({}): retry",
                       stream, miss.message(), node.status().message());
  }
  return node->epoch <= epoch_.load() ? ObjectMissing(stream, miss) : SupersededError(options_.node);
}

Result<ReadResult> Engine::ReadOnce(const std::string& basin, const std::string& stream, const ReadStart& start,
                                    size_t max_records, size_t max_bytes, std::optional<TimePoint> wait_until,
                                    uint64_t stream_id) {
  WEIR_ASSIGN_OR_RETURN(auto s, FindAs(basin, stream, stream_id));
  max_records = std::clamp<size_t>(max_records, 1, options_.max_read_records);
  max_bytes = std::clamp<size_t>(max_bytes, 1, options_.max_read_bytes);
  std::vector<BatchRef> refs;
  std::vector<metastore::SegmentInfo> segments;
  uint64_t from = 0;
  ReadResult out;
  out.stream_id = s->info.id;
  const bool by_time = start.kind == ReadStart::kTimestamp;
  // Timestamps are u64 milliseconds on the wire; past INT64_MAX they are all "later than any record".
  const int64_t at_time = static_cast<int64_t>(std::min<uint64_t>(start.value, INT64_MAX));
  for (bool first = true;; first = false) {
    refs.clear();
    segments.clear();
    {
      std::unique_lock lk(s->mu);
      // Forgotten by a delete, though still found by name for a moment.
      if (s->deleted) return NotFound("stream \"{}\" was deleted", stream);
      if (first) {
        switch (start.kind) {
          case ReadStart::kOffset:
            from = start.value;
            break;
          case ReadStart::kTailOffset:
            from = s->tail - std::min(start.value, s->tail);
            break;
          case ReadStart::kTimestamp: {
            // The first source that holds a record at or after the time (a
            // segment's last_timestamp_ms is its largest); the scan below
            // goes on from there.
            from = s->tail;
            bool found = false;
            if (auto seg = s->segments.FirstReaching(at_time); seg != s->segments.end()) {
              from = seg->start_offset;
              found = true;
            }
            for (size_t i = 0; !found && i < s->durable.size(); ++i) {
              if (s->durable[i].max_timestamp_ms >= at_time) {
                from = s->durable[i].start;
                found = true;
              }
            }
            break;
          }
        }
        if (from > s->tail) return OutOfRange("offset {} is past the tail {}", from, s->tail);
        // Below the trim point, or below what retention kept, reads start at the first record held.
        from = std::max(from, LogStart(*s));
        // A record that reached the time below there does not count.
        if (by_time) from = NextReaching(*s, from, at_time);
        if (from >= s->tail && wait_until) {
          s->cv.wait_until(lk, *wait_until, [&] { return s->deleted || superseded_ || s->tail > from; });
          if (s->deleted) return NotFound("stream \"{}\" was deleted", stream);
          if (superseded_) return SupersededError(options_.node);
          from = std::max(from, LogStart(*s));  // what woke it may have trimmed too
        }
      } else {
        from = std::max(from, LogStart(*s));
        // Sources with only older records are passed over, not fetched.
        if (by_time) from = NextReaching(*s, from, at_time);
      }
      out.tail = s->tail;
      out.tail_timestamp_ms = s->tail_timestamp_ms;
      // A time lookup (every pass of one has found nothing yet: the loop
      // ends with its first record) fetches as much as any read may from
      // what it collects, and after a pass that found nothing collects that
      // much too: the records it passes over are no part of its answer, and
      // with a small limit it would fetch the same segment again for each
      // batch before the time. (Its first pass collects by the client's
      // limits: the first source it finds usually holds the answer.)
      const bool widen = by_time && !first;
      CollectSources(*s, from, widen ? options_.max_read_records : max_records,
                     widen ? options_.max_read_bytes : max_bytes, &segments, &refs);
    }
    std::vector<std::shared_ptr<const std::string>> batches;
    // Until the lookup has found its first record, the segments' time index
    // skips what is earlier.
    const std::optional<int64_t> seek_time = by_time ? std::optional<int64_t>(at_time) : std::nullopt;
    WEIR_RETURN_IF_ERROR(
        FetchSources(segments, refs, from, by_time ? options_.max_read_bytes : max_bytes, seek_time, &batches));
    size_t bytes = 0;
    uint64_t next = from;  // past the last record looked at
    for (const auto& data : batches) {
      WEIR_ASSIGN_OR_RETURN(auto records, wal::DecodeRecords(*data));
      for (auto& r : records) {
        if (static_cast<uint64_t>(r.offset) < from) continue;
        next = std::max(next, static_cast<uint64_t>(r.offset) + 1);
        // The read starts at the first record at or after the time; what
        // follows it comes whatever its timestamp (Kafka producers' clocks
        // need not agree).
        if (by_time && out.records.empty() && r.record.timestamp < at_time) continue;
        size_t size = MeteredBytes(r.record);
        if (out.records.size() >= max_records || (bytes + size > max_bytes && !out.records.empty())) return out;
        bytes += size;
        out.records.push_back(ReadRecord{static_cast<uint64_t>(r.offset), std::move(r.record)});
      }
    }
    // A time lookup whose first page held only older records goes on past
    // them, until it finds one or reaches the tail.
    if (!by_time || !out.records.empty() || next <= from || next >= out.tail) return out;
    from = next;
  }
}

uint64_t Engine::LogStart(const Stream& s) {
  uint64_t low = !s.segments.empty() ? s.segments.front().start_offset
                 : !s.durable.empty()  ? s.durable.front().start
                                       : s.tail;
  // A trim counts once durable: a trim command still pending may fail (or be
  // lost in a crash), and then the records it would have hidden come back.
  return std::max(low, s.durable_trim_point);
}

uint64_t Engine::NextReaching(const Stream& s, uint64_t from, int64_t at_time) {
  auto seg = std::upper_bound(s.segments.begin(), s.segments.end(), from,
                              [](uint64_t off, const metastore::SegmentInfo& g) { return off < g.end_offset; });
  for (; seg != s.segments.end(); ++seg) {
    if (seg->last_timestamp_ms >= at_time) return std::max(from, seg->start_offset);
  }
  for (const BatchRef& b : s.durable) {
    if (b.end > from && b.max_timestamp_ms >= at_time) return std::max(from, b.start);
  }
  return std::max(from, s.tail);
}

void Engine::CollectSources(const Stream& s, uint64_t from, size_t max_records, size_t max_bytes,
                            std::vector<metastore::SegmentInfo>* segments, std::vector<BatchRef>* refs) {
  // Sources in offset order, until they surely cover the limits: settled
  // segments, then acknowledged batches still in the WAL. A source counts
  // the share of its bytes at or after `from` (a read starting at a large
  // segment's last record goes on to the next source).
  auto share = [](uint64_t bytes, uint64_t part, uint64_t whole) -> size_t {
    if (whole == 0 || part >= whole) return bytes;
    return static_cast<size_t>(static_cast<double>(bytes) * static_cast<double>(part) / static_cast<double>(whole));
  };
  size_t bytes = 0;
  uint64_t count = 0;
  auto seg = std::upper_bound(s.segments.begin(), s.segments.end(), from,
                              [](uint64_t off, const metastore::SegmentInfo& g) { return off < g.end_offset; });
  for (; seg != s.segments.end() && count < max_records && bytes < max_bytes; ++seg) {
    if (segments->size() == kMaxSegmentsPerRead) return;  // the next read goes on from there
    segments->push_back(*seg);
    const uint64_t n = seg->end_offset - std::max(seg->start_offset, from);
    count += n;
    bytes += share(seg->size_bytes, n, seg->end_offset - seg->start_offset);
  }
  // Batches start where the segments end (settle drops the ones it
  // indexed); should both ever cover an offset, it is read once.
  const uint64_t after = s.segments.empty() ? from : std::max(from, s.segments.back().end_offset);
  auto it = std::upper_bound(s.durable.begin(), s.durable.end(), after,
                             [](uint64_t off, const BatchRef& b) { return off < b.end; });
  for (; it != s.durable.end() && count < max_records && bytes < max_bytes; ++it) {
    refs->push_back(*it);
    const uint64_t n = it->end - std::max(it->start, after);
    count += n;
    bytes += share(it->where.length, n, it->end - it->start);
  }
}

Status Engine::FetchSources(const std::vector<metastore::SegmentInfo>& segments, const std::vector<BatchRef>& refs,
                            uint64_t from, size_t max_bytes, std::optional<int64_t> at_time,
                            std::vector<std::shared_ptr<const std::string>>* batches) {
  // Outside the stream lock: settled batches from their segment, evicted ones
  // from their WAL slot.
  std::vector<std::string> fetched;
  for (size_t i = 0; i < segments.size(); ++i) {
    const auto& seg = segments[i];
    fetched.clear();
    // Only the first segment may seek by time: it holds the first record at
    // or after it, and every record after that one is read, whatever its time.
    const std::optional<int64_t> seek = i == 0 ? at_time : std::nullopt;
    WEIR_RETURN_IF_ERROR(ReadSegment(seg, std::max(from, seg.start_offset), max_bytes, seek, &fetched));
    // A segment not read to its end is the last source: what follows it
    // must not come after a gap.
    bool cut_short = false;
    if (!fetched.empty()) {
      auto last = wal::ParseBatchHeader(fetched.back());
      cut_short = !last.ok() || last->last_offset() < 0 || static_cast<uint64_t>(last->last_offset()) + 1 < seg.end_offset;
    }
    for (auto& b : fetched) batches->push_back(std::make_shared<const std::string>(std::move(b)));
    if (cut_short) return Status::Ok();
  }
  std::vector<ReadBackBytes> read_back;
  WEIR_RETURN_IF_ERROR(ReadBack(refs, std::min<size_t>(options_.segment_uploads, 4), &read_back));
  for (size_t i = 0; i < refs.size(); ++i) {
    batches->push_back(refs[i].bytes ? refs[i].bytes : std::make_shared<const std::string>(read_back[i].view));
  }
  return Status::Ok();
}

Result<BatchReadResult> Engine::Offsets(const std::string& basin, const std::string& stream) {
  WEIR_ASSIGN_OR_RETURN(auto s, Find(basin, stream));
  std::lock_guard lk(s->mu);
  BatchReadResult out;
  out.tail = s->tail;
  out.log_start = std::min(LogStart(*s), s->tail);
  return out;
}

bool Engine::ReadNeedsStore(const std::string& basin, const std::string& stream, uint64_t from) {
  auto found = Find(basin, stream);
  if (!found.ok()) return false;
  const Stream& s = **found;
  std::lock_guard lk((*found)->mu);
  if (from > s.tail || from < LogStart(s)) return false;
  auto seg = std::upper_bound(s.segments.begin(), s.segments.end(), from,
                              [](uint64_t off, const metastore::SegmentInfo& g) { return off < g.end_offset; });
  if (seg != s.segments.end()) return true;
  auto it = std::upper_bound(s.durable.begin(), s.durable.end(), from,
                             [](uint64_t off, const BatchRef& b) { return off < b.end; });
  return it != s.durable.end() && !it->bytes;
}

std::vector<Result<BatchReadResult>> Engine::ReadBatchesMany(const std::string& basin,
                                                             const std::vector<BatchRead>& reads, size_t parallel) {
  std::vector<Result<BatchReadResult>> out(reads.size(), Result<BatchReadResult>(Internal("not read")));
  // Those that need the store first (each thread takes the next), then the rest.
  std::vector<size_t> order, hot;
  for (size_t i = 0; i < reads.size(); ++i) {
    (ReadNeedsStore(basin, reads[i].stream, reads[i].from) ? order : hot).push_back(i);
  }
  const size_t cold = order.size();
  order.insert(order.end(), hot.begin(), hot.end());
  auto read = [&](size_t k) {
    const BatchRead& r = reads[order[k]];
    out[order[k]] = ReadBatches(basin, r.stream, r.from, r.max_bytes);
  };
  if (cold < 2) {
    for (size_t k = 0; k < order.size(); ++k) read(k);  // at most one GET: no thread to start
  } else {
    ForEachParallel(order.size(), std::min(parallel, cold), "read-many", read);
  }
  return out;
}

Result<BatchReadResult> Engine::ReadBatches(const std::string& basin, const std::string& stream, uint64_t from,
                                            size_t max_bytes) {
  // Capped so that ReadSegment's window (the limit plus room for a batch
  // that straddles it) cannot wrap.
  max_bytes = std::clamp<size_t>(max_bytes, 1, size_t{1} << 40);
  std::optional<uint64_t> id;  // every attempt reads the stream the first found (as Read)
  for (int attempt = 1, strikes = 0;; ++attempt) {
    WEIR_ASSIGN_OR_RETURN(auto s, FindAs(basin, stream, id));
    id = s->info.id;
    std::vector<metastore::SegmentInfo> segments;
    std::vector<BatchRef> refs;
    BatchReadResult out;
    uint64_t changes = 0;  // of the sources collected (see Read)
    {
      std::lock_guard lk(s->mu);
      if (s->deleted) return NotFound("stream \"{}\" was deleted", stream);  // as Read
      changes = s->segments.changes();
      out.tail = s->tail;
      out.log_start = std::min(LogStart(*s), s->tail);
      if (from > out.tail || from < out.log_start) {
        return OutOfRange("offset {} is outside [{}, {}]", from, out.log_start, out.tail);
      }
      CollectSources(*s, from, SIZE_MAX, max_bytes, &segments, &refs);
    }
    std::vector<std::shared_ptr<const std::string>> batches;
    Status st = FetchSources(segments, refs, from, max_bytes, std::nullopt, &batches);
    if (!st.ok()) {
      // A settle, a merge or retention raced with the fetch: look again.
      if (st.code() == Code::kNotFound) {
        uint64_t now = 0;
        {
          std::lock_guard lk(s->mu);
          now = s->segments.changes();
        }
        if (LookAgainAfterMiss(attempt, now != changes, &strikes)) continue;
      }
      if (st.code() == Code::kNotFound) return AnswerForMiss(basin, stream, s->info.id, st);
      return st;
    }
    size_t bytes = 0;
    for (auto& b : batches) {
      auto h = wal::ParseBatchHeader(*b);
      if (!h.ok()) return h.status();
      if (static_cast<uint64_t>(h->last_offset()) < from) continue;
      if (!out.batches.empty() && bytes + b->size() > max_bytes) break;
      bytes += b->size();
      out.batches.push_back(std::move(b));
    }
    return out;
  }
}

}  // namespace weir::log
