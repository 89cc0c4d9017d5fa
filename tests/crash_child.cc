// Crash-test child, driven by tests/crash_test.py. Append mode: threads append
// to the engine (frequent settles) until the parent SIGKILLs the process,
// logging every outcome to an O_APPEND file. Half the threads are idempotent
// producers that keep a durable producer file and re-send their last batch at
// start. Verify mode: recovers, reads every stream and checks it against the
// log of every run.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "log/engine.h"
#include "metastore/metastore.h"
#include "metastore/postgres_db.h"
#include "objstore/fault_store.h"
#include "objstore/file_store.h"
#include "wal/quorum_store.h"

namespace {

namespace wl = weir::log;
using weir::Code;
using weir::Result;
using weir::Status;
using namespace std::chrono_literals;

const std::string kBasin = "crash-basin";

struct Flags {
  std::string dir;
  std::string object_store;  // URI; default file://DIR/objects
  std::string metastore;  // default: sqlite://DIR/meta.db
  std::string mode;
  int threads = 8;
  int streams = 4;
  std::string ack_log;
  double seconds = 1000;
  double put_error_rate = 0;
  double put_timeout_rate = 0;
  double put_ambiguous_rate = 0;
  uint64_t seed = 1;
  int settle_ms = 200;
  std::string node = "crash-node";
  int node_live_window_ms = 20000;
  size_t cache_bytes = wl::EngineOptions{}.log_cache_bytes;
  // Settle waits for a stream to hold this much, or its oldest record this
  // long (EngineOptions::settle_min_bytes): kills then land where streams
  // settled past a waiting one's slot.
  size_t settle_min_bytes = wl::EngineOptions{}.settle_min_bytes;
  int settle_max_delay_ms = 10000;
  // The WAL's own stores, file://DIR/wal-<i>: 0 = the object store, 2 or
  // more = a quorum (the express class).
  int wal_stores = 0;
  int wal_down_store = -1;  // append mode: this one fails every PUT
  std::string wal_store_uri;  // the WAL on this store instead (postgres:// too)
};

std::string StreamName(int k) { return "s" + std::to_string(k); }

std::string Join(const std::vector<std::string>& parts, char sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) return out;
    pos = next + 1;
  }
}

// One line, with newlines and tabs flattened (for error messages).
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  }
  return s;
}

bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// "ACK <stream> <start> <end> <dup> <body>\t<body>..."
struct AckLine {
  std::string stream;
  uint64_t start = 0, end = 0;
  bool dup = false;
  std::vector<std::string> bodies;
};

std::optional<AckLine> ParseAck(const std::string& line) {
  auto fields = Split(line, ' ');
  if (fields.size() < 6 || fields[0] != "ACK" || (fields[4] != "0" && fields[4] != "1")) return std::nullopt;
  AckLine a;
  a.stream = fields[1];
  char* end = nullptr;
  a.start = std::strtoull(fields[2].c_str(), &end, 10);
  if (fields[2].empty() || *end != '\0') return std::nullopt;
  a.end = std::strtoull(fields[3].c_str(), &end, 10);
  if (fields[3].empty() || *end != '\0') return std::nullopt;
  a.dup = fields[4] == "1";
  size_t prefix = 0;
  for (int i = 0; i < 5; ++i) prefix += fields[i].size() + 1;
  a.bodies = Split(line.substr(prefix), '\t');
  return a;
}

// The ack log's lines. A kill can cut the last line of a run short; the next
// run then writes "\nTORN\n", and such lines are returned in `torn`.
std::vector<std::string> ReadLog(const std::string& path, uint64_t* torn, bool* ends_torn) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  *ends_torn = false;
  while (std::getline(in, line)) {
    if (line == "TORN") {
      if (!lines.empty()) lines.pop_back();
      ++*torn;
      continue;
    }
    *ends_torn = in.eof();
    lines.push_back(std::move(line));
  }
  if (*ends_torn) {
    lines.pop_back();
    ++*torn;
  }
  return lines;
}

Result<std::unique_ptr<wl::Engine>> OpenEngine(const Flags& f, bool faults, size_t cache_bytes,
                                                weir::Duration settle_interval) {
  std::shared_ptr<weir::objstore::ObjectStore> store;
  if (f.object_store.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.dir + "/objects", ec);
    if (ec) return weir::IOError("creating {}/objects: {}", f.dir, ec.message());
    WEIR_ASSIGN_OR_RETURN(store, weir::objstore::OpenFileStore(f.dir + "/objects"));
  } else {
    WEIR_ASSIGN_OR_RETURN(store, weir::objstore::OpenObjectStore(f.object_store));
  }
  if (faults && (f.put_error_rate > 0 || f.put_timeout_rate > 0 || f.put_ambiguous_rate > 0)) {
    weir::objstore::FaultOptions fo;
    fo.seed = f.seed;
    fo.put_error_rate = f.put_error_rate;
    fo.put_timeout_rate = f.put_timeout_rate;
    fo.put_ambiguous_rate = f.put_ambiguous_rate;
    store = std::make_shared<weir::objstore::FaultStore>(store, fo);
  }
  std::shared_ptr<weir::objstore::ObjectStore> wal_store;
  // Fails every PUT once recovery is done: a quorum's recovery may need a
  // store that is down (a slot with one flight copy and one poison).
  std::shared_ptr<weir::objstore::FaultStore> down;
  if (!f.wal_store_uri.empty()) {
    const bool pg = f.wal_store_uri.starts_with("postgres://") || f.wal_store_uri.starts_with("postgresql://");
    WEIR_ASSIGN_OR_RETURN(wal_store, pg ? weir::metastore::OpenPostgresWalStore(f.wal_store_uri)
                                        : weir::objstore::OpenObjectStore(f.wal_store_uri));
    if (faults && (f.put_error_rate > 0 || f.put_timeout_rate > 0 || f.put_ambiguous_rate > 0)) {
      weir::objstore::FaultOptions fo;
      fo.seed = f.seed * 31 + 7;
      fo.put_error_rate = f.put_error_rate;
      fo.put_timeout_rate = f.put_timeout_rate;
      fo.put_ambiguous_rate = f.put_ambiguous_rate;
      wal_store = std::make_shared<weir::objstore::FaultStore>(wal_store, fo);
    }
  }
  if (f.wal_stores > 0) {
    std::vector<std::shared_ptr<weir::objstore::ObjectStore>> stores;
    for (int i = 0; i < f.wal_stores; ++i) {
      const std::string dir = f.dir + "/wal-" + std::to_string(i);
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) return weir::IOError("creating {}: {}", dir, ec.message());
      WEIR_ASSIGN_OR_RETURN(auto one, weir::objstore::OpenFileStore(dir));
      if (faults) {
        weir::objstore::FaultOptions fo;
        fo.seed = f.seed * 31 + static_cast<uint64_t>(i);
        fo.put_error_rate = f.put_error_rate;
        fo.put_timeout_rate = f.put_timeout_rate;
        fo.put_ambiguous_rate = f.put_ambiguous_rate;
        auto faulty = std::make_shared<weir::objstore::FaultStore>(one, fo);
        if (i == f.wal_down_store) down = faulty;
        one = faulty;
      }
      stores.push_back(std::move(one));
    }
    if (stores.size() == 1) {
      wal_store = stores.front();
    } else {
      WEIR_ASSIGN_OR_RETURN(wal_store, weir::wal::QuorumStore::Open(std::move(stores)));
    }
  }
  WEIR_ASSIGN_OR_RETURN(auto meta, weir::metastore::OpenMetastore(f.metastore.empty() ? "sqlite://" + f.dir + "/meta.db"
                                                                                      : f.metastore));
  wl::EngineOptions o;
  o.node = f.node;
  o.wal_store = wal_store;
  o.node_live_window = std::chrono::milliseconds(f.node_live_window_ms);
  o.wal.retry_initial = 2ms;
  o.wal.retry_max = 50ms;
  o.log_cache_bytes = cache_bytes;
  o.settle_interval = settle_interval;
  o.settle_min_bytes = f.settle_min_bytes;
  o.settle_max_delay = std::chrono::milliseconds(f.settle_max_delay_ms);
  WEIR_ASSIGN_OR_RETURN(auto engine, wl::Engine::Open(o, store, meta));
  if (down) {
    weir::objstore::FaultOptions all;
    all.put_error_rate = 1.0;
    down->SetOptions(all);
  }
  Status st = engine->CreateBasin(kBasin);
  if (!st.ok() && st.code() != Code::kAlreadyExists) return st;
  for (int k = 0; k < f.streams; ++k) {
    auto created = engine->CreateStream(kBasin, StreamName(k), weir::metastore::StreamConfig{});
    if (!created.ok() && created.status().code() != Code::kAlreadyExists) return created.status();
  }
  return engine;
}

// ---- Append mode ----------------------------------------------------------------

// The ack log plus the checks that need the release order: callbacks of one
// engine run in WAL release order, so per stream the new (non-duplicate) acks
// of one run must be contiguous from the tail recovered at open.
class Recorder {
 public:
  Recorder(int fd, std::vector<uint64_t> tails) : fd_(fd), next_(std::move(tails)) {}

  // `retried`: the batch is sent again until it is acknowledged (an
  // idempotent producer's), so a failure says nothing of where it ends up.
  void Outcome(int k, const std::vector<std::string>& bodies, const wl::AppendOutcome& o, bool retried) {
    std::lock_guard lk(mu_);
    if (o.status.ok()) {
      const wl::AppendAck& a = o.ack;
      WriteLocked(fmt::format("ACK {} {} {} {} {}", StreamName(k), a.start_offset, a.end_offset,
                              a.duplicated ? 1 : 0, Join(bodies, '\t')));
      ++acks_;
      if (a.duplicated) ++dups_;
      if (a.end_offset - a.start_offset != bodies.size()) {
        ViolationLocked(fmt::format("{} ack [{}, {}) for {} records", StreamName(k), a.start_offset, a.end_offset,
                                    bodies.size()));
      }
      if (!a.duplicated) {
        if (a.start_offset != next_[k]) {
          ViolationLocked(fmt::format("{}: new ack starts at {}, expected {} (release order or density)",
                                      StreamName(k), a.start_offset, next_[k]));
        }
        next_[k] = a.end_offset;
      }
    } else if (o.status.code() == Code::kPreconditionFailed && o.seq_num_mismatch) {
      WriteLocked(fmt::format("MISS {} tail {} {} {}", StreamName(k), *o.seq_num_mismatch, retried ? 1 : 0,
                              Join(bodies, '\t')));
      ++misses_;
    } else {
      WriteLocked(fmt::format("ERR {} {} {} {} {}", StreamName(k), CodeName(o.status.code()), retried ? 1 : 0,
                              Join(bodies, '\t'), OneLine(o.status.ToString())));
      ++errors_;
    }
  }

  void Line(const std::string& line) {
    std::lock_guard lk(mu_);
    WriteLocked(line);
  }
  void Violation(const std::string& what) {
    std::lock_guard lk(mu_);
    ViolationLocked(what);
  }

  std::string Summary() {
    std::lock_guard lk(mu_);
    return fmt::format("acks={} dups={} misses={} errors={} violations={}", acks_, dups_, misses_, errors_,
                       violations_);
  }

 private:
  void WriteLocked(std::string line) {
    line += '\n';
    if (!WriteAll(fd_, line)) {
      std::fprintf(stderr, "writing the ack log: %s\n", std::strerror(errno));
      std::_Exit(3);
    }
  }
  void ViolationLocked(const std::string& what) {
    ++violations_;
    std::fprintf(stderr, "VIOLATION %s\n", what.c_str());
    WriteLocked("VIOLATION " + OneLine(what));
  }

  std::mutex mu_;
  int fd_;
  std::vector<uint64_t> next_;
  uint64_t acks_ = 0, dups_ = 0, misses_ = 0, errors_ = 0, violations_ = 0;
};

std::vector<wl::AppendRecord> Records(const std::vector<std::string>& bodies) {
  std::vector<wl::AppendRecord> out(bodies.size());
  for (size_t i = 0; i < bodies.size(); ++i) out[i].body = bodies[i];
  return out;
}

// Appends through AppendAsync and logs the outcome inside the callback, so the
// ack log sees acks in release order.
wl::AppendOutcome Send(wl::Engine& engine, Recorder& rec, int k, const std::vector<std::string>& bodies,
                       const wl::AppendOptions& options) {
  auto promise = std::make_shared<std::promise<wl::AppendOutcome>>();
  auto future = promise->get_future();
  engine.AppendAsync(kBasin, StreamName(k), Records(bodies), options,
                     [&rec, k, bodies, promise](wl::AppendOutcome o) {
                       rec.Outcome(k, bodies, o, /*retried=*/true);
                       promise->set_value(std::move(o));
                     });
  return future.get();
}

struct Shared {
  Flags flags;
  wl::Engine* engine = nullptr;
  Recorder* rec = nullptr;
  uint64_t run = 0;
  std::atomic<bool> stop{false};
  // First body of each new ack in the log before this run -> stream, start, end.
  std::unordered_map<std::string, std::tuple<std::string, uint64_t, uint64_t>> acked;
  std::atomic<uint64_t> resends{0}, resend_dups{0}, probe_dups{0};
};

std::vector<std::string> MakeBodies(int thread, uint64_t run, uint64_t counter, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(fmt::format("t{}-r{:016x}-n{}-{}", thread, run, counter, i));
  return out;
}

// A producer's durable state: id, epoch, and per stream the next sequence and
// the last batch it sent.
struct ProducerFile {
  struct Last {
    int32_t seq = 0;
    std::vector<std::string> bodies;
  };
  uint64_t id = 0;
  int16_t epoch = 0;
  std::map<int, int32_t> next;
  std::map<int, Last> last;
};

std::string Serialize(const ProducerFile& p) {
  std::string s = fmt::format("weir-crash-producer 1\npid {} epoch {}\n", p.id, p.epoch);
  for (const auto& [k, next] : p.next) {
    s += fmt::format("stream {} next {}", k, next);
    auto it = p.last.find(k);
    if (it != p.last.end()) {
      s += fmt::format(" last {} {}", it->second.seq, it->second.bodies.size());
      for (const auto& b : it->second.bodies) s += " " + b;
    }
    s += "\n";
  }
  s += "end\n";
  return s;
}

Result<ProducerFile> LoadProducer(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  ProducerFile p;
  if (!std::getline(in, line) || line != "weir-crash-producer 1") return weir::Corruption("{}: bad header", path);
  std::string word;
  int epoch = 0;
  if (!std::getline(in, line)) return weir::Corruption("{}: no pid line", path);
  {
    std::istringstream ls(line);
    std::string w2;
    if (!(ls >> word >> p.id >> w2 >> epoch) || word != "pid" || w2 != "epoch") {
      return weir::Corruption("{}: bad pid line", path);
    }
    p.epoch = static_cast<int16_t>(epoch);
  }
  while (std::getline(in, line)) {
    if (line == "end") return p;
    std::istringstream ls(line);
    int k = 0;
    int32_t next = 0;
    std::string w2;
    if (!(ls >> word >> k >> w2 >> next) || word != "stream" || w2 != "next") {
      return weir::Corruption("{}: bad line \"{}\"", path, line);
    }
    p.next[k] = next;
    if (ls >> word) {
      ProducerFile::Last last;
      size_t n = 0;
      if (word != "last" || !(ls >> last.seq >> n)) return weir::Corruption("{}: bad line \"{}\"", path, line);
      for (size_t i = 0; i < n; ++i) {
        std::string b;
        if (!(ls >> b)) return weir::Corruption("{}: short batch in \"{}\"", path, line);
        last.bodies.push_back(b);
      }
      p.last[k] = std::move(last);
    }
  }
  return weir::Corruption("{}: no end line", path);
}

// Write temp, fsync, rename.
Status SaveProducer(const std::string& path, const ProducerFile& p) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return weir::IOError("open {}: {}", tmp, std::strerror(errno));
  bool ok = WriteAll(fd, Serialize(p)) && ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) return weir::IOError("write {}: {}", tmp, std::strerror(err));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return weir::IOError("rename {}: {}", path, std::strerror(errno));
  return Status::Ok();
}

bool Fatal(const Status& st) {
  switch (st.code()) {
    case Code::kOutOfRange:
    case Code::kFenced:
    case Code::kInvalidArgument:
    case Code::kInternal:
    case Code::kPreconditionFailed:
    case Code::kNotFound:
      return true;
    default:
      return false;
  }
}

struct Sent {
  int32_t seq = 0;
  std::vector<std::string> bodies;
  uint64_t start = 0, end = 0;
};

void ProducerThread(Shared& sh, int t) {
  wl::Engine& engine = *sh.engine;
  Recorder& rec = *sh.rec;
  std::mt19937_64 rng(std::random_device{}());
  const std::string path = fmt::format("{}/producer-{}", sh.flags.dir, t);
  std::map<int, std::deque<Sent>> history;  // acked batches per stream, newest last, at most 5

  // Sends until OK or a fatal error (a violation: the thread stops).
  auto send = [&](int k, const std::vector<std::string>& bodies, int32_t seq, uint64_t id, int16_t epoch,
                  const char* what) -> std::optional<wl::AppendOutcome> {
    wl::AppendOptions o;
    o.producer = wl::ProducerRef{id, epoch, seq};
    for (int attempt = 0;; ++attempt) {
      wl::AppendOutcome out = Send(engine, rec, k, bodies, o);
      if (out.status.ok()) return out;
      if (Fatal(out.status)) {
        rec.Violation(fmt::format("t{} {} {} seq {} (attempt {}): {}", t, what, StreamName(k), seq, attempt,
                                  out.status.ToString()));
        return std::nullopt;
      }
      if (sh.stop) return std::nullopt;
      std::this_thread::sleep_for(10ms);
    }
  };

  ProducerFile p;
  if (std::filesystem::exists(path)) {
    auto loaded = LoadProducer(path);
    if (!loaded.ok()) {
      rec.Violation(fmt::format("t{}: {}", t, loaded.status().ToString()));
      return;
    }
    p = std::move(*loaded);
    // Re-send the last batch sent to each stream: it may or may not have landed.
    for (const auto& [k, last] : p.last) {
      if (k >= sh.flags.streams || last.bodies.empty()) continue;
      auto out = send(k, last.bodies, last.seq, p.id, p.epoch, "re-send");
      if (!out) return;
      ++sh.resends;
      if (out->ack.duplicated) ++sh.resend_dups;
      auto it = sh.acked.find(last.bodies.front());
      bool was_acked = it != sh.acked.end();
      rec.Line(fmt::format("RESEND {} seq {} dup {} start {} end {} was_acked {}", StreamName(k), last.seq,
                           out->ack.duplicated ? 1 : 0, out->ack.start_offset, out->ack.end_offset,
                           was_acked ? 1 : 0));
      if (was_acked) {
        const auto& [stream, start, end] = it->second;
        if (!out->ack.duplicated || stream != StreamName(k) || start != out->ack.start_offset ||
            end != out->ack.end_offset) {
          rec.Violation(fmt::format("t{}: re-send of acked batch {} [{}, {}) came back dup={} [{}, {}) on {}", t,
                                    last.bodies.front(), start, end, out->ack.duplicated, out->ack.start_offset,
                                    out->ack.end_offset, StreamName(k)));
        }
      }
      history[k].push_back(Sent{last.seq, last.bodies, out->ack.start_offset, out->ack.end_offset});
    }
  } else {
    for (;;) {
      auto id = engine.AllocateProducerId();
      if (id.ok()) {
        p.id = *id;
        break;
      }
      if (sh.stop) return;
      std::this_thread::sleep_for(10ms);
    }
  }

  uint64_t counter = 0;
  std::uniform_int_distribution<int> pick_stream(0, sh.flags.streams - 1);
  std::uniform_int_distribution<int> pick_count(1, 5);
  while (!sh.stop) {
    int k = pick_stream(rng);
    auto bodies = MakeBodies(t, sh.run, counter++, pick_count(rng));
    int32_t seq = p.next[k];
    p.last[k] = ProducerFile::Last{seq, bodies};
    p.next[k] = seq + static_cast<int32_t>(bodies.size());
    Status saved = SaveProducer(path, p);
    if (!saved.ok()) {
      rec.Violation(fmt::format("t{}: {}", t, saved.ToString()));
      return;
    }
    auto out = send(k, bodies, seq, p.id, p.epoch, "send");
    if (!out) return;
    if (out->ack.duplicated) {
      rec.Violation(fmt::format("t{}: fresh batch {} seq {} came back duplicated", t, bodies.front(), seq));
    }
    auto& h = history[k];
    h.push_back(Sent{seq, bodies, out->ack.start_offset, out->ack.end_offset});
    if (h.size() > 5) h.pop_front();
    // Every 20th batch, re-send one of the last 5 on purpose: it must be a duplicate.
    if (counter % 20 == 0) {
      const Sent& old = h[std::uniform_int_distribution<size_t>(0, h.size() - 1)(rng)];
      auto dup = send(k, old.bodies, old.seq, p.id, p.epoch, "probe re-send");
      if (!dup) return;
      ++sh.probe_dups;
      if (!dup->ack.duplicated || dup->ack.start_offset != old.start || dup->ack.end_offset != old.end) {
        rec.Violation(fmt::format("t{}: probe re-send of {} [{}, {}) came back dup={} [{}, {})", t,
                                  old.bodies.front(), old.start, old.end, dup->ack.duplicated,
                                  dup->ack.start_offset, dup->ack.end_offset));
      }
    }
  }
}

// Appends without a producer id, up to 4 in flight; 10% with match_seq_num.
void PlainThread(Shared& sh, int t) {
  wl::Engine& engine = *sh.engine;
  Recorder& rec = *sh.rec;
  std::mt19937_64 rng(std::random_device{}());
  struct InFlight {
    std::mutex mu;
    std::condition_variable cv;
    int n = 0;
  };
  auto inflight = std::make_shared<InFlight>();
  std::uniform_int_distribution<int> pick_stream(0, sh.flags.streams - 1);
  std::uniform_int_distribution<int> pick_count(1, 5);
  std::uniform_real_distribution<double> u(0, 1);
  uint64_t counter = 0;
  while (!sh.stop) {
    {
      std::unique_lock lk(inflight->mu);
      inflight->cv.wait(lk, [&] { return inflight->n < 4; });
      ++inflight->n;
    }
    int k = pick_stream(rng);
    auto bodies = MakeBodies(t, sh.run, counter++, pick_count(rng));
    wl::AppendOptions o;
    if (u(rng) < 0.1) {
      auto tail = engine.CheckTail(kBasin, StreamName(k));
      if (tail.ok()) o.match_seq_num = *tail;
    }
    engine.AppendAsync(kBasin, StreamName(k), Records(bodies), o,
                       [&rec, k, bodies, inflight](wl::AppendOutcome out) {
                         rec.Outcome(k, bodies, out, /*retried=*/false);
                         std::lock_guard lk(inflight->mu);
                         --inflight->n;
                         inflight->cv.notify_all();
                       });
  }
  std::unique_lock lk(inflight->mu);
  inflight->cv.wait(lk, [&] { return inflight->n == 0; });
}

int RunAppend(const Flags& f) {
  int fd = ::open(f.ack_log.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "open %s: %s\n", f.ack_log.c_str(), std::strerror(errno));
    return 2;
  }
  Shared sh;
  sh.flags = f;
  {
    // Index the new acks of earlier runs; mark a line a kill cut short.
    uint64_t torn = 0;
    bool ends_torn = false;
    for (const auto& line : ReadLog(f.ack_log, &torn, &ends_torn)) {
      auto a = ParseAck(line);
      if (a && !a->dup) sh.acked[a->bodies.front()] = {a->stream, a->start, a->end};
    }
    if (ends_torn && !WriteAll(fd, "\nTORN\n")) return 2;
  }
  sh.run = std::random_device{}();
  sh.run = (sh.run << 32) ^ std::random_device{}();

  // Frequent settles, so kills land in and around them.
  auto engine = OpenEngine(f, true, f.cache_bytes, std::chrono::milliseconds(f.settle_ms));
  if (!engine.ok()) {
    std::fprintf(stderr, "opening the engine: %s\n", engine.status().ToString().c_str());
    return 2;
  }
  std::vector<uint64_t> tails;
  for (int k = 0; k < f.streams; ++k) {
    auto tail = (*engine)->CheckTail(kBasin, StreamName(k));
    if (!tail.ok()) {
      std::fprintf(stderr, "tail of %s: %s\n", StreamName(k).c_str(), tail.status().ToString().c_str());
      return 2;
    }
    tails.push_back(*tail);
  }
  Recorder rec(fd, tails);
  sh.engine = engine->get();
  sh.rec = &rec;
  std::vector<std::string> tail_text;
  for (int k = 0; k < f.streams; ++k) tail_text.push_back(fmt::format("{}={}", StreamName(k), tails[k]));
  rec.Line(fmt::format("START run {:016x} epoch {} tails {}", sh.run, (*engine)->epoch(), Join(tail_text, ',')));
  std::printf("READY epoch %llu\n", static_cast<unsigned long long>((*engine)->epoch()));
  std::fflush(stdout);

  std::vector<std::thread> threads;
  for (int t = 0; t < f.threads; ++t) {
    if (t < f.threads / 2) {
      threads.emplace_back([&sh, t] { ProducerThread(sh, t); });
    } else {
      threads.emplace_back([&sh, t] { PlainThread(sh, t); });
    }
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
  sh.stop = true;
  for (auto& th : threads) th.join();
  (*engine)->Close();
  std::printf("append done: %s resends=%llu resend_dups=%llu probe_dups=%llu\n", rec.Summary().c_str(),
              static_cast<unsigned long long>(sh.resends.load()),
              static_cast<unsigned long long>(sh.resend_dups.load()),
              static_cast<unsigned long long>(sh.probe_dups.load()));
  ::close(fd);
  return 0;
}

// ---- Verify mode ----------------------------------------------------------------

bool WellFormedBody(const std::string& b) {
  unsigned t = 0, i = 0;
  unsigned long long run = 0, n = 0;
  int used = 0;
  return std::sscanf(b.c_str(), "t%u-r%16llx-n%llu-%u%n", &t, &run, &n, &i, &used) == 4 &&
         static_cast<size_t>(used) == b.size();
}

int RunVerify(const Flags& f) {
  std::vector<std::string> problems;
  auto problem = [&](std::string p) { problems.push_back(std::move(p)); };

  // A small log cache: most reads fetch their batch from its WAL slot.
  auto opened = OpenEngine(f, false, 1 << 20, wl::EngineOptions{}.settle_interval);
  if (!opened.ok()) {
    std::printf("FAIL opening the engine: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  wl::Engine& engine = **opened;

  // Every stream of the basin, read from 0 to the tail.
  std::vector<std::string> names;
  for (std::string after;;) {
    auto page = engine.ListStreams(kBasin, "", after, 1000);
    if (!page.ok()) {
      std::printf("FAIL listing streams: %s\n", page.status().ToString().c_str());
      return 1;
    }
    if (page->empty()) break;
    for (const auto& info : *page) names.push_back(info.name);
    after = names.back();
  }
  std::map<std::string, std::vector<std::string>> streams;
  std::unordered_map<std::string, std::pair<std::string, uint64_t>> where;  // body -> stream, offset
  uint64_t total = 0;
  for (const std::string& name : names) {
    auto tail = engine.CheckTail(kBasin, name);
    if (!tail.ok()) {
      problem(fmt::format("tail of {}: {}", name, tail.status().ToString()));
      continue;
    }
    auto& recs = streams[name];
    while (recs.size() < *tail) {
      auto r = engine.Read(kBasin, name, wl::ReadStart{wl::ReadStart::kOffset, recs.size()}, 1000, 1 << 20);
      if (!r.ok()) {
        problem(fmt::format("read {} at {}: {}", name, recs.size(), r.status().ToString()));
        break;
      }
      if (r->records.empty()) {
        problem(fmt::format("read {} at {} returned nothing below the tail {}", name, recs.size(), *tail));
        break;
      }
      for (auto& rr : r->records) {
        if (rr.offset != recs.size()) {
          problem(fmt::format("{}: read returned offset {} where {} was expected", name, rr.offset, recs.size()));
        }
        std::string body = rr.record.value.value_or("<null>");
        if (!WellFormedBody(body)) problem(fmt::format("{}@{}: unexpected body \"{}\"", name, recs.size(), body));
        auto [it, fresh] = where.emplace(body, std::make_pair(name, recs.size()));
        if (!fresh) {
          problem(fmt::format("body {} appears twice: {}@{} and {}@{}", body, it->second.first, it->second.second,
                              name, recs.size()));
        }
        recs.push_back(std::move(body));
      }
      if (problems.size() > 50) break;
    }
    total += recs.size();
  }

  // The ack log of every run.
  if (!std::filesystem::exists(f.ack_log)) problem("no ack log at " + f.ack_log);
  std::unordered_map<std::string, std::tuple<std::string, uint64_t, uint64_t>> acked;  // first body -> new ack
  uint64_t acks = 0, dups = 0, dups_unmatched = 0, misses = 0, errors = 0, refused = 0, resends = 0, resend_dups = 0,
           runs = 0, torn = 0, violations = 0;
  bool ends_torn = false;
  for (const auto& line : ReadLog(f.ack_log, &torn, &ends_torn)) {
    if (line.empty()) continue;
    auto fields = Split(line, ' ');
    const std::string& kind = fields[0];
    if (kind == "VIOLATION") {
      ++violations;
      problem("append run logged: " + line);
      continue;
    } else if (kind == "MISS" || kind == "ERR") {
      // "MISS <stream> tail <n> <retried> <bodies>" and "ERR <stream> <code>
      // <retried> <bodies> <message>": an append answered as not written
      // (a missed condition, a refusal) must not be in the stream, unless
      // it is sent again (`retried`). One whose outcome is unknown may be.
      ++(kind == "MISS" ? misses : errors);
      const size_t at = kind == "MISS" ? 4 : 3;
      if (fields.size() <= at + 1 || fields[at] != "0") continue;
      static const std::set<std::string_view> kNotWritten = {"PreconditionFailed", "ResourceExhausted",
                                                             "InvalidArgument",    "NotFound",
                                                             "Fenced",             "OutOfRange"};
      if (kind == "ERR" && kNotWritten.count(fields[2]) == 0) continue;
      ++refused;
      for (const std::string& body : Split(fields[at + 1], '\t')) {
        if (auto w = where.find(body); w != where.end()) {
          problem(fmt::format("{} answered as not written ({}), but the stream holds it at {}@{}", body,
                              kind == "MISS" ? "a missed match_seq_num" : fields[2], w->second.first,
                              w->second.second));
        }
      }
      continue;
    } else if (kind == "START") {
      ++runs;
      continue;
    } else if (kind == "RESEND") {
      ++resends;
      if (fields.size() >= 6 && fields[4] == "dup" && fields[5] == "1") ++resend_dups;
      continue;
    }
    auto a = ParseAck(line);
    if (!a) {
      problem("unparsable ack-log line: " + line.substr(0, 200));
      continue;
    }
    ++acks;
    auto sit = streams.find(a->stream);
    if (sit == streams.end()) {
      problem("ack for an unknown stream: " + line.substr(0, 200));
      continue;
    }
    const auto& recs = sit->second;
    if (a->end - a->start != a->bodies.size()) problem("ack range does not match its records: " + line.substr(0, 200));
    for (size_t i = 0; i < a->bodies.size(); ++i) {
      uint64_t off = a->start + i;
      if (off >= recs.size()) {
        problem(fmt::format("acked {} at {}@{} is past the tail {}", a->bodies[i], a->stream, off, recs.size()));
      } else if (recs[off] != a->bodies[i]) {
        problem(fmt::format("acked {} at {}@{}, but the stream holds \"{}\" there", a->bodies[i], a->stream, off,
                            recs[off]));
      }
    }
    auto key = std::make_tuple(a->stream, a->start, a->end);
    if (a->dup) {
      ++dups;
      auto it = acked.find(a->bodies.front());
      if (it == acked.end()) {
        ++dups_unmatched;  // the original landed but its ack was never logged
      } else if (it->second != key) {
        problem(fmt::format("duplicate ack {} [{}, {}) on {} does not match the original [{}, {}) on {}",
                            a->bodies.front(), a->start, a->end, a->stream, std::get<1>(it->second),
                            std::get<2>(it->second), std::get<0>(it->second)));
      }
    } else {
      auto [it, fresh] = acked.emplace(a->bodies.front(), key);
      if (!fresh) {
        problem(fmt::format("batch {} was acknowledged as new twice: [{}, {}) and [{}, {})", a->bodies.front(),
                            std::get<1>(it->second), std::get<2>(it->second), a->start, a->end));
      }
    }
  }
  engine.Close();

  std::printf("verify: runs=%llu streams=%zu records=%llu acks=%llu dups=%llu (unmatched originals %llu) "
              "resends=%llu resend_dups=%llu misses=%llu errors=%llu refused=%llu torn_lines=%llu violations=%llu\n",
              (unsigned long long)runs, names.size(), (unsigned long long)total, (unsigned long long)acks,
              (unsigned long long)dups, (unsigned long long)dups_unmatched, (unsigned long long)resends,
              (unsigned long long)resend_dups, (unsigned long long)misses, (unsigned long long)errors,
              (unsigned long long)refused, (unsigned long long)torn, (unsigned long long)violations);
  if (problems.empty()) {
    std::printf("OK\n");
    return 0;
  }
  std::printf("FAIL: %zu problems\n", problems.size());
  for (size_t i = 0; i < problems.size() && i < 10; ++i) std::printf("  %s\n", problems[i].c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"weir crash-test child"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag wins
  app.add_option("--dir", f.dir, "state directory")->required();
  app.add_option("--object-store", f.object_store, "object store URI (default: file://DIR/objects)");
  app.add_option("--metastore", f.metastore, "metastore URI (default: sqlite://DIR/meta.db)");
  app.add_option("--mode", f.mode, "append | verify")->required()->check(CLI::IsMember({"append", "verify"}));
  app.add_option("--threads", f.threads)->check(CLI::Range(1, 256));
  app.add_option("--streams", f.streams)->check(CLI::Range(1, 1000));
  app.add_option("--ack-log", f.ack_log, "ack log file")->required();
  app.add_option("--seconds", f.seconds, "append mode stops after this long")->check(CLI::NonNegativeNumber);
  app.add_option("--put-error-rate", f.put_error_rate)->check(CLI::Range(0.0, 1.0));
  app.add_option("--put-timeout-rate", f.put_timeout_rate)->check(CLI::Range(0.0, 1.0));
  app.add_option("--put-ambiguous-rate", f.put_ambiguous_rate)->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", f.seed);
  app.add_option("--cache-bytes", f.cache_bytes, "append mode: log cache size");
  app.add_option("--settle-ms", f.settle_ms, "append mode: settle interval")->check(CLI::Range(1, 600000));
  app.add_option("--settle-min-bytes", f.settle_min_bytes, "a stream settles once it holds this much (0: every round)");
  app.add_option("--settle-max-delay-ms", f.settle_max_delay_ms, "or once its oldest record is this old")
      ->check(CLI::Range(0, 600000));
  app.add_option("--node", f.node, "node id (default crash-node)");
  app.add_option("--wal-stores", f.wal_stores, "WAL stores file://DIR/wal-<i> (0: the object store; 2+: a quorum)")
      ->check(CLI::Range(0, 8));
  app.add_option("--wal-down-store", f.wal_down_store, "append mode: this WAL store fails every PUT (-1: none)");
  app.add_option("--wal-store", f.wal_store_uri, "the WAL on this store (an object store URI or postgres://...)");
  app.add_option("--node-live-window-ms", f.node_live_window_ms,
                 "another node's heartbeat younger than this refuses the start")
      ->check(CLI::Range(1, 600000));
  CLI11_PARSE(app, argc, argv);
  return f.mode == "append" ? RunAppend(f) : RunVerify(f);
}
