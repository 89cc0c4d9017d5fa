#include "server/serve.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "base/fs.h"
#include "base/log.h"
#include "base/secret.h"
#include "base/tcp.h"
#include "flight/flight_server.h"
#include "http/rest.h"
#include "http/server.h"
#include "kafka/api_table.h"
#include "kafka/broker.h"
#include "kafka/tcp_server.h"
#include "log/engine.h"
#include "metastore/metastore.h"
#include "metastore/postgres_db.h"
#include "objstore/fault_store.h"
#include "objstore/object_store.h"
#include "objstore/s3_store.h"
#include "wal/quorum_store.h"
#include "wal/slot_format.h"

namespace weir::server {
namespace {

// A line on stderr whatever became of it: stderr piped into a reader that
// left fails the write (EPIPE; SIGPIPE is ignored), which fmt::print would
// throw out of the server. Log lines go through spdlog, which drops them.
void SayOnStderr(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// An exclusive advisory lock (flock) on DATA_DIR/LOCK. Owned by RunServe (a
// local, on its thread) until it returns; the fd closes with it. Acquire
// fails kPreconditionFailed while another process holds the lock.
class DataDirLock {
 public:
  ~DataDirLock() {
    if (fd_ >= 0) close(fd_);
  }
  Status Acquire(const std::string& dir) {
    // Each directory made is synced in its parent: the data dir's own entry
    // must outlive a crash as surely as what is acknowledged inside it.
    std::error_code ec;
    // Not normalised: "link/../d" is made where the OS takes it, as the
    // lock below and the stores inside are opened.
    const std::string abs = std::filesystem::absolute(dir, ec).string();
    if (ec) return IOError("cannot resolve data dir {}: {}", dir, ec.message());
    if (Status st = MakeDirsSynced(abs); !st.ok()) return st.WithContext("cannot create data dir " + dir);
    std::string path = dir + "/LOCK";
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return IOError("cannot open {}: {}", path, strerror(errno));
    if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        return HeldMessage(dir);
      }
      return IOError("cannot lock {}: {}", path, strerror(errno));
    }
    std::string pid = std::to_string(getpid()) + "\n";
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
      Log().warn("cannot record the pid in {}", path);
    }
    return Status::Ok();
  }

  // Whether another process holds `dir`'s lock now (creates nothing).
  static bool HeldElsewhere(const std::string& dir) {
    const std::string path = dir + "/LOCK";
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return held;
  }

  static Status HeldMessage(const std::string& dir) {
    return PreconditionFailed("another weir server is using data dir {} (it holds {}/LOCK)", dir, dir);
  }

 private:
  int fd_ = -1;
};

Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& addr, const char* flag) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("{} must be HOST:PORT, got \"{}\"", flag, addr);
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  // Digits only (no sign, no blank), as a port is written.
  const std::string_view digits = std::string_view(addr).substr(colon + 1);
  int port = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || digits.front() == '-' || ec != std::errc() || end != digits.data() + digits.size()) port = -1;
  if (port < 0 || port > 65535) return InvalidArgument("{} has a bad port: \"{}\"", flag, addr);
  return std::make_pair(host, static_cast<uint16_t>(port));
}

// A listen address's host as an IP literal: a name (localhost, the
// machine's own) is resolved, and its first address taken.
Result<std::string> ResolveListenHost(const std::string& host, const char* flag) {
  in6_addr scratch{};
  if (inet_pton(AF_INET, host.c_str(), &scratch) == 1 || inet_pton(AF_INET6, host.c_str(), &scratch) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || found == nullptr) {
    return InvalidArgument("{}: cannot resolve host \"{}\": {}", flag, host, rc != 0 ? gai_strerror(rc) : "no address");
  }
  const addrinfo* pick = PreferIPv4(found);
  char text[NI_MAXHOST] = {};
  const int named = getnameinfo(pick->ai_addr, pick->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
  freeaddrinfo(found);
  if (named != 0) return InvalidArgument("{}: cannot resolve host \"{}\": {}", flag, host, gai_strerror(named));
  return std::string(text);
}

// Whether HOST:PORT can be bound now (as the listener will: SO_REUSEADDR).
Status CheckCanListen(const std::string& host, uint16_t port, const char* flag) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    len = sizeof *v4;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    len = sizeof *v6;
  } else {
    return Status::Ok();  // not a literal: the listener's own bind reports it
  }
  const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Ok();
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return IOError("{} {}:{}: cannot listen there: {}", flag, host, port, strerror(err));
  return Status::Ok();
}

// --inject-put-latency-ms "P50[,P99]": {p50, p99} (p99 = p50 when absent),
// each a number of ms from 0 to 600000; nullopt for "".
Result<std::optional<std::pair<double, double>>> ParsePutLatency(std::string_view text) {
  if (text.empty()) return std::optional<std::pair<double, double>>();
  auto bad = [&](std::string_view why) {
    return InvalidArgument("--inject-put-latency-ms \"{}\": {} (expected P50[,P99] in ms, each 0 to 600000)", text,
                           why);
  };
  double values[2] = {0, 0};
  size_t n = 0;
  for (std::string_view rest = text;;) {
    const size_t comma = rest.find(',');
    const std::string_view piece = rest.substr(0, comma);
    if (n == 2) return bad("more than two values");
    double v = 0;
    auto [end, ec] = std::from_chars(piece.data(), piece.data() + piece.size(), v);
    if (piece.empty() || ec != std::errc() || end != piece.data() + piece.size() || !(v >= 0 && v <= 600000)) {
      return bad(fmt::format("\"{}\" is not a latency", piece));
    }
    values[n++] = v;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (n == 1) values[1] = values[0];
  if (values[1] < values[0]) return bad("P99 is below P50");
  return std::optional<std::pair<double, double>>(std::pair(values[0], values[1]));
}

// Connections, file:// objects and SQLite share the process's file
// descriptors: the soft limit is raised to the hard one, and a limit below
// what the connection limits allow is said at start (past it, accepts wait
// and file:// writes fail).
void RaiseOpenFileLimit(const ServeOptions& o) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  const uint64_t wanted = uint64_t{o.http_max_connections} + (o.kafka_addr.empty() ? 0 : o.kafka_max_connections) +
                          1024;  // stores, SQLite, WAL uploads, Flight
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < wanted) {
    Log().warn("the open-file limit is {} (ulimit -n), less than --http-max-connections and "
               "--kafka-max-connections allow with 1024 to spare ({}): connections past it wait to be accepted, "
               "and file:// writes may fail; raise the limit or lower those flags",
               static_cast<uint64_t>(rl.rlim_cur), wanted);
  }
}

// The fault flags must describe one distribution and rates that add up.
Status CheckFaultFlags(const ServeOptions& o) {
  WEIR_RETURN_IF_ERROR(ParsePutLatency(o.inject_put_latency_ms).status());
  if (o.inject_put_error_rate + o.inject_put_ambiguous_rate > 1.0) {
    return InvalidArgument("--inject-put-error-rate {} and --inject-put-ambiguous-rate {} add up to more than 1",
                           o.inject_put_error_rate, o.inject_put_ambiguous_rate);
  }
  return Status::Ok();
}

Result<std::optional<std::string>> ReadToken(const std::string& file) {
  if (file.empty()) return std::optional<std::string>();
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) return InvalidArgument("--auth-token-file {} is a directory", file);
  std::ifstream in(file);
  if (!in) return IOError("cannot read --auth-token-file {}", file);
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!token.empty() && isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  while (!token.empty() && isspace(static_cast<unsigned char>(token.front()))) token.erase(token.begin());
  if (token.empty()) return InvalidArgument("--auth-token-file {} is empty", file);
  // A bearer token has no blanks or control characters: one that did could
  // never be sent, and every request would get 401.
  for (unsigned char c : token) {
    if (c <= ' ' || c == 0x7f) {
      return InvalidArgument("--auth-token-file {} holds blanks or control characters inside its token", file);
    }
  }
  return std::optional<std::string>(token);
}

// The largest slot a WAL store on PostgreSQL takes (a value is at most 1 GB there).
constexpr size_t kMaxPostgresSlotBytes = 512u << 20;

// Opens one store, behind the fault injector when a fault flag is set
// (`which` seeds it, so each store of a quorum draws its own faults).
// A WAL store (`which` > 0) may also be postgres:// (slots as rows).
Result<std::shared_ptr<objstore::ObjectStore>> OpenOneStore(const ServeOptions& o, const std::string& uri,
                                                            uint64_t which) {
  objstore::OpenOptions open;
  open.allow_unconditional_put = o.allow_unconditional_put;
  const bool postgres = uri.starts_with("postgres://") || uri.starts_with("postgresql://");
  WEIR_ASSIGN_OR_RETURN(auto store, postgres && which > 0 ? metastore::OpenPostgresWalStore(uri)
                                                          : objstore::OpenObjectStore(uri, open));
  WEIR_ASSIGN_OR_RETURN(const auto latency, ParsePutLatency(o.inject_put_latency_ms));  // checked already
  bool faults = latency || o.inject_put_error_rate > 0 || o.inject_put_ambiguous_rate > 0;
  if (!faults) return store;
  objstore::FaultOptions f;
  f.seed = static_cast<uint64_t>(getpid()) * 1000 + which;
  if (latency) std::tie(f.put_latency.p50_ms, f.put_latency.p99_ms) = *latency;
  f.put_error_rate = o.inject_put_error_rate;
  f.put_ambiguous_rate = o.inject_put_ambiguous_rate;
  Log().warn("faults injected into {}: PUT latency p50 {} ms p99 {} ms, error rate {}, ambiguous rate {}",
             store->Describe(), f.put_latency.p50_ms, f.put_latency.p99_ms, f.put_error_rate, f.put_ambiguous_rate);
  return std::shared_ptr<objstore::ObjectStore>(std::make_shared<objstore::FaultStore>(store, f));
}

// --data-dir as an absolute path (checked before anything is made).
Result<std::string> AbsoluteDataDir(const ServeOptions& o) {
  if (o.data_dir.empty()) return InvalidArgument("--data-dir must not be empty");
  std::error_code ec;
  // Not normalised: "a/../b" goes where the OS takes it (through symlinks).
  std::string abs = std::filesystem::absolute(o.data_dir, ec).string();
  if (ec) return IOError("cannot resolve --data-dir {}: {}", o.data_dir, ec.message());
  while (abs.size() > 1 && abs.back() == '/') abs.pop_back();
  return abs;
}

Result<std::shared_ptr<objstore::ObjectStore>> OpenStore(const ServeOptions& o) {
  std::string uri = o.object_store;
  if (uri.empty()) {
    WEIR_ASSIGN_OR_RETURN(const std::string dir, AbsoluteDataDir(o));
    uri = "file://" + dir + "/objects";
  }
  return OpenOneStore(o, uri, 0);
}

// --wal-store: null when none is given (the WAL goes to the object store).
Result<std::shared_ptr<objstore::ObjectStore>> OpenWalStore(const ServeOptions& o) {
  if (o.wal_stores.empty()) return std::shared_ptr<objstore::ObjectStore>();
  std::vector<std::shared_ptr<objstore::ObjectStore>> stores;
  for (size_t i = 0; i < o.wal_stores.size(); ++i) {
    auto store = OpenOneStore(o, o.wal_stores[i], i + 1);
    if (!store.ok()) return store.status().WithContext(fmt::format("--wal-store {}", RedactUri(o.wal_stores[i])));
    stores.push_back(std::move(*store));
  }
  if (stores.size() == 1) return stores.front();
  wal::QuorumOptions q;
  q.write_quorum = static_cast<size_t>(o.wal_quorum);
  WEIR_ASSIGN_OR_RETURN(auto quorum, wal::QuorumStore::Open(std::move(stores), q));
  return std::shared_ptr<objstore::ObjectStore>(std::move(quorum));
}

// --wal-store and --wal-quorum must name distinct stores that keep what they
// are given, and a quorum they can make.
Status CheckWalStoreFlags(const ServeOptions& o, bool store_in_memory) {
  const size_t k = o.wal_stores.size();
  if (k > wal::QuorumStore::kMaxStores) {
    return InvalidArgument("at most {} --wal-store may be given; {} were", wal::QuorumStore::kMaxStores, k);
  }
  if (o.wal_quorum != 0 && k < 2) {
    return InvalidArgument("--wal-quorum {} needs two or more --wal-store (the express class); {} given",
                           o.wal_quorum, k);
  }
  if (k >= 2 && static_cast<size_t>(o.wal_quorum) > k) {
    return InvalidArgument("--wal-quorum {} is more than the {} --wal-store given", o.wal_quorum, k);
  }
  std::set<std::string> seen;
  for (const std::string& uri : o.wal_stores) {
    // The same store twice would take a copy's 412 for a second copy.
    if (!seen.insert(uri).second) return InvalidArgument("--wal-store {} is given twice", RedactUri(uri));
    if (!uri.starts_with("mem://") && store_in_memory) {
      return InvalidArgument("--object-store mem:// keeps nothing past exit, and --wal-store {} does: its slots "
                             "would outlive the records' catalog; use mem:// WAL stores with it",
                             RedactUri(uri));
    }
    if (uri.starts_with("mem://") && !store_in_memory) {
      return InvalidArgument("--wal-store {} keeps nothing past exit, and the object store and metastore do: a "
                             "restart would lose every unsettled record",
                             RedactUri(uri));
    }
  }
  return Status::Ok();
}

// S3 requests by operation and outcome, latency, retries, bytes.
void RenderS3Metrics(const objstore::S3Metrics& m, std::string* out) {
  using M = objstore::S3Metrics;
  *out += "# HELP weir_s3_requests_total S3 HTTP attempts by operation and outcome\n"
          "# TYPE weir_s3_requests_total counter\n";
  for (int op = 0; op < M::kOpCount; ++op) {
    for (int oc = 0; oc < M::kOutcomeCount; ++oc) {
      uint64_t n = m.requests[op][oc].load();
      if (n) *out += fmt::format("weir_s3_requests_total{{op=\"{}\",outcome=\"{}\"}} {}\n", M::OpName(op), M::OutcomeName(oc), n);
    }
  }
  *out += "# HELP weir_s3_retries_total S3 retries by operation\n# TYPE weir_s3_retries_total counter\n";
  for (int op = 0; op < M::kOpCount; ++op) {
    *out += fmt::format("weir_s3_retries_total{{op=\"{}\"}} {}\n", M::OpName(op), m.retries[op].load());
  }
  for (int op : {M::kPut, M::kGet}) {
    http::PromHistogramSeconds(out, fmt::format("weir_s3_{}_seconds", M::OpName(op)),
                               fmt::format("S3 {} latency per attempt", M::OpName(op)), m.latency_ns[op]);
  }
  http::PromCounter(out, "weir_s3_bytes_sent_total", "S3 request body bytes", m.bytes_sent.load());
  http::PromCounter(out, "weir_s3_bytes_received_total", "S3 response body bytes", m.bytes_received.load());
  http::PromCounter(out, "weir_s3_connections_opened_total", "New TCP connections to S3", m.connections_opened.load());
  http::PromCounter(out, "weir_s3_ambiguous_creates_total",
                    "Create-only PUTs whose outcome was unknown (an attempt may have landed)", m.ambiguous_creates.load());
}

// The express class's stores, by their position in --wal-store.
void RenderQuorumMetrics(const wal::QuorumStore& q, std::string* out) {
  struct Family {
    const char* name;
    const char* type;
    const char* help;
    std::atomic<uint64_t> wal::QuorumStoreCounters::*field;
  };
  static constexpr Family kFamilies[] = {
      {"weir_wal_quorum_copies_total", "counter", "WAL slot copies written to each --wal-store",
       &wal::QuorumStoreCounters::copies},
      {"weir_wal_quorum_copy_failures_total", "counter", "WAL slot copies that failed, by --wal-store",
       &wal::QuorumStoreCounters::copy_failures},
      {"weir_wal_quorum_copies_skipped_total", "counter",
       "WAL slot copies not sent: the --wal-store's backlog was full", &wal::QuorumStoreCounters::copies_skipped},
      {"weir_wal_quorum_backlog_bytes", "gauge", "Bytes of WAL slot copies queued or being written, by --wal-store",
       &wal::QuorumStoreCounters::backlog_bytes},
      {"weir_wal_quorum_requests_refused_total", "counter",
       "WAL reads, listings and deletes failed at once: too many queued for the --wal-store",
       &wal::QuorumStoreCounters::requests_refused},
  };
  for (const Family& f : kFamilies) {
    *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f.name, f.help, f.name, f.type);
    for (size_t i = 0; i < q.store_count(); ++i) {
      *out += fmt::format("{}{{store=\"{}\"}} {}\n", f.name, i, (q.counters(i).*f.field).load());
    }
  }
}

// The part of /metrics the HTTP layer does not own: WAL, engine, metastore, S3.
std::string RenderEngineMetrics(log::Engine* engine, metastore::Metastore* meta, objstore::ObjectStore* store) {
  std::string out;
  if (auto* f = dynamic_cast<objstore::FaultStore*>(store)) store = &f->inner();
  if (auto* s3 = dynamic_cast<objstore::S3Store*>(store)) RenderS3Metrics(s3->metrics(), &out);
  const auto& w = engine->wal().metrics();
  http::PromCounter(&out, "weir_wal_slots_total", "WAL slots written", w.slots.load());
  http::PromCounter(&out, "weir_wal_slot_bytes_total", "Bytes in WAL slots written", w.slot_bytes.load());
  http::PromCounter(&out, "weir_wal_put_attempts_total", "WAL slot PUT attempts", w.put_attempts.load());
  http::PromCounter(&out, "weir_wal_put_retries_total", "WAL slot PUT retries", w.put_retries.load());
  http::PromCounter(&out, "weir_wal_put_ambiguous_resolved_total", "Ambiguous PUTs resolved by reading back",
                    w.put_ambiguous_resolved.load());
  http::PromCounter(&out, "weir_wal_halts_total", "WAL chain halts (foreign slot occupant)", w.halts.load());
  http::PromGauge(&out, "weir_wal_stalled_seconds",
                  "How long the oldest WAL slot not yet durable has waited, or since slots were last acknowledged if "
                  "less (0: none pending)",
                  std::chrono::duration<double>(engine->wal().StalledFor(Now())).count());
  if (auto* q = dynamic_cast<wal::QuorumStore*>(&engine->wal_store())) RenderQuorumMetrics(*q, &out);
  out += "# HELP weir_wal_stalls_total Appends or cuts that waited, by cause\n# TYPE weir_wal_stalls_total counter\n";
  out += fmt::format("weir_wal_stalls_total{{cause=\"budget_uploads\"}} {}\n", w.stall_budget_uploads.load());
  out += fmt::format("weir_wal_stalls_total{{cause=\"budget_halted\"}} {}\n", w.stall_budget_halted.load());
  out += fmt::format("weir_wal_stalls_total{{cause=\"window\"}} {}\n", w.stall_window.load());
  out += fmt::format("weir_wal_stalls_total{{cause=\"admission_timeout\"}} {}\n", w.admission_timeouts.load());
  http::PromGauge(&out, "weir_wal_pool_bytes", "Admitted, unacknowledged bytes in the WAL pool",
                  static_cast<double>(w.pool_bytes.load()));
  http::PromGauge(&out, "weir_wal_slots_in_flight", "WAL slots being uploaded",
                  static_cast<double>(w.slots_in_flight.load()));
  http::PromHistogramSeconds(&out, "weir_wal_put_seconds", "WAL slot PUT latency, first attempt to durable",
                             w.put_latency_ns);
  http::PromHistogramSeconds(&out, "weir_wal_ack_seconds", "WAL latency, append to acknowledgement", w.ack_latency_ns);
  http::PromHistogramSeconds(&out, "weir_wal_cut_wait_seconds", "WAL latency, append to its slot's cut",
                             w.cut_wait_ns);
  http::PromHistogramSeconds(&out, "weir_wal_release_wait_seconds",
                             "WAL latency, slot durable to released (waiting for earlier slots)", w.release_wait_ns);
  const auto& e = engine->metrics();
  http::PromCounter(&out, "weir_settle_cycles_total", "Settle cycles", e.settle_cycles.load());
  http::PromCounter(&out, "weir_settle_failures_total", "Settle cycles that failed", e.settle_failures.load());
  http::PromCounter(&out, "weir_segments_written_total", "Segments written", e.segments_written.load());
  http::PromCounter(&out, "weir_segment_bytes_total", "Bytes in segments written", e.segment_bytes.load());
  http::PromCounter(&out, "weir_segments_deleted_total", "Segments deleted by retention or trim",
                    e.segments_deleted.load());
  http::PromCounter(&out, "weir_segment_delete_failures_total",
                    "Deletes of unreferenced segment objects that failed (tried again by retention passes)",
                    e.segment_delete_failures.load());
  http::PromGauge(&out, "weir_segments_undeleted", "Unreferenced segment objects waiting for a delete retried",
                  e.segments_undeleted.load());
  http::PromCounter(&out, "weir_empty_streams_deleted_total", "Streams deleted by delete_on_empty",
                    e.empty_streams_deleted.load());
  http::PromCounter(&out, "weir_segment_merges_total", "Merged segments written from runs of small ones",
                    e.segment_merges.load());
  http::PromCounter(&out, "weir_segments_merged_total", "Small segments replaced by merged ones",
                    e.segments_merged.load());
  http::PromCounter(&out, "weir_settle_cached_bytes_total", "Batch bytes settle took from the log cache",
                    e.settle_cached_bytes.load());
  http::PromCounter(&out, "weir_settle_reread_bytes_total", "Batch bytes settle read back from WAL slots",
                    e.settle_reread_bytes.load());
  http::PromGauge(&out, "weir_unsettled_bytes", "Acknowledged bytes in WAL slots, not yet settled",
                  static_cast<double>(engine->unsettled_bytes()));
  http::PromGauge(&out, "weir_streams", "Streams this server holds (--max-streams)",
                  static_cast<double>(engine->stream_count()));
  http::PromCounter(&out, "weir_stream_creates_refused_total", "Creates of streams, tables, topics or partitions refused by --max-streams",
                    e.stream_creates_refused.load());
  http::PromGauge(&out, "weir_settle_waiting_streams",
                  "Streams the last settle round left to gather more (--settle-min-kib)",
                  static_cast<double>(e.settle_waiting_streams.load()));
  http::PromGauge(&out, "weir_settle_waiting_bytes", "Acknowledged bytes of the streams the last settle round left",
                  static_cast<double>(e.settle_waiting_bytes.load()));
  out += "# HELP weir_admission_waits_total Waits for admission holding no thread (one per request, or per group of "
         "a request's batches or a session's inputs that fits the pool), by what was full\n"
         "# TYPE weir_admission_waits_total counter\n";
  out += fmt::format("weir_admission_waits_total{{cause=\"wal_pool\"}} {}\n", e.admission_waits_pool.load());
  out += fmt::format("weir_admission_waits_total{{cause=\"settle_backlog\"}} {}\n", e.admission_waits_backlog.load());
  http::PromCounter(&out, "weir_admission_wait_timeouts_total",
                    "Waits for admission that ran out (their appends admitted at once if there was room, else refused)",
                    e.admission_wait_timeouts.load());
  http::PromCounter(&out, "weir_admission_waits_abandoned_total",
                    "Waits for admission ended because the client left or the S2S session ended (their appends dropped)",
                    e.admission_waits_abandoned.load());
  http::PromCounter(&out, "weir_settle_backlog_timeouts_total",
                    "Appends refused because settle was behind (--max-unsettled-mib)", e.settle_backlog_timeouts.load());
  const auto& m = meta->counters();
  out += "# HELP weir_metastore_ops_total Metastore operations\n# TYPE weir_metastore_ops_total counter\n";
  out += fmt::format("weir_metastore_ops_total{{op=\"read\"}} {}\n", m.reads.load());
  out += fmt::format("weir_metastore_ops_total{{op=\"write\"}} {}\n", m.writes.load());
  http::PromCounter(&out, "weir_metastore_transactions_total", "Metastore write transactions", m.transactions.load());
  return out;
}

}  // namespace

namespace {

// Requests begun and not yet answered: receiving() first, so a request
// moving from it to in_flight() meanwhile is counted.
int64_t OpenRequests(const http::HttpServer& server) {
  const int64_t receiving = server.receiving();
  return receiving + server.in_flight();
}

void RenderHttpServerMetrics(std::string* out, const http::HttpServer& server) {
  const http::HttpServerMetrics& m = server.metrics();
  http::PromCounter(out, "weir_http_connections_total", "HTTP connections accepted", m.connections.load());
  http::PromGauge(out, "weir_http_open_connections", "Open HTTP connections", m.open_connections.load());
  http::PromGauge(out, "weir_http_requests_open",
                  "HTTP requests begun and not yet answered, this scrape included",
                  static_cast<double>(OpenRequests(server)));
  http::PromGauge(out, "weir_http_request_bytes_in_flight", "Bytes of HTTP request bodies admitted and not yet answered",
                  static_cast<double>(m.in_flight_bytes.load()));
  http::PromCounter(out, "weir_http_request_budget_waits_total",
                    "HTTP requests whose body waited unread for --http-max-in-flight-mib", m.budget_waits.load());
  http::PromCounter(out, "weir_http_request_budget_timeouts_total",
                    "HTTP requests refused (429) after waiting --http-stall-timeout-s for --http-max-in-flight-mib",
                    m.budget_timeouts.load());
  http::PromGauge(out, "weir_http_response_bytes_unwritten",
                  "Bytes of HTTP responses queued for clients and not yet written (--http-max-unwritten-mib)",
                  static_cast<double>(m.unwritten_bytes.load()));
  http::PromCounter(out, "weir_http_rejected_connections_total", "HTTP connections closed over --http-max-connections",
                    m.rejected_connections.load());
  http::PromCounter(out, "weir_http2_connections_total", "HTTP connections that spoke HTTP/2",
                    m.http2_connections.load());
  http::PromCounter(out, "weir_http_request_budget_refusals_total",
                    "HTTP/2 request bodies and S2S inputs refused with 429 for --http-max-in-flight-mib",
                    m.budget_refusals.load());
}

void RenderFlightMetrics(std::string* out, const flight::FlightServer& f) {
  const auto& m = f.metrics();
  http::PromCounter(out, "weir_flight_put_calls_total", "Flight DoPut calls", m.put_calls.load());
  http::PromCounter(out, "weir_flight_put_calls_refused_total", "Flight DoPut calls refused over --flight-max-put-calls",
                    m.put_calls_refused.load());
  http::PromCounter(out, "weir_flight_get_calls_refused_total", "Flight DoGet calls refused over --flight-max-get-calls",
                    m.get_calls_refused.load());
  http::PromCounter(out, "weir_flight_info_calls_refused_total",
                    "Flight GetFlightInfo, GetSchema, PollFlightInfo, ListFlights, ListActions and DoAction calls "
                    "refused over --flight-max-info-calls",
                    m.info_calls_refused.load());
  http::PromCounter(out, "weir_flight_handshake_calls_refused_total",
                    "Flight Handshake calls refused over --flight-max-info-calls (counted apart)",
                    m.handshake_calls_refused.load());
  http::PromGauge(out, "weir_flight_open_put_calls", "Flight DoPut calls open", m.open_put_calls.load());
  http::PromGauge(out, "weir_flight_open_handshake_calls", "Flight Handshake calls open",
                  m.open_handshake_calls.load());
  http::PromGauge(out, "weir_flight_open_info_calls",
                  "Flight GetFlightInfo, GetSchema, PollFlightInfo, ListFlights, ListActions and DoAction calls open",
                  m.open_info_calls.load());
  http::PromGauge(out, "weir_flight_open_get_calls", "Flight DoGet calls open (following a tail or not)",
                  m.open_get_calls.load());
  http::PromCounter(out, "weir_flight_batches_total", "Arrow record batches DoPut appended (durable)", m.batches.load());
  http::PromCounter(out, "weir_flight_rows_total", "Rows DoPut appended (durable)", m.rows.load());
  http::PromCounter(out, "weir_flight_body_bytes_total", "Arrow body bytes of the batches DoPut appended", m.bytes.load());
  http::PromCounter(out, "weir_flight_duplicated_batches_total",
                    "DoPut appends a writer had already made (answered with their offsets)",
                    m.duplicated_batches.load());
  http::PromCounter(out, "weir_flight_errors_total", "DoPut messages refused and appends failed", m.errors.load());
}

void RenderKafkaMetrics(std::string* out, const kafka::Broker& b, const kafka::TcpServer& k) {
  const auto& m = b.metrics();
  *out += "# HELP weir_kafka_requests_total Kafka requests by API\n# TYPE weir_kafka_requests_total counter\n";
  for (const auto& api : kafka::kSupportedApis) {
    *out += fmt::format("weir_kafka_requests_total{{api=\"{}\"}} {}\n", api.name,
                        m.requests_by_api[api.key].load());
  }
  http::PromCounter(out, "weir_kafka_bad_requests_total", "Kafka requests that could not be decoded (connection closed)",
                    m.bad_requests.load());
  http::PromCounter(out, "weir_kafka_produce_batches_total", "Record batches produced", m.produce_batches.load());
  http::PromCounter(out, "weir_kafka_produce_bytes_total", "Record batch bytes produced", m.produce_bytes.load());
  http::PromCounter(out, "weir_kafka_produce_errors_total", "Produced batches whose append failed",
                    m.produce_errors.load());
  http::PromCounter(out, "weir_kafka_fetch_bytes_total", "Record batch bytes fetched", m.fetch_bytes.load());
  http::PromCounter(out, "weir_kafka_offset_commits_total", "Committed group offsets", m.offset_commits.load());
  http::PromCounter(out, "weir_kafka_offset_groups_expired_total",
                    "Groups whose committed offsets expired (no members, no commit for the retention)",
                    m.offset_groups_expired.load());
  http::PromCounter(out, "weir_kafka_groups_deleted_total", "Consumer groups deleted (DeleteGroups)",
                    m.groups_deleted.load());
  http::PromCounter(out, "weir_kafka_connections_total", "Kafka connections accepted", k.metrics().connections.load());
  http::PromGauge(out, "weir_kafka_open_connections", "Open Kafka connections", k.metrics().open_connections.load());
  http::PromGauge(out, "weir_kafka_requests_in_flight", "Kafka requests not yet answered", k.metrics().in_flight.load());
  http::PromGauge(out, "weir_kafka_request_bytes_in_flight", "Bytes of Kafka requests read and not yet answered",
                  static_cast<double>(k.metrics().in_flight_bytes.load()));
  http::PromGauge(out, "weir_kafka_response_bytes_unwritten",
                  "Bytes of Kafka responses answered and not yet written (all connections)",
                  static_cast<double>(k.metrics().unwritten_bytes.load()));
  http::PromGauge(out, "weir_kafka_fetches_waiting", "Kafka fetches waiting for data (long polls)",
                  m.fetches_waiting.load());
  http::PromCounter(out, "weir_kafka_fetches_without_room_total",
                    "Kafka fetch passes that read nothing: unwritten responses filled their budget",
                    m.fetches_without_room.load());
  http::PromCounter(out, "weir_kafka_request_budget_waits_total",
                    "Kafka requests that waited unread for --kafka-max-in-flight-mib", k.metrics().budget_waits.load());
  http::PromCounter(out, "weir_kafka_rejected_connections_total", "Kafka connections closed over --kafka-max-connections",
                    k.metrics().rejected_connections.load());
  http::PromCounter(out, "weir_kafka_stalled_connections_total",
                    "Kafka connections closed by --kafka-stall-timeout-s (a request body or the responses stalled)",
                    k.metrics().stalled.load());
  auto stats = b.groups().Stats();
  http::PromGauge(out, "weir_kafka_groups", "Consumer groups", static_cast<double>(stats.groups));
  http::PromGauge(out, "weir_kafka_group_members", "Consumer group members", static_cast<double>(stats.members));
  http::PromCounter(out, "weir_kafka_rebalances_total", "Group rebalances completed",
                    static_cast<double>(stats.rebalances_completed));
}

// While recovery runs (minutes, with a large WAL on a slow store), a SIGTERM
// or SIGINT ends the process as the signal's default action would: nothing
// is acknowledged before recovery ends, and a recovery cut short is a crash
// the next start recovers from. A supervisor need not wait for it to stop.
// Owned by RunServe, from opening the stores to the end of Engine::Open; its thread sigtimedwaits
// for the signals RunServe blocked, until destroyed.
class RecoverySignals {
 public:
  explicit RecoverySignals(const sigset_t& signals) : thread_([this, signals] { Watch(signals); }) {}
  ~RecoverySignals() {
    done_.store(true);
    thread_.join();
  }
  RecoverySignals(const RecoverySignals&) = delete;
  RecoverySignals& operator=(const RecoverySignals&) = delete;

 private:
  void Watch(sigset_t signals) {
    const timespec tick{0, 100'000'000};
    while (!done_.load()) {
      const int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig <= 0) continue;
      static const char kMsg[] = "weir serve: signal during recovery; stopping now (nothing was acknowledged yet; "
                                 "the next start recovers)\n";
      (void)!::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
      ::signal(sig, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      ::raise(sig);
      std::_Exit(128 + sig);
    }
  }

  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

int RunServe(const ServeOptions& o) {
  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A write to a closed pipe or socket fails with EPIPE instead of ending
  // the process (stderr piped into a reader that left; a library's socket
  // written without MSG_NOSIGNAL): a log line must not skip the drain.
  ::signal(SIGPIPE, SIG_IGN);

  auto fail = [](const Status& st) {
    // Said even with logging off (WEIR_LOG_LEVEL=off): the reason it exits.
    if (Log().should_log(spdlog::level::err)) {
      Log().error("weir serve: {}", st.message());
    } else {
      SayOnStderr(fmt::format("weir serve: {}\n", st.message()));
    }
    return 1;
  };
  // Every flag is checked before anything on disk changes.
  if (Status st = CheckFaultFlags(o); !st.ok()) return fail(st);
  if (Status st = CheckWalStoreFlags(o, o.object_store.starts_with("mem://")); !st.ok()) return fail(st);
  if (Status st = wal::ValidateNodeId(o.node_id); !st.ok()) return fail(st.WithContext("--node-id"));
  if ((uint64_t{o.pool_budget_mib} << 20) < o.max_slot_bytes) {
    return fail(InvalidArgument("--pool-budget-mib {} must hold at least one slot (--max-slot-bytes {})",
                                o.pool_budget_mib, o.max_slot_bytes));
  }
  auto addr = ParseHostPort(o.http_addr, "--http-addr");
  if (!addr.ok()) return fail(addr.status());
  if (auto host = ResolveListenHost(addr->first, "--http-addr"); host.ok()) {
    addr->first = *host;
  } else {
    return fail(host.status());
  }
  std::optional<std::pair<std::string, uint16_t>> kafka_addr, kafka_advertised;
  std::string kafka_listen_name;
  if (!o.kafka_addr.empty()) {
    auto a = ParseHostPort(o.kafka_addr, "--kafka-addr");
    if (!a.ok()) return fail(a.status());
    auto host = ResolveListenHost(a->first, "--kafka-addr");
    if (!host.ok()) return fail(host.status());
    kafka_listen_name = a->first;  // advertised as given (a name), unless --kafka-advertised-addr says otherwise
    a->first = *host;
    kafka_addr = *a;
  }
  if (!o.kafka_advertised_addr.empty()) {
    auto a = ParseHostPort(o.kafka_advertised_addr, "--kafka-advertised-addr");
    if (!a.ok()) return fail(a.status());
    if (a->second == 0) {
      return fail(InvalidArgument("--kafka-advertised-addr {} names port 0, which no client can connect to",
                                  o.kafka_advertised_addr));
    }
    kafka_advertised = *a;
  }
  // Kafka clients connect to the address the broker advertises, not the one
  // they bootstrapped from: a wildcard there would send them to themselves.
  auto wildcard = [](const std::string& host) { return host == "0.0.0.0" || host == "::"; };
  if (kafka_advertised && wildcard(kafka_advertised->first)) {
    return fail(InvalidArgument("--kafka-advertised-addr {} is not an address a client can connect to",
                                o.kafka_advertised_addr));
  }
  if (kafka_addr && !kafka_advertised && wildcard(kafka_addr->first)) {
    return fail(InvalidArgument("--kafka-addr {} listens on every interface: set --kafka-advertised-addr "
                                "HOST:PORT to the address Kafka clients should connect to",
                                o.kafka_addr));
  }
  std::optional<std::pair<std::string, uint16_t>> flight_addr;
  if (!o.flight_addr.empty()) {
    auto a = ParseHostPort(o.flight_addr, "--flight-addr");
    if (!a.ok()) return fail(a.status());
    auto host = ResolveListenHost(a->first, "--flight-addr");
    if (!host.ok()) return fail(host.status());
    a->first = *host;
    flight_addr = *a;
  }
  // Two listeners on one port (a wildcard host covers the addresses of its
  // family): the second bind would fail only after recovery.
  {
    std::vector<std::pair<const char*, std::pair<std::string, uint16_t>>> listeners = {{"--http-addr", *addr}};
    if (kafka_addr) listeners.emplace_back("--kafka-addr", *kafka_addr);
    if (flight_addr) listeners.emplace_back("--flight-addr", *flight_addr);
    for (size_t i = 0; i < listeners.size(); ++i) {
      for (size_t j = i + 1; j < listeners.size(); ++j) {
        const auto& [a_flag, a] = listeners[i];
        const auto& [b_flag, b] = listeners[j];
        // A wildcard covers the addresses of its own family.
        auto covers = [&](const std::string& w, const std::string& h) {
          return (w == "0.0.0.0" && h.find(':') == std::string::npos) || (w == "::" && h.find(':') != std::string::npos);
        };
        if (a.second != 0 && a.second == b.second &&
            (a.first == b.first || covers(a.first, b.first) || covers(b.first, a.first))) {
          return fail(InvalidArgument("{} and {} both name port {}: each listener needs a port of its own", a_flag,
                                      b_flag, a.second));
        }
      }
    }
  }
  // The stores' URIs are checked before the data dir is made.
  if (!o.object_store.empty()) {
    if (Status st = objstore::CheckObjectStoreScheme(o.object_store); !st.ok()) {
      return fail(st.WithContext("--object-store"));
    }
  }
  for (const std::string& w : o.wal_stores) {
    if (w.starts_with("postgres://") || w.starts_with("postgresql://")) {  // a WAL store on PostgreSQL
      // A slot is one bytea value, and PostgreSQL refuses any value over 1 GB
      // (the connection drops, which reads as "retry": its PUT would be sent for ever).
      if (o.max_slot_bytes > kMaxPostgresSlotBytes) {
        return fail(InvalidArgument("--max-slot-bytes {} is over {} bytes, the most a --wal-store on PostgreSQL takes",
                                    o.max_slot_bytes, kMaxPostgresSlotBytes));
      }
      continue;
    }
    if (Status st = objstore::CheckObjectStoreScheme(w); !st.ok()) return fail(st.WithContext("--wal-store"));
  }
  if (!o.metastore.empty()) {
    if (Status st = metastore::CheckMetastoreScheme(o.metastore); !st.ok()) return fail(st.WithContext("--metastore"));
  }
  auto token = ReadToken(o.auth_token_file);
  if (!token.ok()) return fail(token.status());
  if (token->has_value() && kafka_addr) {
    // Kafka has no SASL here: its listener serves every client it reaches.
    Log().warn("weir serve: --auth-token-file guards the REST API and Arrow Flight, not the Kafka listener on {}: "
               "any client that reaches it may produce, fetch and delete topics (keep it on a trusted network)",
               o.kafka_addr);
  }
  RaiseOpenFileLimit(o);

  // A store in memory forgets every object at exit: a metastore on disk would
  // then list segments and a checkpoint that no longer exist.
  const bool store_in_memory = o.object_store.starts_with("mem://");
  std::string meta_uri = o.metastore;
  if (meta_uri.empty() && store_in_memory) meta_uri = "sqlite://:memory:";
  if (meta_uri.empty() || o.object_store.empty()) {  // the data dir is used
    auto dir = AbsoluteDataDir(o);
    if (!dir.ok()) return fail(dir.status());
    if (meta_uri.empty()) meta_uri = "sqlite://" + *dir + "/meta.db";
  }
  if (store_in_memory && meta_uri != "sqlite://:memory:") {
    return fail(InvalidArgument("--object-store mem:// keeps nothing past exit; the metastore {} would, and would "
                                "then name objects that are gone: use sqlite://:memory: (the default with mem://)",
                                meta_uri.starts_with("sqlite://") ? meta_uri : "on a server"));
  }
  // The other way round: a catalog, checkpoint and segment list forgotten
  // at exit, with the objects they name (and unsettled WAL slots) kept.
  if (!store_in_memory && meta_uri == "sqlite://:memory:") {
    return fail(InvalidArgument("--metastore sqlite://:memory: keeps nothing past exit, and the object store "
                                "does: a restart would lose every acknowledged record; use it only with "
                                "--object-store mem://"));
  }
  // The data dir is made and locked only when something lives there (the
  // default file:// store or SQLite metastore): a node on s3:// and
  // postgres://, or on mem://, keeps nothing on its own disk.
  const bool uses_data_dir = o.object_store.empty() || (o.metastore.empty() && !store_in_memory);
  // A port in use by a server on this data dir (a second `weir serve` in
  // the same directory) is named as that server's lock.
  auto listen_failed = [&](const Status& st) {
    if (uses_data_dir && DataDirLock::HeldElsewhere(o.data_dir)) {
      Status held = DataDirLock::HeldMessage(o.data_dir);
      return fail(PreconditionFailed("{} ({})", held.message(), st.message()));
    }
    return fail(st);
  };
  if (addr->second != 0) {
    // Bound once the stores are open: a port in use is found before the
    // data dir is made.
    if (Status st = CheckCanListen(addr->first, addr->second, "--http-addr"); !st.ok()) return listen_failed(st);
  }
  if (kafka_addr && kafka_addr->second != 0) {
    // Bound only after recovery (the broker needs the engine): a port in use
    // is found now, not minutes later (after the flags' own checks: a port
    // someone else holds says nothing about them).
    if (Status st = CheckCanListen(kafka_addr->first, kafka_addr->second, "--kafka-addr"); !st.ok()) {
      return listen_failed(st);
    }
  }
  if (flight_addr && flight_addr->second != 0) {
    if (Status st = CheckCanListen(flight_addr->first, flight_addr->second, "--flight-addr"); !st.ok()) {
      return listen_failed(st);
    }
  }
  // From here until recovery ends a signal stops the process at once:
  // opening an unreachable S3 store or metastore can take minutes of retries.
  std::optional<RecoverySignals> stop_early;
  stop_early.emplace(signals);
  DataDirLock lock;
  if (uses_data_dir) {
    if (Status st = lock.Acquire(o.data_dir); !st.ok()) return fail(st);
  }

  auto store = OpenStore(o);
  if (!store.ok()) return fail(store.status().WithContext("object store"));
  auto wal_store = OpenWalStore(o);
  if (!wal_store.ok()) return fail(wal_store.status().WithContext("WAL store"));
  auto meta = metastore::OpenMetastore(meta_uri);
  if (!meta.ok()) return fail(meta.status().WithContext("metastore"));

  log::EngineOptions eo;
  eo.node = o.node_id;
  eo.wal_store = *wal_store;
  eo.group_offsets_basin = kafka::kKafkaBasin;
  eo.wal.window = o.pipeline_window;
  eo.wal.slot_cap_bytes = o.max_slot_bytes;
  eo.wal.linger = std::chrono::microseconds(static_cast<int64_t>(o.linger_ms * 1000));
  eo.wal.linger_put_share = o.linger_put_percent / 100;
  eo.retention_interval = std::chrono::milliseconds(static_cast<int64_t>(o.retention_interval_s * 1000));
  eo.wal.budget_bytes = o.pool_budget_mib << 20;
  eo.wal.close_timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o.wal_close_timeout_s));
  eo.log_cache_bytes = o.log_cache_mib << 20;
  eo.max_unsettled_bytes = uint64_t{o.max_unsettled_mib} << 20;
  eo.settle_min_bytes = o.settle_min_kib << 10;
  eo.max_streams = o.max_streams;
  eo.max_basins = o.max_basins;
  eo.settle_max_delay = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(o.settle_max_delay_s));
  eo.segment_uploads = (*store)->PreferredParallelPuts();
  eo.admission_timeout = std::chrono::microseconds(static_cast<int64_t>(o.admission_timeout_ms * 1000));

  http::RestOptions ro;
  ro.auth_token = *token;
  ro.kept_basins = {eo.group_offsets_basin};
  ro.max_append_records = eo.max_append_records;
  ro.max_append_bytes = eo.max_append_bytes;
  ro.max_request_bytes = o.max_request_bytes;
  // Listen first, so /health answers 503 during recovery; the engine is
  // attached once it has recovered.
  http::RestApi rest(nullptr, ro);
  http::ServerOptions so;
  so.host = addr->first;
  so.port = addr->second;
  so.max_request_bytes = o.max_request_bytes;
  so.io_threads = o.http_threads;
  so.worker_threads = o.worker_threads;
  so.max_in_flight_bytes = o.http_max_in_flight_mib << 20;
  so.max_unwritten_bytes = o.http_max_unwritten_mib << 20;
  so.max_connections = o.http_max_connections;
  so.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.http_stall_timeout_s * 1000));

  Log().info("weir serve: recovering (object store {}, metastore {}{})", (*store)->Describe(), (*meta)->Describe(),
             *wal_store ? ", WAL store " + (*wal_store)->Describe() : std::string());
  auto server = http::HttpServer::Start(so, &rest);
  if (!server.ok()) return fail(server.status());
  auto started = Now();
  auto engine = log::Engine::Open(eo, *store, *meta);
  stop_early.reset();
  if (!engine.ok()) return fail(engine.status().WithContext("recovery"));
  Status basin = (*engine)->CreateBasin(ro.default_basin);
  if (!basin.ok() && basin.code() != Code::kAlreadyExists) {
    return fail(basin.WithContext("creating the default basin " + ro.default_basin));
  }
  // Kafka: after recovery (clients retry their connections meanwhile).
  std::unique_ptr<kafka::Broker> broker;
  std::unique_ptr<kafka::TcpServer> kafka_server;
  if (kafka_addr) {
    kafka::BrokerOptions bo;
    bo.auto_create_partitions = o.kafka_auto_create_partitions;
    // Kafka's num.partitions: auto-created topics and CreateTopics asking for -1.
    if (o.kafka_auto_create_partitions > 0) bo.default_partitions = o.kafka_auto_create_partitions;
    bo.max_batch_bytes = eo.max_batch_bytes;
    broker = std::make_unique<kafka::Broker>(bo, (*engine).get(), *meta);
    if (Status st = broker->Init(); !st.ok()) return fail(st);
    kafka::TcpServerOptions ko;
    ko.host = kafka_addr->first;
    ko.port = kafka_addr->second;
    ko.max_request_bytes = o.kafka_max_request_bytes;
    ko.max_in_flight_bytes = o.kafka_max_in_flight_mib << 20;
    ko.max_unwritten_total_bytes = o.kafka_max_unwritten_mib << 20;
    ko.max_connections = o.kafka_max_connections;
    ko.stall_timeout = std::chrono::microseconds(static_cast<int64_t>(o.kafka_stall_timeout_s * 1e6));
    ko.worker_threads = std::max(2, o.worker_threads / 2);
    ko.read_threads = std::max(2, o.worker_threads / 2);  // fetches: reads may wait on the object store
    ko.accept_at_start = false;  // until the broker knows the address it advertises
    auto ks = kafka::TcpServer::Start(ko, broker.get());
    if (!ks.ok()) return fail(ks.status());
    kafka_server = std::move(*ks);
    auto bound = ParseHostPort(kafka_server->address(), "kafka");
    if (!bound.ok()) return fail(bound.status());
    bo.advertised_host = kafka_advertised ? kafka_advertised->first
                         : kafka_listen_name != kafka_addr->first && !kafka_listen_name.empty()
                             ? kafka_listen_name  // a name the listen address was resolved from
                             : bound->first;
    bo.advertised_port = kafka_advertised ? kafka_advertised->second : bound->second;
    broker->SetAdvertised(bo.advertised_host, bo.advertised_port);
  }
  // Arrow Flight: after recovery, as Kafka; log tables are the Kafka basin's.
  std::unique_ptr<flight::FlightServer> flight_server;
  if (flight_addr) {
    flight::FlightOptions fo;
    fo.host = flight_addr->first;
    fo.port = flight_addr->second;
    fo.max_message_bytes = o.flight_max_message_mib << 20;
    fo.max_put_calls = o.flight_max_put_calls;
    fo.max_get_calls = o.flight_max_get_calls;
    fo.max_info_calls = o.flight_max_info_calls;
    fo.max_batch_bytes = eo.max_batch_bytes;
    fo.auth_token = token->value_or("");
    fo.default_basin = kafka::kKafkaBasin;
    auto fs = flight::FlightServer::Start(fo, (*engine).get());
    if (!fs.ok()) return fail(fs.status());
    flight_server = std::move(*fs);
  }
  // Kafka accepts only once nothing else can fail: a failed start destroys
  // the broker and its listener before the engine, whose close would answer
  // their produces' callbacks.
  if (kafka_server) {
    kafka_server->StartAccepting();
    // Once another process holds this node, its Kafka clients can reach the
    // successor only over a new connection: answering NOT_LEADER_OR_FOLLOWER,
    // they would ask this process for metadata again, which names itself.
    // So the listener closes, and each connection closes once answered (a
    // long-polling fetch is woken; the broker answers waiting joins).
    (*engine)->OnSuperseded([k = kafka_server.get()] {
      Log().warn("kafka: node superseded by another process; closing the Kafka listener and its connections");
      k->StopAccepting();
      k->CloseConnectionsWhenAnswered();
    });
  }
  rest.SetMetricsRenderer([e = (*engine).get(), m = (*meta).get(), s = (*store).get(), b = broker.get(),
                           k = kafka_server.get(), h = (*server).get(), f = flight_server.get()] {
    std::string out = RenderEngineMetrics(e, m, s);
    RenderHttpServerMetrics(&out, *h);
    if (b) RenderKafkaMetrics(&out, *b, *k);
    if (f) RenderFlightMetrics(&out, *f);
    return out;
  });
  rest.SetEngine((*engine).get());
  rest.SetReady();
  // Printed at every log level: scripts and tests wait for this line.
  SayOnStderr(fmt::format(
      "weir serve: recovered in {:.0f} ms; epoch {}; listening on http://{}{}{}\n", ToMillis(Now() - started),
      (*engine)->epoch(), (*server)->address(),
      kafka_server ? " and kafka://" + kafka_server->address() : std::string(),
      flight_server ? fmt::format(" and grpc://{}:{} (flight)",
                                  flight_addr->first.find(':') != std::string::npos ? "[" + flight_addr->first + "]"
                                                                                    : flight_addr->first,
                                  flight_server->port())
                    : std::string()));

  int sig = 0;
  sigwait(&signals, &sig);
  Log().info("weir serve: {} received, draining", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  // Which step of the stop runs now: said on stderr once the stop takes a
  // minute longer than its drain timeout and the WAL's close timeout
  // together (a slow store's final settle may too), so a stop that hangs
  // names its step. (It runs until the process ends; it touches only this
  // static and stderr.)
  static std::atomic<const char*> stopping_step{"draining requests"};
  std::thread([limit = std::chrono::duration<double>(o.drain_timeout_s) + eo.wal.close_timeout +
                       std::chrono::seconds(60)] {
    const TimePoint began = Now();
    TimePoint next = began + std::chrono::duration_cast<Duration>(limit);
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (Now() < next) continue;
      const std::string msg = fmt::format("weir serve: still stopping after {:.0f} s: {}\n", ToMillis(Now() - began) / 1000,
                                          stopping_step.load());
      (void)!::write(STDERR_FILENO, msg.data(), msg.size());
      next = Now() + std::chrono::seconds(30);
    }
  }).detach();
  // A second SIGINT (Ctrl-C) ends the drain at once, as a crash would (the
  // next start recovers); another SIGTERM changes nothing (supervisors may
  // repeat it); the drain is bounded anyway (--drain-timeout-s, then the
  // WAL's close). Once the drain is done, a SIGINT still ends the process
  // (status 0: what was acknowledged is settled), should its last
  // destructors hang.
  // (It outlives this function: it logs nothing, so it touches no state
  // the process's exit destroys.)
  static std::atomic<bool> drained{false};
  std::thread([signals] {
    for (;;) {
      int again = 0;
      sigwait(&signals, &again);
      if (again != SIGINT) continue;
      const bool done = drained.load();
      const std::string_view msg = done ? "weir serve: SIGINT after the drain; exiting now\n"
                                        : "weir serve: SIGINT during the drain; exiting now\n";
      (void)!::write(STDERR_FILENO, msg.data(), msg.size());
      std::_Exit(done ? 0 : 2);
    }
  }).detach();
  (*server)->StopAccepting();
  if (kafka_server) kafka_server->StopAccepting();
  // The API first: once an answer says the connection closes, /health says
  // "draining" and every request is refused.
  rest.SetDraining();
  (*server)->BeginDrain();
  // Group joins waiting for a rebalance and long-polling fetches are
  // answered (clients retry); Kafka connections take no further request and
  // close once answered.
  if (broker) broker->Stop();
  if (kafka_server) kafka_server->CloseConnectionsWhenAnswered();
  // Flight takes no new call; open DoPut streams get the grace to end (the
  // drain below waits for them that long, the engine open), then are
  // cancelled. A cancelled DoPut waits for its appends, which a failing
  // store answers only at the engine's close below: the wait for the
  // listener's stop comes after that.
  if (flight_server) flight_server->BeginStop(static_cast<int>(std::min(5000.0, o.drain_timeout_s * 500)));
  stopping_step = "draining requests";
  // In-flight appends finish (their acks are released); waits end within a
  // tick (HTTP). A read session whose client stopped reading would hold the
  // drain until the stall timeout: after a grace (5 s, or half the drain
  // timeout if shorter), responses that have not moved for as long are
  // ended (HTTP/2: the stream; HTTP/1.1: the connection).
  auto open = [&] {
    return (*server)->in_flight() + (kafka_server ? kafka_server->metrics().in_flight.load() : 0);
  };
  const TimePoint drain_start = Now();
  const auto drain_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout_s * 1000));
  const auto deadline = drain_start + drain_timeout;
  const Duration grace = std::min<Duration>(std::chrono::seconds(5), drain_timeout / 2);
  TimePoint next_stall_check = drain_start + grace;
  // Requests whose body is still arriving are waited for during the grace
  // only (they are answered 503 server_draining once whole): an upload that
  // stalled does not hold the drain. receiving() first: a request moving to
  // in_flight() meanwhile is seen by one of them. Flight DoPut calls get the
  // same grace (BeginStop's).
  auto busy = [&] {
    const bool in_grace = Now() < drain_start + grace;
    const bool receiving = (*server)->receiving() > 0 && in_grace;
    const bool putting = flight_server && flight_server->metrics().open_put_calls.load() > 0 && in_grace;
    return receiving || putting || open() > 0;
  };
  while (busy() && Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (Now() >= next_stall_check) {
      (*server)->CloseStalled(grace);
      next_stall_check = Now() + std::min<Duration>(std::chrono::seconds(1), grace);
    }
  }
  // The engine closes while the listeners still run: the WAL's close
  // acknowledges or fails every append still open (a slow store: after its
  // close timeout), and those answers reach their clients before the
  // listeners stop. Then it settles.
  if (open() > 0) Log().warn("weir serve: {} requests still open after the drain; closing the WAL", open());
  stopping_step = "closing the engine (the WAL's last acks, the final settle)";
  (*engine)->Close();
  if (flight_server) {
    stopping_step = "stopping the Arrow Flight listener";
    flight_server->Stop();
  }
  stopping_step = "answering the last requests";
  const auto answered = Now() + std::chrono::seconds(5);
  while (open() > 0 && Now() < answered) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (open() > 0) Log().warn("weir serve: {} requests still open at exit", open());
  // Both let the answers given be written first (bounded).
  stopping_step = "stopping the HTTP listener";
  (*server)->Stop();
  (*engine)->OnSuperseded(nullptr);  // the Kafka listener goes before the engine
  stopping_step = "stopping the Kafka listener";
  if (kafka_server) kafka_server->Stop();
  drained = true;
  stopping_step = "releasing what the server held (destructors, exit)";
  Log().info("weir serve: stopped");
  return 0;
}

}  // namespace weir::server
