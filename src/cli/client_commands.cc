#include "cli/client_commands.h"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/base64.h"
#include "base/clock.h"
#include "base/utf8.h"
#include "bench/http_bench.h"
#include "client/client.h"

namespace weir::cli {

using client::Client;
using json = nlohmann::ordered_json;

// Every flag of every command registered here; one command runs per process.
struct ClientCommandsState {
  client::ClientOptions conn;
  double timeout_s = 90;  // --timeout: into conn.timeout_ms
  bool json_out = false;
  std::string name;    // NAME or STREAM
  std::string prefix;  // list --prefix
  // stream create; basin create (the basin's defaults for new streams)
  std::string storage_class, retention, timestamping_mode;
  std::optional<int64_t> delete_on_empty_min_age;
  bool create_stream_on_append = false, create_stream_on_read = false;  // basin create
  // append
  bool producer = false;
  std::optional<uint64_t> match_seq_num;
  std::optional<std::string> fencing_token;
  double linger_ms = 10;
  size_t max_batch_records = 1000;
  size_t max_batch_bytes = 512 << 10;
  std::string input = "text";  // text (a line is a body) or json (a line is a record, as `read --json` prints it)
  // read
  std::optional<uint64_t> from, tail_offset, timestamp, count;
  bool follow = false;

  bench::HttpBenchOptions bench;

  CLI::App* basin_create = nullptr;
  CLI::App* basin_list = nullptr;
  CLI::App* basin_delete = nullptr;
  CLI::App* stream_create = nullptr;
  CLI::App* stream_list = nullptr;
  CLI::App* stream_info = nullptr;
  CLI::App* stream_delete = nullptr;
  CLI::App* append = nullptr;
  CLI::App* read = nullptr;
  CLI::App* tail = nullptr;
  CLI::App* bench_http = nullptr;
};

namespace {

// --server, --basin, --auth-token, --timeout and --json, on every client command.
void AddConnectionFlags(CLI::App* cmd, ClientCommandsState& s) {
  cmd->add_option("--server", s.conn.server, "weir server URL")->envname("WEIR_SERVER")->capture_default_str();
  cmd->add_option("--timeout", s.timeout_s,
                  "Seconds a request waits for its answer (one that timed out before any request of the run "
                  "succeeded is not tried again)")
      ->envname("WEIR_TIMEOUT")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--basin", s.conn.basin, "Basin (s2-basin header; default: the server's weir-default)")
      ->envname("WEIR_BASIN");
  cmd->add_option("--auth-token", s.conn.auth_token, "Bearer token")->envname("WEIR_AUTH_TOKEN");
  cmd->add_flag("--json", s.json_out, "One JSON object per line, for scripts");
}

// A client command under `parent`, with the connection flags and, if given, a
// required positional argument (into s.name).
CLI::App* Leaf(CLI::App* parent, ClientCommandsState& s, const std::string& name, const std::string& help,
               const char* positional) {
  CLI::App* cmd = parent->add_subcommand(name, help);
  AddConnectionFlags(cmd, s);
  if (positional != nullptr) cmd->add_option(positional, s.name, positional)->required();
  return cmd;
}

// `weir KIND create NAME | list [--prefix P] | delete NAME`.
CLI::App* Group(CLI::App& app, ClientCommandsState& s, const std::string& kind, const std::string& help,
                CLI::App** create, CLI::App** list, CLI::App** del) {
  CLI::App* group = app.add_subcommand(kind, help);
  group->require_subcommand(1);
  *create = Leaf(group, s, "create", "Create a " + kind, "NAME");
  *list = Leaf(group, s, "list", "List " + kind + "s", nullptr);
  (*list)->add_option("--prefix", s.prefix, "Only names starting with this");
  *del = Leaf(group, s, "delete", "Delete a " + kind, "NAME");
  return group;
}

// One error line on stderr; exit status 1.
int Fail(const ClientCommandsState& s, const Status& st) {
  std::string msg = st.message();
  if (st.code() == Code::kUnavailable && msg.starts_with("cannot connect to")) {
    msg = fmt::format("cannot reach the weir server at {} ({}); is `weir serve` running there? (--server or WEIR_SERVER)",
                      s.conn.server, msg.substr(msg.find(": ") + 2));
    // libcurl goes through a proxy these name (unless no_proxy lists the host).
    const bool tls = s.conn.server.starts_with("https:");
    for (const char* var : {tls ? "https_proxy" : "http_proxy", tls ? "HTTPS_PROXY" : "", "all_proxy", "ALL_PROXY"}) {
      if (*var == '\0') continue;
      const char* v = std::getenv(var);
      if (v != nullptr && *v != '\0') {
        msg += fmt::format("; requests go through the proxy {}={} (set no_proxy to reach the server directly)", var, v);
        break;
      }
    }
  }
  std::cerr << "weir: " << msg << "\n";
  return 1;
}

bool IsUtf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

void PrintJson(const json& j) { std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n"; }

// A record as one JSON line: text as is, or (if any of it is not UTF-8)
// body and headers in base64 with "encoding": "base64".
json RecordJson(const client::SequencedRecord& r) {
  bool text = IsUtf8(r.body);
  for (const auto& [k, v] : r.headers) text = text && IsUtf8(k) && IsUtf8(v);
  auto enc = [text](const std::string& b) { return text ? b : Base64Encode(b); };
  json headers = json::array();
  for (const auto& [k, v] : r.headers) headers.push_back({enc(k), enc(v)});
  json j = {{"seq_num", r.seq_num}, {"timestamp", r.timestamp}, {"headers", headers}, {"body", enc(r.body)}};
  if (!text) j["encoding"] = "base64";
  return j;
}

// Flushes what was printed; an error if any of it could not be written (a
// full disk, /dev/full), so the command does not exit 0 with its output cut.
Status StdoutWritten() {
  errno = 0;
  std::cout.flush();  // with stdio in sync, this is the fflush that fails
  int err = errno;
  errno = 0;
  if (std::fflush(stdout) != 0 && errno != 0) err = errno;
  if (!std::cout.fail() && std::ferror(stdout) == 0) return Status::Ok();
  return IOError("writing standard output failed{}", err != 0 ? fmt::format(": {}", std::strerror(err)) : "");
}

// Prints a batch: raw bodies one per line (command records skipped), or JSON.
Status PrintRecords(const ClientCommandsState& s, const client::ReadBatch& batch) {
  for (const auto& r : batch.records) {
    if (s.json_out) {
      PrintJson(RecordJson(r));
    } else if (!r.IsCommand()) {
      std::fwrite(r.body.data(), 1, r.body.size(), stdout);
      std::fputc('\n', stdout);
    }
  }
  return StdoutWritten();
}


// An S2 StreamConfig object from the stream config flags; empty if none is set.
Result<json> StreamConfigJson(const ClientCommandsState& s) {
  json config = json::object();
  if (!s.storage_class.empty()) config["storage_class"] = s.storage_class;
  if (s.retention == "infinite") {
    config["retention_policy"] = {{"infinite", json::object()}};
  } else if (!s.retention.empty()) {
    uint64_t secs = 0;
    auto [end, ec] = std::from_chars(s.retention.data(), s.retention.data() + s.retention.size(), secs);
    if (ec != std::errc() || end != s.retention.data() + s.retention.size() || secs == 0 ||
        secs > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgument("--retention must be a positive number of seconds or \"infinite\", got \"{}\"",
                             s.retention);
    }
    config["retention_policy"] = {{"age", secs}};
  }
  if (!s.timestamping_mode.empty()) config["timestamping"] = {{"mode", s.timestamping_mode}};
  if (s.delete_on_empty_min_age) config["delete_on_empty"] = {{"min_age_secs", *s.delete_on_empty_min_age}};
  return config;
}

int PrintDone(const ClientCommandsState& s, const Status& st, const char* kind, const char* verb) {
  if (!st.ok()) return Fail(s, st);
  if (s.json_out) {
    PrintJson({{kind, s.name}, {verb, true}});
  } else {
    std::cout << kind << " " << json(s.name).dump(-1, ' ', false, json::error_handler_t::replace) << " " << verb << "\n";
  }
  return 0;
}

// Calls `attempt` (which says, on failure, whether the server certainly did
// nothing) again after a retryable failure: a failure that may have taken
// effect only when `unknown_is_safe`, else only one that did nothing (no
// connection, 429, 503 server_draining or server_starting). Backpressure
// (429) lasts as long as settle is behind, and a server may take a while to
// recover: refusals that did nothing are waited out for up to 5 minutes.
// Other retryable failures (no server answering included) get 10 tries,
// counted apart from the refusals waited out (a restart after a stretch of
// 429s still gets its 10); with `fail_without_server`, none when no server
// has answered this run yet. A request that timed out before any succeeded
// this run is not tried again (a server that never answers would take 10
// timeouts).
bool g_server_answered = false;  // a call of this run succeeded (the CLI is one thread)
bool g_said_retrying = false;    // the "retrying" line was printed
template <typename Attempt>
auto RetryWhileSafe(bool unknown_is_safe, Attempt&& attempt, bool fail_without_server = false)
    -> decltype(attempt(nullptr)) {
  using Nothing = Client::NothingAppended;
  auto backoff = std::chrono::milliseconds(100);
  const auto give_up_at = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  for (int tries = 0;;) {
    Nothing nothing = Nothing::kUnknown;
    auto result = attempt(&nothing);
    if (result.ok()) {
      g_server_answered = true;
      return result;
    }
    const Status& st = result.status();
    const bool wait_out = st.code() == Code::kResourceExhausted || nothing == Nothing::kRefused;
    const bool unknown = nothing == Nothing::kUnknown;
    if (!wait_out) ++tries;
    if (!st.retryable() || (unknown && !unknown_is_safe) || (!wait_out && tries >= 10) ||
        std::chrono::steady_clock::now() >= give_up_at ||
        (!g_server_answered && st.code() == Code::kTimeout) ||
        (fail_without_server && !g_server_answered && st.message().starts_with("cannot connect"))) {
      return result;
    }
    // Said once a run, so a wait of seconds (or minutes, under backpressure) is not silent.
    if (!std::exchange(g_said_retrying, true)) {
      std::cerr << "weir: " << st.message() << "; retrying (" << (wait_out ? "up to 5 minutes" : "10 tries")
                << ")\n";
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

// A read (a GET changes nothing), again after a retryable failure (a 503
// while the server drains or recovers, 429, a connection that dropped, a
// server restarting between a long `weir read`'s pages); the refusals are
// waited out as an append's are. Not when no server has answered at all:
// that is one line at once.
template <typename Attempt>
auto Reread(Client& c, Attempt&& attempt) -> decltype(attempt()) {
  return RetryWhileSafe(
      /*unknown_is_safe=*/true,
      [&](Client::NothingAppended* nothing) {
        auto result = attempt();
        if (!result.ok() && c.last_refused()) *nothing = Client::NothingAppended::kRefused;
        return result;
      },
      /*fail_without_server=*/true);
}

// Prints each page as it comes (`page(start_after, &more)`: one page, each
// tried again as reads are), so a long list starts at once and holds one
// page in memory.
template <typename Page>
int PrintNamedPages(const ClientCommandsState& s, Client& c, Page&& page) {
  std::string start_after;
  for (bool more = true; more;) {
    auto got = Reread(c, [&] { return page(start_after, &more); });
    if (!got.ok()) return Fail(s, got.status());
    if (got->empty()) break;
    if (!start_after.empty() && got->front().name <= start_after) {
      // A server that ignores start_after would be listed for ever.
      return Fail(s, InvalidArgument("the server listed \"{}\" again after it: not a weir or S2 server?",
                                     got->front().name));
    }
    for (const auto& e : *got) {
      if (s.json_out) {
        PrintJson({{"name", e.name}, {"created_at", e.created_at}});
      } else {
        std::cout << e.name << "\n";
      }
    }
    if (Status written = StdoutWritten(); !written.ok()) return Fail(s, written);
    start_after = got->back().name;
  }
  return 0;
}

Status StatusOf(const Status& st) { return st; }
template <typename T>
Status StatusOf(const Result<T>& r) {
  return r.status();
}

// A change (a create, a delete) is tried again only after a weir server's
// refusal that did nothing (503 while it starts or drains, 429): any other
// failure may have changed something (a delete tried again after it landed
// would say "not found"), and no server at all is not waited for.
template <typename Attempt>
Status RetryRefused(Client& c, Attempt&& attempt) {
  return RetryWhileSafe(
             /*unknown_is_safe=*/false,
             [&](Client::NothingAppended* nothing) -> Result<bool> {
               Status st = StatusOf(attempt());
               if (st.ok()) return true;
               if (c.last_refused()) *nothing = Client::NothingAppended::kRefused;
               return st;
             },
             /*fail_without_server=*/true)
      .status();
}

std::string RetentionText(const client::StreamConfig& c) {
  if (!c.retention_age_s) return "infinite";
  int64_t s = *c.retention_age_s;
  if (s % 86400 == 0) return fmt::format("{}d ({} s)", s / 86400, s);
  return fmt::format("{} s", s);
}

int StreamInfo(ClientCommandsState& s, Client& c) {
  auto config = Reread(c, [&] { return c.GetStreamConfig(s.name); });
  if (!config.ok()) return Fail(s, config.status());
  auto tail = Reread(c, [&] { return c.CheckTail(s.name); });
  if (!tail.ok()) return Fail(s, tail.status());
  if (s.json_out) {
    PrintJson({{"stream", s.name},
               {"config", json::parse(config->json)},
               {"tail", {{"seq_num", tail->seq_num}, {"timestamp", tail->timestamp}}}});
    return 0;
  }
  std::cout << "stream         " << s.name << "\n"
            << "storage class  " << config->storage_class << "\n"
            << "retention      " << RetentionText(*config) << "\n"
            << "timestamping   " << config->timestamping_mode << (config->timestamping_uncapped ? " (uncapped)" : "")
            << "\n"
            << "delete empty   "
            << (config->delete_on_empty_min_age_s > 0 ? fmt::format("after {} s", config->delete_on_empty_min_age_s)
                                                      : std::string("never"))
            << "\n"
            << "tail           " << tail->seq_num << "\n";
  return 0;
}

// S2's limit on one append, so on one record, in metered bytes.
constexpr size_t kMaxRecordMetered = 1 << 20;

// Metered size of one record (S2's): 8 + body + per header 2 + name + value.
size_t Metered(const client::AppendRecord& r) {
  size_t n = 8 + r.body.size();
  for (const auto& [k, v] : r.headers) n += 2 + k.size() + v.size();
  return n;
}

// Sends one batch, and again after a retryable failure: with a producer (the
// same producer sequence, so a retry of an append that did land comes back as
// a duplicate instead of a second copy), else only when nothing was appended.
Result<client::AppendAck> AppendWithRetry(ClientCommandsState& s, Client& c, const std::vector<client::AppendRecord>& batch,
                                          const client::AppendOptions& ao) {
  bool unknown = false;
  auto ack = RetryWhileSafe(s.producer, [&](Client::NothingAppended* nothing) {
    auto r = c.Append(s.name, batch, ao, nothing);
    unknown = *nothing == Client::NothingAppended::kUnknown;
    return r;
  });
  if (!ack.ok() && ack.status().retryable() && unknown) {
    // A timeout, a lost connection, a 503 that may have landed: sending it
    // again could append it twice. With --producer the tries ran out (a new
    // run is a new producer, whose resend is not a duplicate to the server).
    return Status(ack.status().code(),
                  ack.status().message() + (s.producer ? "; the batch may have been appended (its retries ran out)"
                                                       : "; the batch may have been appended (with --producer, `weir "
                                                         "append` retries such failures without duplicates)"));
  }
  return ack;
}

// Longest line `append --input json` reads: a largest record's JSON, its
// body all \u escapes or in base64 (with room for headers' and keys' JSON).
constexpr size_t kMaxJsonLine = 6 * kMaxRecordMetered + (64 << 10);

// A record from one line of `append --input json`: an object as `read
// --json` prints it: "body" (a string), "headers" ([[name, value], ...]),
// "timestamp" (ms), "encoding": "base64" for a body and headers in base64;
// "seq_num" is ignored (the server assigns it). Every field may be left out
// (an empty body); any other field, or a wrong type, is an error.
Result<client::AppendRecord> RecordFromJson(std::string_view line, uint64_t line_no) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("line {} is not a record (--input json): {}; nothing after the last ack printed was appended",
                           line_no, why);
  };
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not a JSON value, or not UTF-8");
  if (!j.is_object()) return bad("not a JSON object");
  bool base64 = false;
  if (auto e = j.find("encoding"); e != j.end() && !e->is_null()) {
    if (!e->is_string() || e->get<std::string>() != "base64") return bad("\"encoding\" can only be \"base64\"");
    base64 = true;
  }
  auto decode = [&](const json& v, std::string_view what) -> Result<std::string> {
    if (!v.is_string()) return bad(fmt::format("{} must be a string", what));
    if (!base64) return v.get<std::string>();
    auto d = Base64Decode(v.get<std::string>());
    if (!d.ok()) return bad(fmt::format("{} is not base64", what));
    return *d;
  };
  client::AppendRecord r;
  for (const auto& [key, v] : j.items()) {
    if (key == "encoding" || key == "seq_num") continue;
    if (key == "body") {
      WEIR_ASSIGN_OR_RETURN(r.body, decode(v, "\"body\""));
    } else if (key == "timestamp") {
      if (v.is_null()) continue;
      if (!v.is_number_unsigned()) return bad("\"timestamp\" must be a whole number of milliseconds");
      r.timestamp = v.get<uint64_t>();
    } else if (key == "headers") {
      if (!v.is_array()) return bad("\"headers\" must be an array of [name, value] pairs");
      for (const json& h : v) {
        if (!h.is_array() || h.size() != 2) return bad("\"headers\" must be an array of [name, value] pairs");
        WEIR_ASSIGN_OR_RETURN(std::string name, decode(h[0], "a header name"));
        WEIR_ASSIGN_OR_RETURN(std::string value, decode(h[1], "a header value"));
        r.headers.emplace_back(std::move(name), std::move(value));
      }
    } else {
      return bad(fmt::format("unknown field \"{}\" (a record has body, headers, timestamp, encoding)", key));
    }
  }
  return r;
}

int Append(ClientCommandsState& s, Client& c) {
  client::AppendOptions ao;
  ao.match_seq_num = s.match_seq_num;
  ao.fencing_token = s.fencing_token;
  if (s.producer) {
    // An id allocated by a try whose answer was lost is merely unused.
    auto p = RetryWhileSafe(/*unknown_is_safe=*/true,
                            [&](Client::NothingAppended* nothing) { return c.AllocateProducer(nothing); });
    if (!p.ok()) return Fail(s, p.status());
    ao.producer = *p;
  }
  std::vector<client::AppendRecord> batch;
  size_t batch_bytes = 0;
  TimePoint deadline;  // linger deadline of the pending batch
  auto flush = [&]() -> Status {
    if (batch.empty()) return Status::Ok();
    WEIR_ASSIGN_OR_RETURN(client::AppendAck ack, AppendWithRetry(s, c, batch, ao));
    if (s.json_out) {
      PrintJson({{"stream", s.name},
                 {"start", ack.start.seq_num},
                 {"end", ack.end.seq_num},
                 {"tail", ack.tail.seq_num},
                 {"duplicated", ack.duplicated}});
    } else {
      std::cout << s.name << " " << ack.start.seq_num << ".." << ack.end.seq_num
                << (ack.duplicated ? " (duplicate)" : "") << "\n";
    }
    WEIR_RETURN_IF_ERROR(StdoutWritten().WithContext(fmt::format("printing the ack of records up to {}", ack.end.seq_num)));
    if (ao.match_seq_num) ao.match_seq_num = ack.end.seq_num;  // the next batch follows this one
    // Sequences wrap from 2^31 - 1 to 0, as Kafka's (and the server's producer window).
    ao.producer_seq = (ao.producer_seq + batch.size()) % (uint64_t{1} << 31);
    batch.clear();
    batch_bytes = 0;
    return Status::Ok();
  };
  uint64_t line_no = 0;  // of the last line read
  // A record's limit, checked before anything holding the line is sent.
  auto too_long = [&](size_t body_bytes, bool whole) {
    return InvalidArgument(
        "line {} is {}{} bytes; a record holds at most {} (S2's limit: {} metered bytes, 8 of them per record); "
        "nothing after the last ack printed was appended",
        line_no, whole ? "" : "at least ", body_bytes, kMaxRecordMetered - 8, kMaxRecordMetered);
  };
  const bool json_in = s.input == "json";
  uint64_t commands_skipped = 0;
  auto add = [&](std::string line) -> Status {
    client::AppendRecord r;
    if (json_in) {
      WEIR_ASSIGN_OR_RETURN(r, RecordFromJson(line, line_no));
      // A command record (one header, named ""), as `read --json` prints
      // them: appended here it would fence or trim this stream, by the
      // numbering of the one it was read from.
      if (r.headers.size() == 1 && r.headers[0].first.empty()) {
        ++commands_skipped;
        return Status::Ok();
      }
    } else {
      r.body = std::move(line);
    }
    size_t m = Metered(r);
    if (m > kMaxRecordMetered) {
      if (!json_in) return too_long(r.body.size(), true);
      return InvalidArgument(
          "line {} is a record of {} metered bytes (8 + body + 2 + name + value per header); a record holds at most {} "
          "(S2's limit); nothing after the last ack printed was appended",
          line_no, m, kMaxRecordMetered);
    }
    if (!batch.empty() && batch_bytes + m > s.max_batch_bytes) WEIR_RETURN_IF_ERROR(flush());
    if (batch.empty()) deadline = Now() + std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(s.linger_ms));
    batch.push_back(std::move(r));
    batch_bytes += m;
    if (batch.size() >= s.max_batch_records) return flush();
    return Status::Ok();
  };

  std::string pending;  // an incomplete last line
  std::string buf(64 << 10, '\0');
  for (;;) {
    int timeout = -1;
    if (!batch.empty()) {
      timeout = static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Now()).count()));
    }
    pollfd pfd{STDIN_FILENO, POLLIN, 0};
    int ready = poll(&pfd, 1, timeout);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {  // linger expired
      if (Status st = flush(); !st.ok()) return Fail(s, st);
      continue;
    }
    ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Fail(s, IOError("reading stdin: {}", std::strerror(errno)));
    if (n == 0) break;
    std::string_view chunk(buf.data(), static_cast<size_t>(n));
    for (size_t nl; (nl = chunk.find('\n')) != std::string_view::npos; chunk.remove_prefix(nl + 1)) {
      ++line_no;
      pending.append(chunk.substr(0, nl));
      if (pending.ends_with('\r')) pending.pop_back();  // a CRLF line ends as an LF one does
      if (Status st = add(std::move(pending)); !st.ok()) return Fail(s, st);
      pending.clear();
    }
    pending.append(chunk);
    // A line that can no longer fit a record fails now, not once it ends.
    const size_t line_bytes = pending.size() - (pending.ends_with('\r') ? 1 : 0);
    if (json_in && line_bytes > kMaxJsonLine) {
      ++line_no;
      return Fail(s, InvalidArgument("line {} is more than {} bytes, longer than any record's JSON (--input json); "
                                     "nothing after the last ack printed was appended",
                                     line_no, kMaxJsonLine));
    }
    if (!json_in && line_bytes + 8 > kMaxRecordMetered) {
      ++line_no;
      return Fail(s, too_long(line_bytes, false));
    }
  }
  if (!pending.empty()) {
    ++line_no;
    if (Status st = add(std::move(pending)); !st.ok()) return Fail(s, st);
  }
  if (Status st = flush(); !st.ok()) return Fail(s, st);
  if (commands_skipped > 0) {
    std::cerr << "weir: skipped " << commands_skipped
              << " command record(s) (fence, trim): appended they would act on this stream\n";
  }
  return 0;
}

client::ReadStart StartOf(const ClientCommandsState& s) {
  using K = client::ReadStart::Kind;
  if (s.from) return {K::kSeqNum, *s.from};
  if (s.tail_offset) return {K::kTailOffset, *s.tail_offset};
  if (s.timestamp) return {K::kTimestamp, *s.timestamp};
  return {K::kFirst, 0};
}

// Follows the stream through a read session, reconnecting (from the last
// event id) when the connection drops, for as long as it takes once it has
// connected (a server restart, or a recovery answering 503 for a while): the
// first failure of each outage is one line on stderr.
// Whether standard output is a pipe whose reader is gone (`| head -1`
// done): a write would raise SIGPIPE, and an idle follower writes nothing.
bool OutputPipeClosed() {
  struct stat st {};
  if (fstat(STDOUT_FILENO, &st) != 0 || !S_ISFIFO(st.st_mode)) return false;
  pollfd pfd{STDOUT_FILENO, 0, 0};  // POLLERR is reported whatever is asked
  return poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLERR) != 0;
}

int Follow(ClientCommandsState& s, Client& c) {
  client::ReadOptions ro;
  ro.start = StartOf(s);
  if (ro.start.kind == client::ReadStart::Kind::kTailOffset) {
    // "N back from the tail" means the tail now: a reconnect before the first
    // batch (which has no event id to resume from yet) must not re-resolve it
    // against a tail that has moved, skipping what was appended meanwhile.
    auto tail = Reread(c, [&] { return c.CheckTail(s.name); });
    if (!tail.ok()) return Fail(s, tail.status());
    ro.start = {client::ReadStart::Kind::kSeqNum, tail->seq_num - std::min(tail->seq_num, ro.start.value)};
  }
  if (ro.start.kind == client::ReadStart::Kind::kTimestamp) {
    // Resolved now, for the same reason: the first record at or after the
    // time, or (a time past the last record's) the tail as it was before
    // the look, so the follower gets every record appended from then on.
    auto tail = Reread(c, [&] { return c.CheckTail(s.name); });
    if (!tail.ok()) return Fail(s, tail.status());
    client::ReadOptions first;
    first.start = ro.start;
    first.count = 1;
    first.clamp = true;
    auto found = Reread(c, [&] { return c.Read(s.name, first); });
    if (!found.ok()) return Fail(s, found.status());
    ro.start = {client::ReadStart::Kind::kSeqNum,
                found->records.empty() ? tail->seq_num : found->records.front().seq_num};
  }
  ro.count = s.count;
  // A session bounded by a count ends at the tail unless told to wait; a
  // follower waits for records as long as it takes.
  if (s.count) ro.wait_s = std::numeric_limits<int>::max();
  // Which stream is followed (its creation time, looked up before each
  // session until one is accepted): a session resumes by sequence number,
  // so one that reconnects to a stream deleted and made again meanwhile
  // must stop rather than go on from its old position in the new one.
  // Unknown (a failed look, or no stream: the basin may make it on read):
  // not checked. Before a session was accepted a failed look is let be:
  // the session's own failure tells what is wrong.
  std::optional<std::string> created_at;
  bool connected = false;  // ever
  auto same_stream = [&]() -> Status {
    auto found = c.FindStream(s.name);
    if (!connected) {
      created_at.reset();
      if (found.ok() && *found) created_at = (*found)->created_at;
      return Status::Ok();
    }
    if (!created_at) return Status::Ok();
    if (!found.ok()) return found.status();
    if (!*found) return NotFound("stream {} was deleted while the follower was away", s.name);
    if ((*found)->created_at != *created_at) {
      return PreconditionFailed(
          "stream {} was deleted and made again while the follower was away (created {}, was {}): its records "
          "are not those followed; read it anew",
          s.name, (*found)->created_at, *created_at);
    }
    return Status::Ok();
  };
  uint64_t delivered = 0;  // records received: a follower stops at --count itself
  std::string last_event_id;
  bool failing = false;  // since the last connect
  auto backoff = std::chrono::milliseconds(500);
  for (;;) {
    Status printed;
    Status st = same_stream();
    if (st.ok()) st = c.ReadSession(s.name, ro, &last_event_id, [&](const client::ReadBatch& b) {
      printed = PrintRecords(s, b);
      if (!printed.ok()) return false;
      delivered += b.records.size();
      // Not waiting for [DONE]: a session resumed after the last record
      // would wait at the tail for one more.
      return !s.count || delivered < *s.count;
    }, [&] {  // connected (or an event, pings every 5 s included): the failures so far are over
      connected = true;
      failing = false;
      backoff = std::chrono::milliseconds(500);
      // Ends as a write to the pipe would, without waiting for a record:
      // by SIGPIPE, or (the signal ignored, as under systemd) with EPIPE's
      // error; from inside the transfer, so at once.
      if (OutputPipeClosed()) {
        struct sigaction now {};
        if (sigaction(SIGPIPE, nullptr, &now) == 0 && now.sa_handler != SIG_IGN) std::raise(SIGPIPE);
        std::cerr << "weir: writing standard output failed: " << std::strerror(EPIPE) << "\n";
        std::_Exit(1);
      }
    });
    if (!printed.ok()) return Fail(s, printed);
    if (st.ok()) return 0;
    bool transient = st.code() == Code::kUnavailable || st.code() == Code::kTimeout;
    // Until a session was once accepted, only a weir server's refusal that
    // did nothing (503 starting or draining, 429) is waited out: anything
    // else (no server, a listener that hangs up or never answers, another
    // protocol's port) would be retried for ever.
    if (!transient || (!connected && !c.last_refused())) return Fail(s, st);
    if (!failing) std::cerr << "weir: " << st.message() << "; reconnecting\n";
    failing = true;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

// Reads from the start position up to the tail (or --count records), one
// request of at most 1000 records at a time.
int Read(ClientCommandsState& s, Client& c) {
  if (s.follow) return Follow(s, c);
  client::ReadOptions ro;
  ro.start = StartOf(s);
  std::optional<uint64_t> left = s.count;
  // Up to the tail as it is when the read begins: records appended
  // meanwhile are a follower's (--follow); a writer faster than the pages
  // would otherwise keep the read going. (No stream: the read says so.)
  std::optional<uint64_t> end;
  {
    auto tail = Reread(c, [&] { return c.CheckTail(s.name); });
    if (tail.ok()) {
      end = tail->seq_num;
    } else if (tail.status().code() != Code::kNotFound) {
      return Fail(s, tail.status());
    }
  }
  if (end && ro.start.kind == client::ReadStart::Kind::kTailOffset) {
    // N back from that tail, not from one that has moved since.
    ro.start = {client::ReadStart::Kind::kSeqNum, *end - std::min(*end, ro.start.value)};
  }
  if (end && ro.start.kind == client::ReadStart::Kind::kSeqNum && ro.start.value > *end) {
    end.reset();  // past the tail: the server says so (416), or reads what came meanwhile
  }
  while (!left || *left > 0) {
    ro.count = left ? std::optional<uint64_t>(std::min<uint64_t>(*left, 1000)) : std::nullopt;
    auto batch = Reread(c, [&] { return c.Read(s.name, ro); });
    if (!batch.ok()) return Fail(s, batch.status());
    if (end) {
      std::erase_if(batch->records, [&](const client::SequencedRecord& r) { return r.seq_num >= *end; });
    }
    if (Status printed = PrintRecords(s, *batch); !printed.ok()) return Fail(s, printed);
    if (batch->records.empty()) break;
    if (left) *left -= batch->records.size();
    uint64_t next = batch->records.back().seq_num + 1;
    if ((end && next >= *end) || (batch->tail && next >= batch->tail->seq_num)) break;
    ro.start = {client::ReadStart::Kind::kSeqNum, next};
  }
  return 0;
}

int Tail(ClientCommandsState& s, Client& c) {
  auto tail = Reread(c, [&] { return c.CheckTail(s.name); });
  if (!tail.ok()) return Fail(s, tail.status());
  if (s.json_out) {
    PrintJson({{"seq_num", tail->seq_num}, {"timestamp", tail->timestamp}});
  } else {
    std::cout << tail->seq_num << "\n";
  }
  return 0;
}

void AddBenchHttp(CLI::App& bench, ClientCommandsState& s) {
  auto& b = s.bench;
  auto* cmd = bench.add_subcommand("http", "Closed-loop appends against a running weir serve");
  s.bench_http = cmd;
  cmd->add_option("--server", b.server, "weir server URL")->envname("WEIR_SERVER")->capture_default_str();
  cmd->add_option("--basin", b.basin, "Basin (default: the server's weir-default)")->envname("WEIR_BASIN");
  cmd->add_option("--auth-token", b.auth_token, "Bearer token")->envname("WEIR_AUTH_TOKEN");
  cmd->add_option("--clients", b.clients, "Concurrent clients, one append in flight each")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--record-bytes", b.record_bytes, "Record body size")->check(CLI::Range(1, (1 << 20) - 8))
      ->capture_default_str();
  cmd->add_option("--batch", b.batch, "Records per append")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--duration", b.duration_s, "Measured seconds")->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--warmup", b.warmup_s, "Warm-up seconds before measuring")->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  cmd->add_option("--streams", b.streams, "Streams, created if missing (default: one per client); client i appends to streams i, i + clients, ... in turn")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--stream-prefix", b.stream_prefix, "Stream names: PREFIX0, PREFIX1, ...")->capture_default_str();
  // As the other client commands take it; the result is a JSON line anyway.
  cmd->add_flag("--json", s.json_out, "Accepted for scripts; the final line is JSON either way");
}

// A parsed client command, with its output printed.
int RunClientCommand(ClientCommandsState& s, CLI::App* cmd);

}  // namespace

ClientCommands::ClientCommands(CLI::App& app, CLI::App& bench) : s_(std::make_unique<ClientCommandsState>()) {
  auto& s = *s_;
  Group(app, s, "basin", "Create, list and delete basins", &s.basin_create, &s.basin_list, &s.basin_delete);
  CLI::App* stream = Group(app, s, "stream", "Create, list, inspect and delete streams", &s.stream_create,
                           &s.stream_list, &s.stream_delete);
  s.stream_info = Leaf(stream, s, "info", "A stream's configuration and tail", "NAME");
  // On basin create, the same flags set the defaults of the basin's new
  // streams; a flag left out is left to the stream (then to weir's default).
  for (CLI::App* cmd : {s.stream_create, s.basin_create}) {
    const bool basin = cmd == s.basin_create;
    cmd->add_option("--storage-class", s.storage_class,
                    basin ? "New streams' storage class: standard or express"
                          : "standard or express (default: the basin's, else standard)")
        ->check(CLI::IsMember({"standard", "express"}));
    cmd->add_option("--retention", s.retention,
                    basin ? "New streams keep records this many seconds, or \"infinite\""
                          : "Keep records this many seconds, or \"infinite\" (default: the basin's, else 7 days)");
    cmd->add_option("--timestamping-mode", s.timestamping_mode,
                    basin ? "New streams' timestamping: client-prefer, client-require or arrival"
                          : "client-prefer, client-require or arrival (default: the basin's, else client-prefer)")
        ->check(CLI::IsMember({"client-prefer", "client-require", "arrival"}));
    cmd->add_option("--delete-on-empty-min-age", s.delete_on_empty_min_age,
                    basin ? "New streams are deleted once empty and idle for this many seconds"
                          : "Delete the stream once empty and idle for this many seconds (default: the basin's, "
                            "else never)")
        ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  }
  s.basin_create->add_flag("--create-stream-on-append", s.create_stream_on_append,
                           "An append to a missing stream creates it with the basin's defaults");
  s.basin_create->add_flag("--create-stream-on-read", s.create_stream_on_read,
                           "A read or tail of a missing stream creates it with the basin's defaults");

  s.append = Leaf(&app, s, "append", "Append stdin to a stream, one record per line; prints acks", "STREAM");
  s.append->add_flag("--producer", s.producer, "Idempotent: allocate a producer id so retries are deduplicated");
  s.append->add_option("--match-seq-num", s.match_seq_num, "The first record must land at this seq_num");
  s.append->add_option("--fencing-token", s.fencing_token, "Append only if the stream's fencing token is this");
  s.append->add_option("--linger-ms", s.linger_ms, "Wait this long for more lines before sending a batch")
      ->check(CLI::Range(0.0, 60000.0))->capture_default_str();
  s.append->add_option("--max-batch-records", s.max_batch_records, "Records per append at most")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  s.append
      ->add_option("--max-batch-bytes", s.max_batch_bytes,
                   "Metered bytes per append at most (a longer line is sent alone)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  s.append
      ->add_option("--input", s.input,
                   "text: each line is a record's body; json: each line is a record as `weir read --json` prints it "
                   "({\"body\", \"headers\": [[name, value]], \"timestamp\", \"encoding\": \"base64\"}; "
                   "seq_num ignored; command records skipped)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  s.read = Leaf(&app, s, "read", "Print a stream's records, one per line", "STREAM");
  auto* from = s.read->add_option("--from", s.from, "Start at this seq_num");
  auto* tail_offset = s.read->add_option("--tail-offset", s.tail_offset, "Start this many records before the tail");
  auto* ts = s.read->add_option("--timestamp", s.timestamp, "Start at the first record at or after this time (ms)");
  from->excludes(tail_offset)->excludes(ts);
  tail_offset->excludes(ts);
  s.read
      ->add_option("--count", s.count,
                   "Stop after this many records (as the server counts: command records, printed only with --json, "
                   "count too)")
      ->check([](const std::string& v) {
        return v == "0" ? std::string("must be at least 1 (leave --count out to read up to the tail)") : std::string();
      });
  s.read->add_flag("--follow,-f", s.follow, "Keep reading new records until interrupted (an SSE session)");

  s.tail = Leaf(&app, s, "tail", "Print the stream's next seq_num", "STREAM");
  AddBenchHttp(bench, s);
}

ClientCommands::~ClientCommands() = default;

std::optional<int> ClientCommands::Run() {
  auto& s = *s_;
  if (s.bench_http->parsed()) {
    Status st = bench::RunHttpBench(s.bench);
    if (!st.ok()) {
      std::cerr << "weir bench http: " << st.message() << "\n";
      return 1;
    }
    return 0;
  }
  CLI::App* cmds[] = {s.basin_create, s.basin_list, s.basin_delete, s.stream_create, s.stream_list,
                      s.stream_info,  s.stream_delete, s.append,     s.read,          s.tail};
  CLI::App* cmd = nullptr;
  for (CLI::App* c : cmds) {
    if (c->parsed()) cmd = c;
  }
  if (cmd == nullptr) return std::nullopt;
  const int rc = RunClientCommand(s, cmd);
  if (rc != 0) return rc;
  if (Status written = StdoutWritten(); !written.ok()) return Fail(s, written);
  return 0;
}

namespace {

int RunClientCommand(ClientCommandsState& s, CLI::App* cmd) {
  // Names and tokens travel in JSON strings: bytes that are not UTF-8 would
  // reach the server changed (to U+FFFD), naming something else.
  const std::string token = s.fencing_token.value_or("");
  for (const auto& [what, value] : {std::pair<const char*, const std::string*>{"the name", &s.name},
                                    {"--prefix", &s.prefix},
                                    {"--fencing-token", &token}}) {
    if (!IsValidUtf8(*value)) return Fail(s, InvalidArgument("{} is not valid UTF-8", what));
  }
  s.conn.timeout_ms = static_cast<int>(s.timeout_s * 1000);
  auto connected = Client::Connect(s.conn);
  if (!connected.ok()) return Fail(s, connected.status());
  Client& c = **connected;
  if (cmd == s.basin_create) {
    auto defaults = StreamConfigJson(s);
    if (!defaults.ok()) return Fail(s, defaults.status());
    json config = json::object();
    if (!defaults->empty()) config["default_stream_config"] = std::move(*defaults);
    if (s.create_stream_on_append) config["create_stream_on_append"] = true;
    if (s.create_stream_on_read) config["create_stream_on_read"] = true;
    const std::string body = config.empty() ? std::string() : config.dump();
    return PrintDone(s, RetryRefused(c, [&] { return c.CreateBasin(s.name, body); }), "basin", "created");
  }
  if (cmd == s.basin_list) {
    return PrintNamedPages(s, c, [&](const std::string& after, bool* more) {
      return c.ListBasinsPage(s.prefix, after, more);
    });
  }
  if (cmd == s.basin_delete) {
    return PrintDone(s, RetryRefused(c, [&] { return c.DeleteBasin(s.name); }), "basin", "deleted");
  }
  if (cmd == s.stream_create) {
    auto config = StreamConfigJson(s);
    if (!config.ok()) return Fail(s, config.status());
    const std::string body = config->empty() ? std::string() : config->dump();
    return PrintDone(s, RetryRefused(c, [&] { return c.CreateStream(s.name, body); }), "stream", "created");
  }
  if (cmd == s.stream_list) {
    return PrintNamedPages(s, c, [&](const std::string& after, bool* more) {
      return c.ListStreamsPage(s.prefix, after, more);
    });
  }
  if (cmd == s.stream_info) return StreamInfo(s, c);
  if (cmd == s.stream_delete) {
    return PrintDone(s, RetryRefused(c, [&] { return c.DeleteStream(s.name); }), "stream", "deleted");
  }
  if (cmd == s.append) return Append(s, c);
  if (cmd == s.read) return Read(s, c);
  return Tail(s, c);
}

}  // namespace

}  // namespace weir::cli
