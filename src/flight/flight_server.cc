// The only translation unit that includes gRPC (and the generated Flight
// code): keep it that way, for build time.
#include "flight/flight_server.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <latch>
#include <optional>
#include <set>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <nlohmann/json.hpp>

#include "base/base64.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/secret.h"
#include "base/thread.h"
#include "flight.grpc.pb.h"
#include "flight/arrow_ipc.h"
#include "flight/log_rows.h"
#include "log/engine.h"
#include "metastore/metastore.h"
#include "wal/record_batch.h"

namespace weir::flight {

namespace net = boost::asio;
namespace proto = arrow::flight::protocol;
using json = nlohmann::json;

namespace {

grpc::StatusCode GrpcCode(Code c) {
  switch (c) {
    case Code::kOk: return grpc::StatusCode::OK;
    case Code::kInvalidArgument:
    case Code::kCorruption: return grpc::StatusCode::INVALID_ARGUMENT;
    case Code::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case Code::kAlreadyExists: return grpc::StatusCode::ALREADY_EXISTS;
    case Code::kPreconditionFailed: return grpc::StatusCode::FAILED_PRECONDITION;
    case Code::kOutOfRange: return grpc::StatusCode::OUT_OF_RANGE;
    case Code::kResourceExhausted:
    case Code::kQuotaExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case Code::kTimeout: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case Code::kUnavailable:
    case Code::kFenced:
    case Code::kIOError:
    // The engine's kCancelled is the server stopping (the WAL writer closed):
    // retry elsewhere. A client's own cancel is answered CANCELLED directly.
    case Code::kCancelled: return grpc::StatusCode::UNAVAILABLE;
    case Code::kNotSupported: return grpc::StatusCode::UNIMPLEMENTED;
    case Code::kInternal: return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::INTERNAL;
}

grpc::Status ToGrpc(const Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(GrpcCode(st.code()), st.message());
}

// What a DoPut writes to (its first message's descriptor).
struct Target {
  std::string basin;
  std::string table;
  std::optional<uint32_t> bucket;  // Append; none: AppendTable (the node routes)
  std::optional<uint64_t> writer_id;
  int16_t writer_epoch = 0;
};

// JSON a client sends in a ticket, a descriptor's command, a batch's
// app_metadata, ListFlights criteria or an action body: a few hundred bytes.
// A larger text is refused before it is parsed (a parsed tree costs up to
// about 80 times its text, and a gRPC message may carry 16 MiB); nesting
// deeper than kMaxClientJsonDepth is refused as it is parsed, its values
// dropped (dumps and copies recurse). A text
// that is not JSON parses to a discarded value, which no caller takes.
constexpr size_t kMaxClientJsonBytes = 64 << 10;
constexpr int kMaxClientJsonDepth = 64;
// A request that a call keeps while it is open (a DoGet's ticket) is at most
// this much larger than kMaxClientJsonBytes: room for its other fields, not
// for fields weir does not know (Arrow's clients send none).
constexpr size_t kMaxRequestSlackBytes = 1 << 10;
Result<json> ParseClientJson(std::string_view text, std::string_view what) {
  if (text.size() > kMaxClientJsonBytes) {
    return InvalidArgument("{}: at most {} bytes of JSON, got {}", what, kMaxClientJsonBytes, text.size());
  }
  bool too_deep = false;
  json j = json::parse(
      text,
      [&](int depth, json::parse_event_t event, json&) {
        if (depth >= kMaxClientJsonDepth &&
            (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start)) {
          too_deep = true;
        }
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep) return InvalidArgument("{}: JSON nested more than {} deep", what, kMaxClientJsonDepth);
  return j;
}

Result<uint64_t> JsonUint(const json& v, const std::string& name, uint64_t max) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    return InvalidArgument("descriptor: {} must be a non-negative integer", name);
  }
  const uint64_t n = v.get<uint64_t>();
  if (n > max) return InvalidArgument("descriptor: {} must be at most {}", name, max);
  return n;
}

// CMD: {"append": {...}} or {"append_table": {...}} (docs/flight.md);
// PATH: [table] or [basin, table], an AppendTable.
Result<Target> ParseDescriptor(const proto::FlightDescriptor& d, const std::string& default_basin) {
  Target t;
  t.basin = default_basin;
  if (d.type() == proto::FlightDescriptor::PATH) {
    if (d.path_size() == 1) {
      t.table = d.path(0);
    } else if (d.path_size() == 2) {
      t.basin = d.path(0);
      t.table = d.path(1);
    } else {
      return InvalidArgument("descriptor: a path is [table] or [basin, table], not {} elements", d.path_size());
    }
    if (t.table.empty()) return InvalidArgument("descriptor: the table name is empty");
    return t;
  }
  if (d.type() != proto::FlightDescriptor::CMD) return InvalidArgument("descriptor: the type must be PATH or CMD");
  WEIR_ASSIGN_OR_RETURN(json cmd, ParseClientJson(d.cmd(), "descriptor"));
  if (!cmd.is_object() || cmd.size() != 1) {
    return InvalidArgument(
        "descriptor: the command is a JSON object with one key: append, append_table, put or put_table");
  }
  const std::string kind = cmd.begin().key();
  const json& args = cmd.begin().value();
  if (kind == "put" || kind == "put_table") {
    return NotSupported("descriptor: {}: primary-key tables are not built yet; log tables take append and "
                        "append_table", kind);
  }
  if (kind != "append" && kind != "append_table") {
    return InvalidArgument("descriptor: unknown command '{}' (append, append_table, put, put_table)", kind);
  }
  if (!args.is_object()) return InvalidArgument("descriptor: {} takes an object", kind);
  for (const auto& [key, value] : args.items()) {
    if (key == "basin" || key == "table") {
      if (!value.is_string()) return InvalidArgument("descriptor: {} must be a string", key);
      (key == "basin" ? t.basin : t.table) = value.get<std::string>();
    } else if (key == "schema_id") {
      // Log tables have one schema so far: version 1.
      WEIR_ASSIGN_OR_RETURN(uint64_t id, JsonUint(value, key, UINT32_MAX));
      if (id != 1) return InvalidArgument("descriptor: schema_id {}: a log table has schema 1 only", id);
    } else if (kind == "append" && key == "bucket") {
      WEIR_ASSIGN_OR_RETURN(uint64_t b, JsonUint(value, key, metastore::kMaxTableBuckets - 1));
      t.bucket = static_cast<uint32_t>(b);
    } else if (kind == "append" && key == "writer_id") {
      WEIR_ASSIGN_OR_RETURN(uint64_t w, JsonUint(value, key, INT64_MAX));
      t.writer_id = w;
    } else if (kind == "append" && key == "writer_epoch") {
      WEIR_ASSIGN_OR_RETURN(uint64_t e, JsonUint(value, key, INT16_MAX));
      t.writer_epoch = static_cast<int16_t>(e);
    } else {
      return InvalidArgument("descriptor: {} takes no '{}'", kind, key);
    }
  }
  if (t.table.empty()) return InvalidArgument("descriptor: {} needs a table", kind);
  if (kind == "append" && !t.bucket) return InvalidArgument("descriptor: append needs a bucket");
  return t;
}

// A DoGet ticket (GetFlightInfo makes them): {"basin"?, "table", "bucket",
// "from"?, "until"?, "follow"?, "stream_id"?}: the bucket's records from
// offset `from` (default 0; below the first held, from that) up to `until`
// (exclusive; default the tail when the call starts), or, with "follow":
// true, on past the tail as records are acknowledged, until the client
// cancels. With "stream_id" (GetFlightInfo's tickets carry it), only that
// incarnation of the bucket's stream: not one made again under its name.
struct ReadTicket {
  std::string basin;
  std::string table;
  uint32_t bucket = 0;
  uint64_t from = 0;
  std::optional<uint64_t> until;
  bool follow = false;
  std::optional<uint64_t> stream_id;
};

Result<ReadTicket> ParseTicket(const std::string& bytes, const std::string& default_basin) {
  WEIR_ASSIGN_OR_RETURN(json t, ParseClientJson(bytes, "ticket"));
  if (!t.is_object()) return InvalidArgument("ticket: a JSON object with table and bucket");
  ReadTicket out;
  out.basin = default_basin;
  bool has_bucket = false;
  for (const auto& [key, value] : t.items()) {
    if (key == "basin" || key == "table") {
      if (!value.is_string()) return InvalidArgument("ticket: {} must be a string", key);
      (key == "basin" ? out.basin : out.table) = value.get<std::string>();
    } else if (key == "bucket") {
      WEIR_ASSIGN_OR_RETURN(uint64_t b, JsonUint(value, "ticket bucket", metastore::kMaxTableBuckets - 1));
      out.bucket = static_cast<uint32_t>(b);
      has_bucket = true;
    } else if (key == "follow") {
      if (!value.is_boolean()) return InvalidArgument("ticket: follow must be true or false");
      out.follow = value.get<bool>();
    } else if (key == "stream_id") {
      WEIR_ASSIGN_OR_RETURN(uint64_t id, JsonUint(value, "ticket stream_id", INT64_MAX));
      out.stream_id = id;
    } else if (key == "from" || key == "until") {
      WEIR_ASSIGN_OR_RETURN(uint64_t o, JsonUint(value, "ticket " + key, INT64_MAX));
      if (key == "from") {
        out.from = o;
      } else {
        out.until = o;
      }
    } else {
      return InvalidArgument("ticket: unknown key '{}'", key);
    }
  }
  if (out.table.empty() || !has_bucket) return InvalidArgument("ticket: needs a table and a bucket");
  if (out.follow && out.until) return InvalidArgument("ticket: a ticket that follows the tail takes no until");
  return out;
}

// Names each of a pool's `n` threads (top, perf and gdb tell them apart):
// each naming job waits for the others, so each runs on a thread of its own.
void NameThreads(net::thread_pool& pool, size_t n, const char* name) {
  auto all = std::make_shared<std::latch>(static_cast<std::ptrdiff_t>(n));
  for (size_t i = 0; i < n; ++i) {
    net::post(pool, [all, name] {
      SetThreadName(name);
      all->arrive_and_wait();
    });
  }
}

// Runs `fn` on `pool`. Jobs turn their own failures into statuses; this only
// keeps an escaped exception (an allocation failure) from ending the process.
void Post(net::thread_pool& pool, std::function<void()> fn) {
  net::post(pool, [fn = std::move(fn)] {
    try {
      fn();
    } catch (const std::exception& e) {
      Log().error("flight: a job failed: {}", e.what());
    }
  });
}

class GetCall;
// What a DoGet call shares with its tail watch's callback (which may run
// after the call is gone), OnCancel and the listener's Stop. `mu` guards it;
// exactly one of them ends a wait (`waiting` goes false once).
struct Follow {
  std::mutex mu;
  GetCall* call = nullptr;  // cleared in OnDone
  uint64_t generation = 0;  // the current watch's
  uint64_t watch_id = 0;
  bool fired = false;       // the current watch fired
  bool waiting = false;     // no step runs: the call waits for the watch
  std::optional<grpc::Status> end;  // cancelled, or the listener stopping
};


constexpr const char* kAllocateWriter = "allocate-writer";
// A ListFlights answer holds at most this many endpoints (buckets) in all.
constexpr size_t kMaxListedEndpoints = 100000;
constexpr const char* kCreateTable = "create-table";
constexpr const char* kDeleteTable = "delete-table";

}  // namespace

// FlightServer's state and gRPC service, owned by it. gRPC's threads call
// the service methods; `workers`, `readers` and `actors` run their jobs;
// `stopper` runs BeginStop's shutdown. followers (under followers_mu) lets
// Stop end DoGet calls that follow the tail.
struct FlightServer::Impl final : public proto::FlightService::CallbackService {
  Impl(const FlightOptions& o, log::Engine* e)
      : options(o), engine(e), workers(std::max<size_t>(o.workers, 1)), readers(kReaders), actors(kActors) {
    NameThreads(workers, std::max<size_t>(o.workers, 1), "weir-flight-put");
    NameThreads(readers, kReaders, "weir-flight-get");
    NameThreads(actors, kActors, "weir-flight-act");
  }
  static constexpr size_t kReaders = 2;
  static constexpr size_t kActors = 2;

  grpc::ServerBidiReactor<proto::FlightData, proto::PutResult>* DoPut(grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<proto::FlightData>* DoGet(grpc::CallbackServerContext* ctx,
                                                     const proto::Ticket* ticket) override;
  grpc::ServerUnaryReactor* GetSchema(grpc::CallbackServerContext* ctx, const proto::FlightDescriptor* d,
                                      proto::SchemaResult* out) override;
  grpc::ServerUnaryReactor* GetFlightInfo(grpc::CallbackServerContext* ctx, const proto::FlightDescriptor* d,
                                          proto::FlightInfo* out) override;
  grpc::ServerUnaryReactor* PollFlightInfo(grpc::CallbackServerContext* ctx, const proto::FlightDescriptor* d,
                                           proto::PollInfo* out) override;
  grpc::ServerBidiReactor<proto::HandshakeRequest, proto::HandshakeResponse>* Handshake(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<proto::FlightInfo>* ListFlights(grpc::CallbackServerContext* ctx,
                                                           const proto::Criteria* criteria) override;
  // A table's FlightInfo: an endpoint per bucket (or the target's bucket).
  grpc::Status FillFlightInfo(const Target& t, const metastore::TableInfo& table, const proto::FlightDescriptor& d,
                              proto::FlightInfo* out);
  // ListFlights' answers, on a worker.
  grpc::Status ListTableInfos(const std::string& expression, std::vector<proto::FlightInfo>* out);
  // The table a descriptor names, checked to be a log table (and its bucket
  // to exist). A metastore read: call it on a worker.
  Result<metastore::TableInfo> LogTable(const Target& t);
  // A unary call about the table a descriptor names: authorized here, then
  // answered on a reader thread by `answer` once the descriptor and the
  // table check out (a throw answers INTERNAL).
  using TableAnswer = std::function<grpc::Status(const Target&, const metastore::TableInfo&)>;
  grpc::ServerUnaryReactor* OnTable(grpc::CallbackServerContext* ctx, const proto::FlightDescriptor* d,
                                    TableAnswer answer);
  // DoAction's work, on a worker: the Result body.
  Result<json> RunAction(const proto::Action& action);
  grpc::ServerWriteReactor<proto::Result>* DoAction(grpc::CallbackServerContext* ctx,
                                                    const proto::Action* action) override;
  grpc::ServerWriteReactor<proto::ActionType>* ListActions(grpc::CallbackServerContext* ctx,
                                                           const proto::Empty* empty) override;

  // The call's authorization header's credentials for `scheme`, if any.
  static std::optional<std::string_view> Credentials(grpc::CallbackServerContext* ctx, std::string_view scheme) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (it == md.end()) return std::nullopt;
    return AuthCredentials(std::string_view(it->second.data(), it->second.size()), scheme);
  }
  grpc::Status Authorize(grpc::CallbackServerContext* ctx) const {
    if (options.auth_token.empty()) return grpc::Status::OK;
    if (auto bearer = Credentials(ctx, "bearer"); bearer && ConstantTimeEqual(*bearer, options.auth_token)) {
      return grpc::Status::OK;
    }
    // Arrow's legacy auth handlers (C++, Python, Java) send the token their
    // Handshake got back as this binary header.
    const auto& md = ctx->client_metadata();
    if (auto it = md.find("auth-token-bin");
        it != md.end() && ConstantTimeEqual(std::string_view(it->second.data(), it->second.size()), options.auth_token)) {
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "a bearer token is needed (authorization: Bearer <token>)");
  }
  // Whether the call's authorization header is Basic credentials whose
  // password is the token (the user name is not checked): Handshake's.
  bool BasicMatches(grpc::CallbackServerContext* ctx) const {
    auto basic = Credentials(ctx, "basic");
    if (!basic) return false;
    auto plain = Base64Decode(*basic);
    if (!plain.ok()) return false;
    const size_t colon = plain->find(':');
    return colon != std::string::npos &&
           ConstantTimeEqual(std::string_view(*plain).substr(colon + 1), options.auth_token);
  }

  FlightOptions options;
  log::Engine* engine;
  FlightMetrics metrics;
  std::atomic<uint64_t> round_robin{0};  // AppendTable's bucket for keyless rows, batch by batch
  // DoPut's messages (decoding, the table lookup of a call's first message,
  // appends) on `workers`; reads and schemas on `readers`; actions (metastore
  // writes that may take long: a table of many buckets) on `actors`. A batch
  // waiting for room in the WAL pool holds neither (WhenAdmissible looks
  // again from a timer on `workers`), except one whose parts could never fit
  // the pool at once: each waits for its own room on its worker.
  net::thread_pool workers;
  net::thread_pool readers;
  net::thread_pool actors;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::once_flag stop_begun, stopped;
  std::thread stopper;  // runs gRPC's Shutdown (BeginStop); joined by Stop

  // DoGet calls that follow the tail: Stop ends them, as they would not
  // end by themselves.
  void AddFollower(std::shared_ptr<Follow> f);
  void RemoveFollower(const std::shared_ptr<Follow>& f);
  std::mutex followers_mu;
  std::set<std::shared_ptr<Follow>> followers;
  bool stopping = false;  // under followers_mu
};

namespace {

grpc::Status TooManyInfoCalls(size_t max) {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      fmt::format("more than {} calls of GetFlightInfo, GetSchema, PollFlightInfo, ListFlights, "
                                  "ListActions and DoAction are open",
                                  max));
}

// A place among `max` calls counted by `open` (an authorized info call's
// among FlightOptions::max_info_calls, or a Handshake's), held by the call's
// reactor until gRPC is done with it (the reactor is deleted). Made on the
// gRPC thread that starts the call; released on the one that runs OnDone.
class CallPlace {
 public:
  CallPlace(std::atomic<uint64_t>& open, std::atomic<uint64_t>& refused, size_t max)
      : open_(open), over_(open.fetch_add(1) >= max) {
    if (over_) refused++;
  }
  ~CallPlace() { open_--; }
  CallPlace(const CallPlace&) = delete;
  CallPlace& operator=(const CallPlace&) = delete;
  bool over() const { return over_; }

 private:
  std::atomic<uint64_t>& open_;
  const bool over_;
};

// A unary call's reactor (GetFlightInfo, GetSchema, PollFlightInfo), with
// its place once authorized. Created on a gRPC thread, finished on a
// reader's; deletes itself in OnDone (a gRPC thread).
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  void OnDone() override { delete this; }
  std::optional<CallPlace> place;
};

// Answers a server-streaming call with a few messages (or none) and a
// status, with its place once authorized. Send is called once (from any
// thread); writes then follow one another on gRPC's threads. Deletes itself
// in OnDone.
template <typename T>
class Replies final : public grpc::ServerWriteReactor<T> {
 public:
  std::optional<CallPlace> place;
  void Send(std::vector<T> msgs, grpc::Status st) {
    {
      std::lock_guard lk(mu_);
      msgs_ = std::move(msgs);
      status_ = std::move(st);
      if (!status_.ok()) msgs_.clear();
    }
    Next();
  }
  void Send(grpc::Status st) { Send({}, std::move(st)); }
  void OnWriteDone(bool ok) override {
    if (!ok) return this->Finish(grpc::Status::CANCELLED);
    Next();
  }
  void OnDone() override {
    { std::lock_guard lk(mu_); }  // (for ThreadSanitizer, as PutCall's)
    delete this;
  }

 private:
  void Next() {
    T* msg = nullptr;
    grpc::Status st;
    {
      // Writes follow one another, so only the hand-over from Send's
      // thread needs the lock.
      std::lock_guard lk(mu_);
      if (next_ < msgs_.size()) {
        msg = &msgs_[next_++];
      } else {
        st = status_;
      }
    }
    if (msg != nullptr) return this->StartWrite(msg);
    this->Finish(st);
  }
  std::mutex mu_;
  std::vector<T> msgs_;
  size_t next_ = 0;
  grpc::Status status_;
};

// A Replies for a call; if the caller is not authorized, or max_info_calls
// are open, it already answers with that (UNAUTHENTICATED,
// RESOURCE_EXHAUSTED) and *refused is set.
template <typename T>
Replies<T>* NewReplies(FlightServer::Impl& impl, grpc::CallbackServerContext* ctx, bool* refused) {
  auto* r = new Replies<T>();
  grpc::Status st = impl.Authorize(ctx);
  if (st.ok() && r->place.emplace(impl.metrics.open_info_calls, impl.metrics.info_calls_refused,
                                  impl.options.max_info_calls).over()) {
    st = TooManyInfoCalls(impl.options.max_info_calls);
  }
  *refused = !st.ok();
  if (*refused) r->Send(std::move(st));
  return r;
}

// One DoPut: reads FlightData messages one at a time (a worker decodes each
// and hands it to the engine before the next read, so a call's batches are
// appended in order and hold at most one message undecoded), and writes a
// PutResult per batch in order as each becomes durable. A refused message or
// a failed append answers in its turn: every batch before it gets its
// PutResult, then the call ends with its status; nothing is read or appended
// once a refusal is known (batches handed over before then still complete).
// gRPC's threads and the workers call it; `mu_` guards its state. It deletes
// itself in OnDone, which comes only after Finish, which waits until no
// message is being handled and every append has called back.
class PutCall final : public grpc::ServerBidiReactor<proto::FlightData, proto::PutResult> {
 public:
  PutCall(FlightServer::Impl* impl, grpc::CallbackServerContext* ctx) : impl_(impl) {
    impl_->metrics.put_calls++;
    const bool over = impl_->metrics.open_put_calls.fetch_add(1) >= impl_->options.max_put_calls;
    std::optional<grpc::Status> refused;
    if (grpc::Status auth = impl_->Authorize(ctx); !auth.ok()) {
      refused = auth;
    } else if (over) {
      impl_->metrics.put_calls_refused++;
      refused = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             fmt::format("more than {} DoPut calls are open", impl_->options.max_put_calls));
    }
    std::unique_lock lk(mu_);
    if (refused) {
      failure_ = *refused;
      Progress(lk);
      return;
    }
    reading_ = true;
    lk.unlock();
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    std::unique_lock lk(mu_);
    reading_ = false;
    if (ok && !finished_ && !cancelled_ && Stopping()) {
      // After a refusal: the message is dropped unseen, the next one read (Continue says why).
      in_.Clear();
      return ReadNext(lk);
    }
    if (!ok || finished_ || Stopping()) {
      eof_ = eof_ || !ok;
      Progress(lk);
      return;
    }
    handling_ = true;
    lk.unlock();
    auto msg = std::make_shared<proto::FlightData>(std::move(in_));
    in_.Clear();
    Post(impl_->workers, [this, msg] { Handle(*msg); });
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock lk(mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;  // the client is gone: nothing more can be written
    Progress(lk);
  }

  void OnCancel() override {
    std::unique_lock lk(mu_);
    cancelled_ = true;
    Progress(lk);
  }

  void OnDone() override {
    // gRPC orders OnDone after every reaction, but ThreadSanitizer cannot
    // see its ordering: the lock shows it that all writes to the call came
    // first.
    { std::lock_guard lk(mu_); }
    impl_->metrics.open_put_calls--;
    delete this;
  }

 private:
  // A batch's part for one bucket: the bucket and its RecordBatch v2.
  using Part = std::pair<uint32_t, std::string>;
  // A bucket's part of a durable batch (its PutResult's offsets).
  struct BucketResult {
    uint32_t bucket = 0;
    int64_t first = 0, last = 0;  // inclusive
    bool duplicated = false;
  };
  // A PutResult waiting for its appends (one per bucket the batch went to),
  // or a refusal waiting for its turn.
  struct Slot {
    size_t waiting = 0;
    grpc::Status error;
    std::vector<BucketResult> buckets;  // as the parts became durable; none for a batch of no rows
    size_t rows = 0, body_bytes = 0;  // counted in the metrics once it is durable
  };
  // At most this many batches wait for their PutResults to be written (not
  // yet durable, or durable while the client does not read its results):
  // the next message is refused, and their memory stays bounded.
  static constexpr size_t kMaxUnansweredBatches = 65536;

  // A slot's PutResult app_metadata.
  std::string ResultJson(const Slot& s) const {
    if (target_->bucket) {
      if (s.buckets.empty()) return json{{"first_offset", nullptr}, {"last_offset", nullptr}, {"duplicated", false}}.dump();
      const BucketResult& r = s.buckets.front();
      return json{{"first_offset", r.first}, {"last_offset", r.last}, {"duplicated", r.duplicated}}.dump();
    }
    json buckets = json::array();
    for (const BucketResult& r : s.buckets) {
      buckets.push_back(
          json{{"bucket", r.bucket}, {"first_offset", r.first}, {"last_offset", r.last}, {"duplicated", r.duplicated}});
    }
    return json{{"buckets", std::move(buckets)}}.dump();
  }

  // Whether nothing more is to be read or appended. Under mu_.
  bool Stopping() const { return failure_.has_value() || refused_ || cancelled_; }

  // On a worker: one message. A record batch is handed to the engine once
  // the WAL pool has room for it; until then (WhenAdmissible, looking again
  // from a timer on the worker pool) no worker waits and the call reads
  // nothing more.
  void Handle(const proto::FlightData& msg) {
    {
      std::unique_lock lk(mu_);
      if (Stopping()) {
        lk.unlock();
        return Continue(Status::Ok());  // the message is dropped unseen
      }
      if (const size_t unanswered = slots_.size(); unanswered >= kMaxUnansweredBatches) {
        lk.unlock();
        return Continue(ResourceExhausted(
            "{} batches are not answered yet (not yet durable, or their PutResults not read): a client must read "
            "its PutResults while it writes",
            unanswered));
      }
    }
    Status st;
    try {
      std::optional<std::vector<Part>> parts;
      st = Process(msg, &parts);
      if (st.ok() && parts) {
        if (parts->empty()) {
          st = Append({}, nullptr);  // no rows: answered in order, with no offsets
        } else if (!AppendWhenAdmissible(std::move(*parts), &st)) {
          return;  // Continue runs once it is appended
        }
      }
    } catch (const std::bad_alloc&) {
      st = ResourceExhausted("out of memory decoding the batch");
    } catch (const std::exception& e) {
      st = Internal("handling the message: {}", e.what());
    }
    Continue(st);
  }

  // The end of a message's handling: its refusal queued in its turn, then
  // the next read (or the end of the call).
  void Continue(const Status& st) {
    std::unique_lock lk(mu_);
    handling_ = false;
    if (!st.ok()) {
      // In its turn: the batches before it still get their answers.
      impl_->metrics.errors++;
      refused_ = true;
      Slot s;
      s.error = ToGrpc(st.WithContext(fmt::format("message {}", messages_)));
      slots_.push_back(std::move(s));
    }
    ++messages_;
    // After a refusal the call still reads, dropping each message unseen
    // (OnReadDone), until the client is done: one whose results wait unread
    // behind a write it does not take (it reads them when it closes, as
    // Arrow's clients do) must not block on its own writes, or it never
    // gets to read the refusal.
    if (cancelled_ || finished_) {
      Progress(lk);
      return;
    }
    ReadNext(lk);
  }

  // Starts the next read. Until StartRead has returned, the call must not
  // finish (a cancel or a failed append meanwhile would let OnDone free it
  // under StartRead). Called with `mu_` held; releases it for StartRead.
  void ReadNext(std::unique_lock<std::mutex>& lk) {
    reading_ = true;
    ++starting_reads_;
    lk.unlock();
    StartRead(&in_);
    lk.lock();
    --starting_reads_;
    Progress(lk);
  }

  // Appends the parts now if the WAL pool has room for all of them (true),
  // or once it has (false: a worker appends them then and calls Continue).
  // A wait that runs past the admission timeout ends the call
  // RESOURCE_EXHAUSTED with nothing of the batch appended; a call ending
  // meanwhile drops them.
  bool AppendWhenAdmissible(std::vector<Part> parts, Status* st) {
    size_t bytes = 0;
    for (const auto& p : parts) bytes += p.second.size();
    log::Engine* engine = impl_->engine;
    // Parts that could never hold room together would each wait for its
    // own, and one could be refused after others were written.
    if (parts.size() > 1 && !engine->FitsPoolAtOnce(bytes, parts.size())) {
      *st = InvalidArgument("the batch's {} bucket parts take {} bytes, more than the WAL pool holds at once "
                            "(--pool-budget-mib): send smaller batches",
                            parts.size(), bytes);
      return true;
    }
    if (auto ticket = engine->TryAdmission(bytes, parts.size())) {
      *st = Append(std::move(parts), ticket);
      return true;
    }
    // No room now. A writer's retry of a batch its bucket's window holds
    // needs none: answered now, or once its original is durable (as Kafka's
    // and REST's retries are), not after a wait that may end RESOURCE_EXHAUSTED.
    if (target_->writer_id && parts.size() == 1) {
      // (A table changed meanwhile ends the call, as Append would.)
      if (Status followed = FollowTable(); !followed.ok()) {
        *st = followed;
        return true;
      }
      if (AnswerRetried(parts.front())) {
        *st = Status::Ok();
        return true;
      }
    }
    using Wait = log::Engine::AdmissionWait;
    // The parts, encoded, until they are appended: outside the pool's budget
    // (up to max_batch_bytes per bucket; FlightOptions::max_put_calls).
    auto held = std::make_shared<std::vector<Part>>(std::move(parts));
    // The wait ends once: by `ready`, or by a look that threw before it (the
    // call cannot finish while it waits: `handling_`).
    auto ended = std::make_shared<std::atomic<bool>>(false);
    FlightServer::Impl* impl = impl_;
    engine->WhenAdmissible(
        bytes, held->size(), Now() + engine->admission_timeout(),
        [this, impl, ended](Duration delay, std::function<void()> fn) {
          auto timer = std::make_shared<net::steady_timer>(impl->workers, delay);
          timer->async_wait([this, ended, timer, fn = std::move(fn)](const boost::system::error_code&) {
            try {
              fn();
            } catch (const std::exception& e) {
              // A look that throws schedules no other: unless it got as far
              // as `ready`, the call would wait for ever, and Stop with it.
              if (!ended->exchange(true)) {
                Continue(dynamic_cast<const std::bad_alloc*>(&e) != nullptr
                             ? ResourceExhausted("out of memory waiting for room in the WAL pool")
                             : Internal("waiting for room in the WAL pool: {}", e.what()));
              }
              Log().error("flight: an admission look failed: {}", e.what());
            }
          });
        },
        [this] {
          std::lock_guard lk(mu_);
          return Stopping();
        },
        [this, held, bytes, ended](Wait how, std::shared_ptr<log::AdmissionTicket> ticket) {
          ended->store(true);  // (a look's throw from here on is not the wait's to end)
          auto append = [this, held, bytes, how, ticket = std::move(ticket)]() mutable {
            Status appended;
            try {
              if (how == Wait::kExpired) {
                // One last look: all the parts or none (parts admitted one
                // by one could leave the batch half written).
                ticket = impl_->engine->TryAdmission(bytes, held->size());
                if (!ticket) {
                  appended = ResourceExhausted("no room in the WAL pool for the batch within the admission timeout");
                }
              }
              if (how != Wait::kAbandoned && appended.ok()) appended = Append(std::move(*held), ticket);
            } catch (const std::exception& e) {
              appended = Internal("appending: {}", e.what());
            }
            Continue(appended);
          };
          try {
            Post(impl_->workers, std::move(append));
          } catch (const std::exception&) {
            // (Posting allocates.) The call must still go on, or it never ends.
            Continue(ResourceExhausted("out of memory queueing the batch"));
          }
        });
    return false;
  }

  // Whether the engine took `part` as a retry its bucket's window holds (its
  // slot is then answered by Appended, in its turn). On the worker handling
  // the message, after FollowTable.
  bool AnswerRetried(Part& part) {
    const uint32_t b = part.first;
    const std::string stream = metastore::BucketStreamName(target_->table, b);
    size_t index;
    log::AppendCallback done;
    {
      std::unique_lock lk(mu_);
      if (Stopping()) return false;  // admission drops it
      index = base_ + slots_.size();
      done = [this, index, b](log::AppendOutcome o) { Appended(index, b, o); };
      Slot s;
      s.waiting = 1;
      s.rows = decoded_rows_;
      s.body_bytes = decoded_body_bytes_;
      slots_.push_back(std::move(s));
    }
    // Not taken (not a retry the window holds, or a throw before the engine
    // took `done`): the slot goes, and the batch goes through admission. The
    // call cannot finish meanwhile: a message is being handled.
    bool taken = false;
    try {
      taken = impl_->engine->AnswerRetriedBatch(target_->basin, stream, part.second, done);
    } catch (...) {
      std::unique_lock lk(mu_);
      slots_.pop_back();
      throw;
    }
    if (!taken) {
      std::unique_lock lk(mu_);
      slots_.pop_back();
    }
    return taken;
  }

  // If a table changed since the call looked: its buckets may have grown
  // (routing follows them, as a Kafka producer's metadata refresh would), or
  // the table may be gone or made again under its name (NotFound: its
  // batches must not go to another table). On the worker handling the
  // call's message.
  Status FollowTable() {
    const uint64_t v = impl_->engine->TablesVersion();
    if (v == tables_version_) return Status::Ok();
    tables_version_ = v;
    WEIR_ASSIGN_OR_RETURN(auto table, impl_->LogTable(*target_));
    if (table.id != table_id_) {
      return NotFound("table {}/{} was deleted and made again since the call began", target_->basin, target_->table);
    }
    buckets_ = table.bucket_count;
    return Status::Ok();
  }

  // Decodes a message; a record batch's parts (one per bucket; none for no
  // rows) go to *parts for appending.
  Status Process(const proto::FlightData& msg, std::optional<std::vector<Part>>* parts) {
    if (!target_) {
      if (!msg.has_flight_descriptor()) return InvalidArgument("the first message of a DoPut carries its descriptor");
      WEIR_ASSIGN_OR_RETURN(auto t, ParseDescriptor(msg.flight_descriptor(), impl_->options.default_basin));
      tables_version_ = impl_->engine->TablesVersion();  // before the look: a change after it is seen
      WEIR_ASSIGN_OR_RETURN(auto table, impl_->LogTable(t));
      if (t.writer_id) {
        // One never allocated could later be a Kafka producer's id.
        WEIR_ASSIGN_OR_RETURN(const bool allocated, impl_->engine->ProducerIdAllocated(*t.writer_id));
        if (!allocated) {
          return InvalidArgument("descriptor: writer_id {} was never allocated: the allocate-writer action gives one",
                                 *t.writer_id);
        }
      }
      buckets_ = table.bucket_count;
      table_id_ = table.id;
      target_ = std::move(t);
    } else {
      WEIR_RETURN_IF_ERROR(FollowTable());
    }
    if (msg.data_header().empty()) return Status::Ok();  // app_metadata alone: nothing to write
    WEIR_ASSIGN_OR_RETURN(auto m, ParseMessage(msg.data_header()));
    if (m.kind == MessageKind::kSchema) {
      if (schema_) return InvalidArgument("a DoPut sends its schema once, first");
      WEIR_ASSIGN_OR_RETURN(columns_, CheckLogSchema(*m.schema));
      schema_ = std::move(m.schema);
      return Status::Ok();
    }
    if (!schema_) return InvalidArgument("a record batch came before the schema");
    if (static_cast<uint64_t>(m.body_length) > msg.data_body().size()) {
      return InvalidArgument("the message names a {}-byte body; {} bytes came", m.body_length, msg.data_body().size());
    }
    std::optional<int32_t> sequence;
    if (!msg.app_metadata().empty()) {
      WEIR_ASSIGN_OR_RETURN(json meta, ParseClientJson(msg.app_metadata(), "a batch's app_metadata"));
      if (!meta.is_object()) return InvalidArgument("a batch's app_metadata is a JSON object");
      for (const auto& [key, value] : meta.items()) {
        if (key != "batch_sequence") return InvalidArgument("a batch's app_metadata takes no '{}'", key);
        if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX) {
          return InvalidArgument("batch_sequence must be 0 to {}", INT32_MAX);
        }
        sequence = static_cast<int32_t>(value.get<int64_t>());
      }
    }
    if (target_->writer_id && !sequence) return InvalidArgument("a writer's batches carry a batch_sequence");
    if (!target_->writer_id && sequence) return InvalidArgument("batch_sequence needs a writer_id in the descriptor");
    std::deque<std::string> storage;
    WEIR_ASSIGN_OR_RETURN(auto cols, ResolveBatch(*schema_, *m.batch, msg.data_body(), &storage));
    // What the batch would take decoded, refused before it is: the bytes a
    // bucket's Kafka batch may hold, and the record count Kafka batches may.
    const size_t limit = impl_->options.max_batch_bytes * (target_->bucket ? 1 : buckets_);
    if (LogRecordsBytes(columns_, cols) > limit) {
      return InvalidArgument("the batch holds more than {} bytes of keys, values and headers; a bucket takes at most "
                             "{} bytes a batch: send smaller batches",
                             limit, impl_->options.max_batch_bytes);
    }
    // As the engine bounds a Kafka batch's records and headers together
    // (each header is an entry in memory, whatever its bytes).
    const uint64_t headers = LogRecordsHeaderCount(columns_, cols);
    if (static_cast<uint64_t>(m.batch->length) * wal::kDecodedRecordCost + headers * wal::kRecordHeaderCost >
        wal::kMaxDecodedRecordsOverheadBytes) {
      return InvalidArgument("a batch of {} rows with {} headers: rows take {} and headers {} of at most {} a batch",
                             m.batch->length, headers, wal::kDecodedRecordCost, wal::kRecordHeaderCost,
                             wal::kMaxDecodedRecordsOverheadBytes);
    }
    WEIR_ASSIGN_OR_RETURN(auto records, LogRecords(columns_, cols, WallMillis()));
    decoded_rows_ = records.size();
    decoded_body_bytes_ = msg.data_body().size();
    if (records.empty()) {
      parts->emplace();
      return Status::Ok();
    }
    // One RecordBatch per bucket: Append's bucket, or AppendTable's routing.
    std::map<uint32_t, std::vector<wal::RecordView>> by_bucket;
    if (target_->bucket) {
      by_bucket[*target_->bucket] = std::move(records);
    } else {
      const auto rr = static_cast<uint32_t>(impl_->round_robin.fetch_add(1) % buckets_);
      for (auto& r : records) {
        const uint32_t b = r.key ? KafkaPartitionOf(*r.key, buckets_) : rr;
        by_bucket[b].push_back(std::move(r));
      }
    }
    std::vector<Part> batches;
    for (auto& [bucket, rows] : by_bucket) {
      wal::EncodeOptions eo;
      if (target_->writer_id) {
        eo.producer_id = static_cast<int64_t>(*target_->writer_id);
        eo.producer_epoch = target_->writer_epoch;
        eo.base_sequence = *sequence;
      }
      std::string batch;
      WEIR_RETURN_IF_ERROR(wal::EncodeRecordBatch(rows, eo, &batch));
      // Every part is checked before any is appended: a refused part
      // leaves the others unwritten too.
      if (batch.size() > impl_->options.max_batch_bytes) {
        return InvalidArgument("bucket {}'s part of the batch is {} bytes as a Kafka batch; at most {}: send smaller "
                               "batches", bucket, batch.size(), impl_->options.max_batch_bytes);
      }
      batches.emplace_back(bucket, std::move(batch));
    }
    *parts = std::move(batches);
    return Status::Ok();
  }

  // Hands a batch's parts to the engine under one slot, answered once all are
  // durable: from the room `ticket` holds; without one, each takes room now
  // or is refused; with a ticket that holds none (one part that could never
  // fit the pool, or the engine closing), each waits for its own room here,
  // on the worker (AppendWhenAdmissible refuses several parts that never fit together).
  Status Append(std::vector<Part> batches, const std::shared_ptr<log::AdmissionTicket>& ticket) {
    const bool may_wait = ticket && !ticket->has_room();
    // Parts are appended by stream name: a table made again while the batch
    // waited for room is refused now (one made again in the instant between
    // this look and the append is not told apart).
    if (!batches.empty()) WEIR_RETURN_IF_ERROR(FollowTable());
    size_t index;
    {
      std::unique_lock lk(mu_);
      // A failure became known while this batch was decoded: it is not
      // appended (the call ends with that failure).
      if (Stopping()) return Status::Ok();
      index = base_ + slots_.size();
      Slot s;
      s.waiting = batches.size();
      s.rows = decoded_rows_;
      s.body_bytes = decoded_body_bytes_;
      slots_.push_back(std::move(s));
      if (batches.empty()) {
        Progress(lk);
        return Status::Ok();
      }
    }
    for (size_t i = 0; i < batches.size(); ++i) {
      auto& [bucket, batch] = batches[i];
      const uint32_t b = bucket;
      if (i == 0) {
        // A part failed (or the call ended) meanwhile: nothing is sent. Once
        // the first part is handed over (and not refused at once, below) the
        // rest follow, so that the call ending meanwhile does not cut the
        // batch in two (its client, told the call's error, cannot tell which
        // buckets took their part).
        std::unique_lock lk(mu_);
        if (Stopping()) {
          Slot& s = slots_[index - base_];
          s.waiting -= batches.size() - i;
          if (s.error.ok()) {
            s.error = grpc::Status(grpc::StatusCode::ABORTED,
                                   fmt::format("batch {}: not appended: the call is ending", index));
          }
          Progress(lk);
          return Status::Ok();
        }
      }
      try {
        impl_->engine->AppendBatchAsync(
            target_->basin, metastore::BucketStreamName(target_->table, b), std::move(batch),
            [this, index, b](log::AppendOutcome o) { Appended(index, b, o); }, may_wait, ticket);
      } catch (const std::exception& e) {
        // Nothing of this part was handed over: its slot must not wait for it.
        std::unique_lock lk(mu_);
        refused_ = true;
        Slot& s = slots_[index - base_];
        s.waiting -= batches.size() - i;
        if (s.error.ok()) {
          s.error = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 fmt::format("batch {}: bucket {}: {}", index, b, e.what()));
        }
        Progress(lk);
        return Status::Ok();
      }
      if (i == 0 && batches.size() > 1) {
        // The first part refused already (a deleted bucket, the writer's
        // window, admission): nothing of the batch is written, and the rest
        // are not sent either.
        std::unique_lock lk(mu_);
        Slot& s = slots_[index - base_];
        if (!s.error.ok()) {
          s.waiting -= batches.size() - 1;
          Progress(lk);
          return Status::Ok();
        }
      }
    }
    return Status::Ok();
  }

  void Appended(size_t index, uint32_t bucket, const log::AppendOutcome& o) {
    std::unique_lock lk(mu_);
    Slot& s = slots_[index - base_];
    if (!o.status.ok()) {
      impl_->metrics.errors++;
      refused_ = true;  // no further message is read or appended
      if (s.error.ok()) {
        const Status st = o.status.WithContext(fmt::format("batch {}: bucket {}", index, bucket));
        // An older writer epoch is the writer's to fix, not a node to retry.
        s.error = o.producer_fenced ? grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, st.message()) : ToGrpc(st);
      }
    } else {
      if (o.ack.duplicated) impl_->metrics.duplicated_batches++;
      const int64_t first = static_cast<int64_t>(o.ack.start_offset);
      const int64_t last = static_cast<int64_t>(o.ack.end_offset) - 1;
      s.buckets.push_back(BucketResult{bucket, first, last, o.ack.duplicated});
    }
    --s.waiting;
    Progress(lk);
  }

  // Writes the next answered PutResult, or finishes the call once no message
  // is being handled, nothing is being written or appended, and the client
  // is done, gone, or refused (a read still outstanding then completes
  // unseen). Called with `mu_` held; may release it.
  void Progress(std::unique_lock<std::mutex>& lk) {
    if (writing_ || finished_) return;
    while (!slots_.empty() && slots_.front().waiting == 0) {
      Slot s = std::move(slots_.front());
      slots_.pop_front();
      ++base_;
      if (!failure_ && !s.error.ok()) failure_ = s.error;
      if (s.error.ok()) {
        impl_->metrics.batches++;
        impl_->metrics.rows += s.rows;
        impl_->metrics.bytes += s.body_bytes;
      }
      if (failure_ || cancelled_) continue;  // nothing is written after a failure
      out_.set_app_metadata(ResultJson(s));
      writing_ = true;
      lk.unlock();
      StartWrite(&out_);
      return;
    }
    if (handling_ || starting_reads_ > 0 || !slots_.empty()) return;
    if (!failure_ && !cancelled_ && (reading_ || !eof_)) return;
    finished_ = true;
    grpc::Status st = failure_ ? *failure_ : cancelled_ ? grpc::Status::CANCELLED : grpc::Status::OK;
    lk.unlock();
    Finish(st);
  }

  FlightServer::Impl* impl_;
  proto::FlightData in_;  // the read in progress
  proto::PutResult out_;  // the write in progress
  // Set by the first message, then read by the worker handling a message
  // (one at a time) and by append callbacks (after it is set).
  std::optional<Target> target_;
  uint32_t buckets_ = 0;
  uint64_t table_id_ = 0;        // the table the first message found
  uint64_t tables_version_ = 0;  // the engine's TablesVersion when it (or a later message) looked
  std::optional<ArrowSchema> schema_;
  LogColumns columns_;
  // The message being handled: its rows and body, for its slot's metrics.
  size_t decoded_rows_ = 0, decoded_body_bytes_ = 0;

  std::mutex mu_;
  std::deque<Slot> slots_;
  size_t base_ = 0;         // index of slots_.front()
  size_t messages_ = 0;     // messages handled, for error context
  bool reading_ = false;    // a read is outstanding
  // Threads in StartRead (a worker's, and a gRPC thread's whose read after a
  // refusal completed at once): the call may not finish until they are out.
  int starting_reads_ = 0;
  bool handling_ = false;   // a worker has (or is about to have) a message
  bool eof_ = false;        // the client is done sending (or the read failed)
  bool refused_ = false;    // a message or an append was refused: read and append no more
  bool writing_ = false;
  bool cancelled_ = false;  // by the client, or a write failed
  bool finished_ = false;
  std::optional<grpc::Status> failure_;  // the refusal whose turn has come
};

// One DoGet: the schema, then the bucket's records in batches of up to
// 1,000 rows (the engine's read limits), each read on a reader thread and
// written before the next is read. One step runs at a time (a read, or a
// write and its OnWriteDone). A ticket that follows the tail waits, once it
// has read everything, on a tail watch that holds no thread; the call then
// ends only when the client cancels it (or the stream goes, or the listener
// stops: UNAVAILABLE). `follow_` holds what the watch, OnCancel and Stop
// share. It deletes itself in OnDone, after its Finish.
class GetCall final : public grpc::ServerWriteReactor<proto::FlightData> {
 public:
  GetCall(FlightServer::Impl* impl, grpc::CallbackServerContext* ctx, const proto::Ticket& ticket)
      : impl_(impl), follow_(std::make_shared<Follow>()) {
    const bool over = impl_->metrics.open_get_calls.fetch_add(1) >= impl_->options.max_get_calls;
    follow_->call = this;
    if (grpc::Status auth = impl_->Authorize(ctx); !auth.ok()) {
      Finish(auth);
      return;
    }
    if (over) {  // each open call may hold a message (about 1 MiB) the client has not taken
      impl_->metrics.get_calls_refused++;
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          fmt::format("more than {} DoGet calls are open", impl_->options.max_get_calls)));
      return;
    }
    auto t = ParseTicket(ticket.ticket(), impl_->options.default_basin);
    if (!t.ok()) {
      Finish(ToGrpc(t.status()));
      return;
    }
    // gRPC keeps the request until the call ends (a follower's, for ever):
    // other fields must not ride along with a ticket that fits.
    if (const size_t n = ticket.ByteSizeLong(); n > kMaxClientJsonBytes + kMaxRequestSlackBytes) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          fmt::format("ticket: the request is {} bytes; at most {} (its ticket at most {})", n,
                                      kMaxClientJsonBytes + kMaxRequestSlackBytes, kMaxClientJsonBytes)));
      return;
    }
    ticket_ = std::move(*t);
    stream_ = metastore::BucketStreamName(ticket_.table, ticket_.bucket);
    if (ticket_.follow) impl_->AddFollower(follow_);
    PostNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    bool done;
    {
      std::lock_guard lk(mu_);
      done = done_;
    }
    if (done) return Finish(grpc::Status::OK);
    PostNext();
  }
  void OnCancel() override { End(follow_, grpc::Status::CANCELLED, impl_); }
  void OnDone() override {
    { std::lock_guard lk(mu_); }  // (for ThreadSanitizer, as PutCall's)
    {
      std::lock_guard lk(follow_->mu);
      follow_->call = nullptr;
    }
    if (ticket_.follow) impl_->RemoveFollower(follow_);
    impl_->metrics.open_get_calls--;
    delete this;
  }

  // Ends the call with `st`: at once if it waits on its watch, else when
  // its step in progress looks. Any thread; the call may be gone.
  static void End(const std::shared_ptr<Follow>& f, const grpc::Status& st, FlightServer::Impl* impl) {
    std::unique_lock lk(f->mu);
    if (!f->end) f->end = st;
    if (!f->waiting || f->call == nullptr) return;
    f->waiting = false;
    GetCall* call = f->call;
    const uint64_t id = f->watch_id;
    lk.unlock();
    impl->engine->UnwatchTail(call->ticket_.basin, call->stream_, id);
    call->Finish(st);
  }

 private:
  enum class Then { kWrite, kFinish, kWait, kAgain };

  // The next step on a reader thread. The call is this caller's (no step or
  // write runs, no wait is registered): if posting fails (out of memory),
  // it ends here.
  void PostNext() {
    try {
      Post(impl_->readers, [this] { Next(); });
    } catch (const std::exception& e) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, fmt::format("reading: {}", e.what())));
    }
  }

  // On a reader thread: the next message, the end, or a wait.
  void Next() {
    grpc::Status st;
    Then then;
    {
      // One step runs at a time; `mu_` only shows ThreadSanitizer the
      // hand-overs between threads that gRPC orders.
      std::lock_guard lk(mu_);
      try {
        then = Step(&st);
      } catch (const std::exception& e) {
        st = grpc::Status(grpc::StatusCode::INTERNAL, fmt::format("reading: {}", e.what()));
        then = Then::kFinish;
      }
    }
    switch (then) {
      case Then::kWrite: return StartWrite(&out_);
      case Then::kFinish: return Finish(st);
      case Then::kWait: return;  // the watch, End or Stop goes on
      case Then::kAgain: return PostNext();  // the tail moved (or the stream went) since the read
    }
  }

  // Fills out_ with the next message (kWrite), or says how the call ends
  // (kFinish, *st), or registers a tail watch (kWait) or reads again
  // (kAgain). Nothing it calls throws but allocation.
  Then Step(grpc::Status* st) {
    {
      std::lock_guard lk(follow_->mu);
      if (follow_->end) {
        *st = *follow_->end;
        return Then::kFinish;
      }
    }
    out_.Clear();
    if (!sent_schema_) {
      // The table must exist (and be a log table) before anything is sent;
      // the stream is taken now: the call reads that stream (not one made
      // again under its name), up to its tail now unless it follows.
      Target t;
      t.basin = ticket_.basin;
      t.table = ticket_.table;
      t.bucket = ticket_.bucket;
      if (auto table = impl_->LogTable(t); !table.ok()) return Fail(table.status(), st);
      auto summary = impl_->engine->GetStream(ticket_.basin, stream_);
      if (!summary.ok()) return Fail(summary.status(), st);
      if (ticket_.stream_id && *ticket_.stream_id != summary->info.id) {
        return Fail(NotFound("table '{}' was deleted (and made again) since this ticket for its bucket {} was issued",
                             ticket_.table, ticket_.bucket),
                    st);
      }
      stream_id_ = summary->info.id;
      if (!ticket_.until && !ticket_.follow) ticket_.until = summary->tail;
      sent_schema_ = true;
      out_.set_data_header(LogReadSchemaMessage());
      return Then::kWrite;
    }
    if (ticket_.until && ticket_.from >= *ticket_.until) return Then::kFinish;
    auto r = impl_->engine->Read(ticket_.basin, stream_, log::ReadStart{log::ReadStart::kOffset, ticket_.from},
                                 kMaxRows, kMaxBytes, std::nullopt, stream_id_);
    // Past the tail (a ticket's `until` or `from` beyond it): nothing more
    // to read, or, following, nothing yet.
    const bool past = !r.ok() && r.status().code() == Code::kOutOfRange;
    if (!r.ok() && !past) return Fail(r.status(), st);
    std::vector<ReadRow> rows;
    if (!past) {
      for (const auto& rec : r->records) {
        if (ticket_.until && rec.offset >= *ticket_.until) break;
        rows.push_back(ReadRow{rec.offset, &rec.record});
      }
    }
    if (rows.empty()) {
      if (!ticket_.follow) return Then::kFinish;
      // Nothing is left below the tail (trimmed meanwhile): wait from there.
      if (!past && r->tail > ticket_.from) ticket_.from = r->tail;
      return Wait(st);
    }
    ticket_.from = rows.back().offset + 1;
    done_ = ticket_.until && ticket_.from >= *ticket_.until;
    IpcBytes m = LogReadBatchMessage(rows);
    out_.set_data_header(std::move(m.header));
    out_.set_data_body(std::move(m.body));
    return Then::kWrite;
  }

  Then Fail(const Status& s, grpc::Status* st) {
    // Damaged stored bytes, not a bad ticket (as kCorruption means for DoPut's input).
    *st = s.code() == Code::kCorruption ? grpc::Status(grpc::StatusCode::DATA_LOSS, s.message()) : ToGrpc(s);
    return Then::kFinish;
  }

  // Everything up to the tail is sent: waits for the tail to pass `from`.
  Then Wait(grpc::Status* st) {
    uint64_t generation;
    {
      std::lock_guard lk(follow_->mu);
      generation = ++follow_->generation;
      follow_->fired = false;
    }
    std::weak_ptr<Follow> weak = follow_;
    auto id = impl_->engine->WatchTail(
        ticket_.basin, stream_, ticket_.from,
        [weak, generation] {
          // On the thread that moved the tail: hand over to a reader.
          auto f = weak.lock();
          if (!f) return;
          GetCall* call;
          {
            std::lock_guard lk(f->mu);
            if (f->generation != generation) return;
            f->fired = true;
            if (!f->waiting || f->call == nullptr) return;
            f->waiting = false;
            call = f->call;
          }
          // The call is this callback's now (nothing else ends it), and
          // PostNext never throws: a failure to post ends the call, whose
          // OnDone takes f->mu, so that is not held here.
          call->PostNext();
        },
        stream_id_);
    if (!id.ok()) return Fail(id.status(), st);
    if (*id == 0) return Then::kAgain;  // the tail moved (or the stream went) meanwhile
    std::unique_lock lk(follow_->mu);
    if (follow_->end) {
      *st = *follow_->end;
      lk.unlock();
      impl_->engine->UnwatchTail(ticket_.basin, stream_, *id);
      return Then::kFinish;
    }
    if (follow_->fired) return Then::kAgain;
    follow_->waiting = true;
    follow_->watch_id = *id;
    return Then::kWait;
  }

  static constexpr size_t kMaxRows = 1000;
  static constexpr size_t kMaxBytes = 1 << 20;
  FlightServer::Impl* impl_;
  const std::shared_ptr<Follow> follow_;
  ReadTicket ticket_;
  std::string stream_;
  std::optional<uint64_t> stream_id_;  // the stream found at the start (not one created again under its name)
  std::mutex mu_;
  proto::FlightData out_;
  bool sent_schema_ = false;
  bool done_ = false;
};

}  // namespace

void FlightServer::Impl::AddFollower(std::shared_ptr<Follow> f) {
  std::unique_lock lk(followers_mu);
  if (stopping) {
    lk.unlock();
    GetCall::End(f, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is stopping"), this);
    return;
  }
  followers.insert(std::move(f));
}

void FlightServer::Impl::RemoveFollower(const std::shared_ptr<Follow>& f) {
  std::lock_guard lk(followers_mu);
  followers.erase(f);
}

// One Handshake (docs/flight.md). With a token (--auth-token-file), the
// credentials are the call's authorization header (Bearer <token>, or Basic
// with the token as the password) or else the first request's payload (the
// token); on success the answer's headers carry "authorization: Bearer
// <token>", the header the client then sends with every call, and a request
// gets one response (its protocol version, the token as payload). Without a
// token every handshake succeeds. Requests after the first are read and
// dropped until the client half-closes; one of more than kMaxRequestBytes
// beyond the token ends the call INVALID_ARGUMENT, and each read goes to a
// fresh message (none is kept past the next read). A caller without
// credentials in its header that sends no request within kHandshakeWait is
// cancelled (every other method refuses such a caller at once). At most
// max_info_calls handshakes are open at once (places of their own, held
// until OnDone: callers without the token open them too). gRPC's threads
// call it, one reaction at a time (at most one operation is outstanding), so
// it holds no lock but for what it shares with that timer (`pending_`); it
// deletes itself in OnDone.
class HandshakeCall final : public grpc::ServerBidiReactor<proto::HandshakeRequest, proto::HandshakeResponse> {
 public:
  static constexpr auto kHandshakeWait = std::chrono::seconds(10);
  // A request's bytes beyond the token's (a protocol version; a BasicAuth
  // message's user name).
  static constexpr size_t kMaxRequestBytes = 4 << 10;

  HandshakeCall(FlightServer::Impl* impl, grpc::CallbackServerContext* ctx)
      : token_(impl->options.auth_token),
        ctx_(ctx),
        place_(impl->metrics.open_handshake_calls, impl->metrics.handshake_calls_refused,
               impl->options.max_info_calls) {
    if (place_.over()) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          fmt::format("more than {} Handshake calls are open", impl->options.max_info_calls)));
      return;
    }
    header_ok_ = token_.empty() || impl->Authorize(ctx).ok() || impl->BasicMatches(ctx);
    if (!header_ok_) {
      pending_ = std::make_shared<Pending>();
      pending_->ctx = ctx;
      try {
        auto timer = std::make_unique<net::steady_timer>(impl->workers, kHandshakeWait);
        // The handler never touches the timer: Decided may destroy it meanwhile.
        timer->async_wait([p = pending_](const boost::system::error_code& ec) {
          if (ec) return;  // cancelled: the call was decided
          std::lock_guard lk(p->mu);
          if (p->ctx != nullptr) p->ctx->TryCancel();  // OnReadDone(false) then ends it
        });
        pending_->timer = std::move(timer);
      } catch (const std::exception&) {
        Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "out of memory"));
        return;
      }
    }
    ReadNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done sending (or gone, or cancelled)
      Decided();
      if (answered_) return Finish(grpc::Status::OK);
      if (!header_ok_) return Finish(Refused());
      // No request came: the headers alone answer (sent before the status,
      // not merged into its trailers).
      answered_ = true;
      AddBearer();
      return StartSendInitialMetadata();
    }
    if (const size_t n = in_.ByteSizeLong(); n > token_.size() + kMaxRequestBytes) {
      Decided();
      return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 fmt::format("handshake: a request of {} bytes; at most {}", n,
                                             token_.size() + kMaxRequestBytes)));
    }
    if (answered_) return ReadNext();
    Decided();
    if (!header_ok_ && !ConstantTimeEqual(in_.payload(), token_) && !BasicAuthMatches(in_.payload())) {
      return Finish(Refused());
    }
    answered_ = true;
    AddBearer();
    out_.set_protocol_version(in_.protocol_version());
    out_.set_payload(token_);
    StartWrite(&out_);
  }
  void OnSendInitialMetadataDone(bool ok) override {
    Finish(ok ? grpc::Status::OK : grpc::Status::CANCELLED);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    ReadNext();
  }
  void OnDone() override {
    Decided();
    delete this;
  }

 private:
  // What the no-request timer shares with the call: `ctx` until the first
  // request (or the end) came, and the timer until then.
  struct Pending {
    std::mutex mu;
    grpc::CallbackServerContext* ctx = nullptr;
    std::unique_ptr<net::steady_timer> timer;
  };
  // The first request or the end came: the timer must not cancel the call,
  // and goes (destroying it cancels its wait) so that it does not outlive it.
  void Decided() {
    if (!pending_) return;
    std::unique_ptr<net::steady_timer> timer;  // destroyed after the lock is released
    std::lock_guard lk(pending_->mu);
    pending_->ctx = nullptr;
    timer = std::move(pending_->timer);
  }
  static grpc::Status Refused() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "handshake: send authorization: Bearer <token>, Basic credentials with the token as the "
                        "password, or the token (or a BasicAuth message with it as the password) as the first "
                        "request's payload");
  }
  void AddBearer() {
    if (!token_.empty()) ctx_->AddInitialMetadata("authorization", "Bearer " + token_);
  }
  // Reads the next request into a fresh message: Clear() would keep the
  // last one's buffers (a payload's capacity, up to a whole gRPC message).
  void ReadNext() {
    in_ = proto::HandshakeRequest();
    StartRead(&in_);
  }
  // A payload that is Arrow Java's BasicAuth message with the token as the
  // password (the user name is not checked).
  bool BasicAuthMatches(const std::string& payload) const {
    proto::BasicAuth basic;
    return !payload.empty() && basic.ParseFromString(payload) && !basic.password().empty() &&
           ConstantTimeEqual(basic.password(), token_);
  }
  const std::string token_;
  grpc::CallbackServerContext* ctx_;
  CallPlace place_;
  bool header_ok_ = false;
  bool answered_ = false;
  std::shared_ptr<Pending> pending_;  // without credentials in the header
  proto::HandshakeRequest in_;
  proto::HandshakeResponse out_;
};

grpc::ServerBidiReactor<proto::FlightData, proto::PutResult>* FlightServer::Impl::DoPut(
    grpc::CallbackServerContext* ctx) {
  return new PutCall(this, ctx);
}

Result<metastore::TableInfo> FlightServer::Impl::LogTable(const Target& t) {
  WEIR_ASSIGN_OR_RETURN(auto table, engine->GetTable(t.basin, t.table));
  if (table.kind != "log") {
    return NotSupported("table {}/{} is a {} table; Flight serves log tables", t.basin, t.table, table.kind);
  }
  if (t.bucket && *t.bucket >= table.bucket_count) {
    return InvalidArgument("table {}/{} has {} buckets; there is no bucket {}", t.basin, t.table, table.bucket_count,
                           *t.bucket);
  }
  return table;
}

grpc::ServerWriteReactor<proto::FlightData>* FlightServer::Impl::DoGet(grpc::CallbackServerContext* ctx,
                                                                     const proto::Ticket* ticket) {
  return new GetCall(this, ctx, *ticket);
}

grpc::ServerUnaryReactor* FlightServer::Impl::OnTable(grpc::CallbackServerContext* ctx,
                                                      const proto::FlightDescriptor* d, TableAnswer answer) {
  auto* r = new UnaryCall();
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) {
    r->Finish(auth);
    return r;
  }
  if (r->place.emplace(metrics.open_info_calls, metrics.info_calls_refused, options.max_info_calls).over()) {
    r->Finish(TooManyInfoCalls(options.max_info_calls));
    return r;
  }
  Post(readers, [this, r, d, answer = std::move(answer)] {
    grpc::Status st;
    try {
      auto t = ParseDescriptor(*d, options.default_basin);
      auto table = t.ok() ? LogTable(*t) : Result<metastore::TableInfo>(t.status());
      st = table.ok() ? answer(*t, *table) : ToGrpc(table.status());
    } catch (const std::exception& e) {
      st = grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
    r->Finish(st);
  });
  return r;
}

grpc::ServerUnaryReactor* FlightServer::Impl::GetSchema(grpc::CallbackServerContext* ctx,
                                                        const proto::FlightDescriptor* d, proto::SchemaResult* out) {
  return OnTable(ctx, d, [out](const Target&, const metastore::TableInfo&) {
    out->set_schema(EncapsulatedMessage(LogReadSchemaMessage()));
    return grpc::Status::OK;
  });
}

grpc::Status FlightServer::Impl::FillFlightInfo(const Target& t, const metastore::TableInfo& table,
                                               const proto::FlightDescriptor& d, proto::FlightInfo* out) {
  // One endpoint per bucket (or the descriptor's bucket): its records up to
  // the tail now, so the dataset is what was acknowledged when asked.
  int64_t total = 0;
  for (uint32_t b = 0; b < table.bucket_count; ++b) {
    if (t.bucket && *t.bucket != b) continue;
    auto stream = engine->GetStream(t.basin, metastore::BucketStreamName(t.table, b));
    if (!stream.ok()) return ToGrpc(stream.status());
    const uint64_t from = std::min(stream->log_start, stream->tail);
    auto* e = out->add_endpoint();
    e->mutable_ticket()->set_ticket(json{{"basin", t.basin},
                                         {"table", t.table},
                                         {"bucket", b},
                                         {"from", from},
                                         {"until", stream->tail},
                                         {"stream_id", stream->info.id}}
                                        .dump());
    total += static_cast<int64_t>(stream->tail - from);
  }
  out->set_schema(EncapsulatedMessage(LogReadSchemaMessage()));
  *out->mutable_flight_descriptor() = d;
  out->set_total_records(total);
  out->set_total_bytes(-1);
  out->set_ordered(true);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* FlightServer::Impl::GetFlightInfo(grpc::CallbackServerContext* ctx,
                                                            const proto::FlightDescriptor* d, proto::FlightInfo* out) {
  return OnTable(ctx, d, [this, d, out](const Target& t, const metastore::TableInfo& table) {
    return FillFlightInfo(t, table, *d, out);
  });
}

grpc::ServerUnaryReactor* FlightServer::Impl::PollFlightInfo(grpc::CallbackServerContext* ctx,
                                                             const proto::FlightDescriptor* d, proto::PollInfo* out) {
  // Done when asked: the whole FlightInfo, no descriptor to poll again.
  return OnTable(ctx, d, [this, d, out](const Target& t, const metastore::TableInfo& table) {
    grpc::Status st = FillFlightInfo(t, table, *d, out->mutable_info());
    if (st.ok()) out->set_progress(1.0);
    return st;
  });
}

grpc::ServerBidiReactor<proto::HandshakeRequest, proto::HandshakeResponse>* FlightServer::Impl::Handshake(
    grpc::CallbackServerContext* ctx) {
  return new HandshakeCall(this, ctx);
}

grpc::ServerWriteReactor<proto::FlightInfo>* FlightServer::Impl::ListFlights(grpc::CallbackServerContext* ctx,
                                                                           const proto::Criteria* criteria) {
  bool refused = false;
  auto* r = NewReplies<proto::FlightInfo>(*this, ctx, &refused);
  if (refused) return r;
  Post(readers, [this, r, criteria] {
    grpc::Status st;
    std::vector<proto::FlightInfo> infos;
    try {
      st = ListTableInfos(criteria->expression(), &infos);
    } catch (const std::exception& e) {
      st = grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
    r->Send(std::move(infos), st);
  });
  return r;
}

grpc::Status FlightServer::Impl::ListTableInfos(const std::string& expression, std::vector<proto::FlightInfo>* out) {
  // The criteria: none (the default basin's tables), or JSON {"basin"?, "prefix"?}.
  std::string basin = options.default_basin, prefix;
  bool named_basin = false;
  if (!expression.empty()) {
    auto parsed = ParseClientJson(expression, "criteria");
    if (!parsed.ok()) return ToGrpc(parsed.status());
    const json& c = *parsed;
    if (!c.is_object()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "criteria: a JSON object {\"basin\"?, \"prefix\"?}");
    }
    for (const auto& [key, value] : c.items()) {
      if ((key != "basin" && key != "prefix") || !value.is_string()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            fmt::format("criteria: '{}' is not a string basin or prefix", key));
      }
      (key == "basin" ? basin : prefix) = value.get<std::string>();
      named_basin = named_basin || key == "basin";
    }
  }
  std::string after;
  size_t endpoints = 0;
  for (;;) {
    auto page = engine->ListTables(basin, prefix, after, 1000);
    // The default basin is made by the first table created in it (Kafka's
    // or create-table's): until then it has none. A basin asked for by name
    // must exist.
    if (!page.ok() && page.status().code() == Code::kNotFound && !named_basin) return grpc::Status::OK;
    if (!page.ok()) return ToGrpc(page.status());
    for (const auto& table : *page) {
      if (table.kind != "log") continue;
      Target t;
      t.basin = basin;
      t.table = table.name;
      proto::FlightDescriptor d;
      d.set_type(proto::FlightDescriptor::PATH);
      d.add_path(basin);
      d.add_path(table.name);
      proto::FlightInfo info;
      grpc::Status st = FillFlightInfo(t, table, d, &info);
      // A table deleted since the listing is left out.
      if (st.error_code() == grpc::StatusCode::NOT_FOUND) continue;
      if (!st.ok()) return st;
      endpoints += static_cast<size_t>(info.endpoint_size());
      if (endpoints > kMaxListedEndpoints) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            fmt::format("more than {} buckets to list: narrow the criteria with a prefix",
                                        kMaxListedEndpoints));
      }
      out->push_back(std::move(info));
    }
    if (page->size() < 1000) return grpc::Status::OK;
    after = page->back().name;
  }
}

// The actions DoAction takes (ListActions lists them).
constexpr std::pair<const char*, const char*> kActions[] = {
    {kAllocateWriter,
     "A writer id for idempotent appends: {\"writer_id\": N, \"writer_epoch\": 0}. Give it in an append "
     "descriptor and a batch_sequence with each batch."},
    {kCreateTable,
     "Creates a log table: {\"table\": T, \"buckets\"?: N (1), \"basin\"?: B}; a Kafka topic of N partitions "
     "in the weir-kafka basin. Answers {\"basin\", \"table\", \"buckets\"}."},
    {kDeleteTable,
     "Deletes a log table and its buckets' records: {\"table\": T, \"basin\"?: B}. Answers {\"deleted\": T}."},
};

Result<json> FlightServer::Impl::RunAction(const proto::Action& action) {
  if (action.type() == kAllocateWriter) {
    WEIR_ASSIGN_OR_RETURN(uint64_t id, engine->AllocateProducerId());
    return json{{"writer_id", id}, {"writer_epoch", 0}};
  }
  WEIR_ASSIGN_OR_RETURN(json body, ParseClientJson(action.body(), action.type()));
  if (!body.is_object()) return InvalidArgument("{}: the body is a JSON object", action.type());
  std::string basin = options.default_basin, table;
  uint64_t buckets = 1;
  for (const auto& [key, value] : body.items()) {
    if (key == "basin" || key == "table") {
      if (!value.is_string()) return InvalidArgument("{}: {} must be a string", action.type(), key);
      (key == "basin" ? basin : table) = value.get<std::string>();
    } else if (key == "buckets" && action.type() == kCreateTable) {
      WEIR_ASSIGN_OR_RETURN(buckets, JsonUint(value, "buckets", metastore::kMaxTableBuckets));
      if (buckets == 0) return InvalidArgument("{}: a table has 1 to {} buckets", action.type(), metastore::kMaxTableBuckets);
    } else {
      return InvalidArgument("{}: unknown key '{}'", action.type(), key);
    }
  }
  WEIR_RETURN_IF_ERROR(metastore::CheckLogTableName(table));
  if (action.type() == kDeleteTable) {
    WEIR_RETURN_IF_ERROR(engine->DeleteTable(basin, table));
    Log().info("flight: deleted table {}/{}", basin, table);
    return json{{"deleted", table}};
  }
  metastore::TableInfo t;
  t.basin = basin;
  t.name = table;
  t.kind = "log";
  t.bucket_count = static_cast<uint32_t>(buckets);
  t.config = "{}";  // no topic configs: Kafka's defaults
  auto created = engine->CreateTable(t, metastore::LogTableStreamConfig());
  if (!created.ok() && created.status().code() == Code::kNotFound && basin == options.default_basin) {
    // The default basin is made on first use (the Kafka listener makes it too).
    Status st = engine->CreateBasin(basin);
    if (!st.ok() && st.code() != Code::kAlreadyExists) return st;
    created = engine->CreateTable(t, metastore::LogTableStreamConfig());
  }
  if (!created.ok()) return created.status();
  Log().info("flight: created table {}/{} with {} buckets", basin, table, buckets);
  return json{{"basin", basin}, {"table", table}, {"buckets", created->bucket_count}};
}

grpc::ServerWriteReactor<proto::Result>* FlightServer::Impl::DoAction(grpc::CallbackServerContext* ctx,
                                                                    const proto::Action* action) {
  bool refused = false;
  auto* r = NewReplies<proto::Result>(*this, ctx, &refused);
  if (refused) return r;
  if (std::none_of(std::begin(kActions), std::end(kActions), [&](const auto& a) { return action->type() == a.first; })) {
    r->Send(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                         fmt::format("unknown action '{}' (ListActions lists them)", action->type())));
    return r;
  }
  // Metastore writes: on a thread of their own, not gRPC's nor a reader's.
  Post(actors, [this, r, action] {
    Result<json> out = Internal("no answer");
    try {
      out = RunAction(*action);
    } catch (const std::exception& e) {
      out = Internal("{}: {}", action->type(), e.what());
    }
    if (!out.ok()) return r->Send(ToGrpc(out.status()));
    proto::Result res;
    res.set_body(out->dump());
    std::vector<proto::Result> msgs;
    msgs.push_back(std::move(res));
    r->Send(std::move(msgs), grpc::Status::OK);
  });
  return r;
}

grpc::ServerWriteReactor<proto::ActionType>* FlightServer::Impl::ListActions(grpc::CallbackServerContext* ctx,
                                                                           const proto::Empty*) {
  bool refused = false;
  auto* r = NewReplies<proto::ActionType>(*this, ctx, &refused);
  if (refused) return r;
  std::vector<proto::ActionType> types;
  for (const auto& [name, description] : kActions) {
    proto::ActionType t;
    t.set_type(name);
    t.set_description(description);
    types.push_back(std::move(t));
  }
  r->Send(std::move(types), grpc::Status::OK);
  return r;
}

FlightServer::FlightServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FlightServer::~FlightServer() { Stop(0); }

namespace {
// Whether gRPC's version string ("1.51.1") is below `fixed`; false if it does not parse.
bool GrpcOlderThan(const std::string& version, std::array<int, 3> fixed) {
  std::array<int, 3> v{};
  std::string_view rest = version;
  for (int& part : v) {
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), part);
    if (ec != std::errc()) return false;
    rest.remove_prefix(static_cast<size_t>(end - rest.data()));
    if (!rest.empty() && rest.front() == '.') rest.remove_prefix(1);
  }
  return v < fixed;
}
}  // namespace

Result<std::unique_ptr<FlightServer>> FlightServer::Start(const FlightOptions& options, log::Engine* engine) {
  auto impl = std::make_unique<Impl>(options, engine);
  grpc::ServerBuilder b;
  const std::string addr = options.host.find(':') != std::string::npos
                               ? fmt::format("[{}]:{}", options.host, options.port)
                               : fmt::format("{}:{}", options.host, options.port);
  b.AddListeningPort(addr, grpc::InsecureServerCredentials(), &impl->port);
  b.RegisterService(impl.get());
  b.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(options.max_message_bytes, INT32_MAX)));
  // gRPC takes in a whole request before a method (its token check, its call
  // limit) sees it, on as many calls as clients open: what requests still
  // arriving, calls' arenas and connections' buffers take is kept near a
  // quota (past it gRPC cancels calls), and a connection opens at most
  // as many calls at once as all the limits below allow together (gRPC's
  // clients queue calls past it: a client following many buckets over one
  // channel must not wait for ever).
  // It has room for two messages on every DoPut call at once (a stream
  // buffers up to its flow-control window besides the message being read),
  // and a few more.
  grpc::ResourceQuota quota("weir-flight");
  quota.Resize(
      std::max(options.max_grpc_memory_bytes, (2 * options.max_put_calls + 8) * options.max_message_bytes));
  b.SetResourceQuota(quota);  // (the builder takes a reference, and passes it to the server)
  b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                       static_cast<int>(std::min<size_t>(
                           options.max_put_calls + options.max_get_calls + 2 * options.max_info_calls, INT32_MAX)));
  // One port per server: gRPC would otherwise let a second process bind it too.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A client that vanished without closing (a host gone, a cable pulled)
  // is found by keepalive pings within about 80 s, and its calls cancelled,
  // so its DoPut calls give their places back; a connection idle for 10
  // minutes is closed.
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 600000);
  impl->server = b.BuildAndStart();
  if (!impl->server || impl->port == 0) {
    // (The pools stop and join as impl goes.)
    return Unavailable("--flight-addr {}: cannot listen there", addr);
  }
  if (GrpcOlderThan(grpc::Version(), {1, 56, 2})) {
    // (Point releases of 1.53 to 1.55 and distributions' builds may carry the fixes; the version cannot tell.)
    Log().warn("flight: gRPC {} may have denial-of-service flaws that weir cannot work around (fixed in 1.56.2: "
               "CVE-2023-33953, a client's endless CONTINUATION frames grow memory without bound; CVE-2023-4785, "
               "the listener stops accepting for good once the process runs out of file descriptors); serve "
               "--flight-addr to trusted clients only (docs/flight.md)",
               grpc::Version());
  }
  return std::unique_ptr<FlightServer>(new FlightServer(std::move(impl)));
}

uint16_t FlightServer::port() const { return static_cast<uint16_t>(impl_->port); }

const FlightMetrics& FlightServer::metrics() const { return impl_->metrics; }

void FlightServer::BeginStop(int grace_ms) {
  std::call_once(impl_->stop_begun, [&] {
    // DoGet calls that follow a tail end now (UNAVAILABLE: clients
    // reconnect elsewhere); the rest get the grace.
    std::set<std::shared_ptr<Follow>> followers;
    {
      std::lock_guard lk(impl_->followers_mu);
      impl_->stopping = true;
      followers.swap(impl_->followers);
    }
    for (const auto& f : followers) {
      GetCall::End(f, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is stopping"), impl_.get());
    }
    // gRPC's Shutdown refuses new calls at once, cancels the open ones at the
    // deadline and then waits for each to end: a DoPut ends once the appends
    // it handed over are answered, which a failing store holds off until the
    // engine's close. So it runs on a thread of its own, and Stop joins it.
    const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms);
    impl_->stopper = std::thread([impl = impl_.get(), deadline] {
      SetThreadName("flight-stop");
      impl->server->Shutdown(deadline);
    });
  });
}

void FlightServer::Stop(int grace_ms) {
  BeginStop(grace_ms);
  std::call_once(impl_->stopped, [&] {
    // Calls end first (a call waiting for admission needs the workers and
    // their timers until its wait ends, within the admission timeout); the
    // pools then stop and join.
    if (impl_->stopper.joinable()) impl_->stopper.join();
    // Every call has had its OnDone: what is still queued refers to no call
    // (a decided Handshake's cancelled timer wait, say) and is dropped, not waited for.
    impl_->workers.stop();
    impl_->readers.stop();
    impl_->actors.stop();
    impl_->workers.join();
    impl_->readers.join();
    impl_->actors.join();
  });
}

}  // namespace weir::flight
