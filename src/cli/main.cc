// The weir command line: `weir serve`, `weir bench ...`, `weir --version`.
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <iostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/engine_bench.h"
#include "bench/s3_bench.h"
#include "bench/wal_bench.h"
#include "cli/client_commands.h"
#include "cli/strict_numbers.h"
#include "server/serve.h"

namespace {

// A string flag's WEIR_NAME set to "": CLI11 skips empty environment values,
// but "" means something for some flags (--kafka-addr "" turns Kafka off;
// --object-store "" is the embedded default).
struct EmptyEnv {
  CLI::Option* option;
  std::string* value;
  std::string env;
};

// After parsing: each such flag not on the command line whose WEIR_NAME is
// set but empty takes "", as the flag itself would.
void ApplyEmptyEnv(const std::vector<EmptyEnv>& flags) {
  for (const EmptyEnv& f : flags) {
    const char* v = std::getenv(f.env.c_str());
    if (v != nullptr && *v == '\0' && f.option->count() == 0) f.value->clear();
  }
}

// CLI11 (2.1) reads every subcommand's environment variables and runs every
// subcommand's option callbacks, parsed or not, so a WEIR_BASIN meant for one
// command overwrote the --basin given to another (the client commands share
// their flags' variables), and a bad WEIR_PIPELINE_WINDOW failed
// `weir stream list`. A subcommand with a parse-complete callback has both
// done at the end of its own parse instead: only the command run reads them.
void ScopeEnvToTheCommandRun(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (!sub->get_name().empty()) sub->parse_complete_callback([] {});
    ScopeEnvToTheCommandRun(*sub);
  }
}

// Registers `weir serve` and its flags; each flag NAME also reads WEIR_NAME.
CLI::App* AddServe(CLI::App& app, weir::server::ServeOptions& o, std::vector<EmptyEnv>* empty_env) {
  auto* cmd = app.add_subcommand(
      "serve", "Run a weir node: the S2-compatible HTTP API, the Kafka listener and Arrow Flight over the WAL");
  auto opt = [&](const std::string& flag, auto& value, const std::string& help) {
    std::string env = "WEIR_";
    for (char c : flag.substr(2)) env += c == '-' ? '_' : static_cast<char>(std::toupper(c));
    CLI::Option* option = cmd->add_option(flag, value, help)->envname(env)->capture_default_str();
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::string>) {
      // Only where "" means something; elsewhere a blank variable still
      // leaves the default, as CLI11 does.
      static const std::set<std::string, std::less<>> kEmptyMeans = {
          "--kafka-addr", "--kafka-advertised-addr", "--auth-token-file", "--object-store", "--metastore"};
      if (kEmptyMeans.count(flag)) empty_env->push_back(EmptyEnv{option, &value, env});
    }
    return option;
  };
  opt("--data-dir", o.data_dir, "Data directory (embedded default: DIR/objects and DIR/meta.db)");
  opt("--http-addr", o.http_addr, "HTTP listen address HOST:PORT (port 0 picks a free one)");
  opt("--object-store", o.object_store,
      "Object store URI (file://DIR, s3://BUCKET/PREFIX?..., mem://); default file://DATA_DIR/objects");
  opt("--metastore", o.metastore,
      "Metastore URI (sqlite://PATH, sqlite://:memory:, postgres://USER@HOST:PORT/DB); default "
      "sqlite://DATA_DIR/meta.db (:memory: with mem://)");
  opt("--node-id", o.node_id, "This node's id in the WAL and metastore");
  opt("--wal-store", o.wal_stores,
      "WAL store URI (an object store, or postgres://...), repeatable: none = the object store; two or more = "
      "the express class, a quorum of them")
      ->expected(1)
      ->take_all();
  opt("--wal-quorum", o.wal_quorum, "Express class: WAL copies that make a slot durable (0 = a majority)")
      ->check(CLI::Range(0, 32));
  cmd->add_flag("--allow-unconditional-put", o.allow_unconditional_put,
                "s3:// only: start even if the store ignores If-None-Match: * (unsafe with several nodes)")
      ->envname("WEIR_ALLOW_UNCONDITIONAL_PUT");
  opt("--pipeline-window", o.pipeline_window, "WAL slots in flight")->check(CLI::Range(1, 1024));
  opt("--max-slot-bytes", o.max_slot_bytes, "WAL slot size cap in bytes")->check(CLI::Range(4096, 1 << 30));
  opt("--linger-ms", o.linger_ms, "WAL linger: wait this long for more data before cutting a slot")
      ->check(CLI::Range(0.0, 10000.0));
  opt("--linger-put-percent", o.linger_put_percent,
      "WAL linger: at least this percent of the PUT latency, that share capped at 20 ms (0 turns it off)")
      ->check(CLI::Range(0.0, 100.0));
  opt("--pool-budget-mib", o.pool_budget_mib, "Admitted, unacknowledged bytes (MiB) before appends wait")
      ->check(CLI::Range(1, 1 << 20));
  opt("--log-cache-mib", o.log_cache_mib,
      "Memory (MiB) for acknowledged, unsettled records; settle starts early when a quarter is used")
      ->check(CLI::Range(1, 1 << 20));
  opt("--max-unsettled-mib", o.max_unsettled_mib,
      "Acknowledged MiB not yet settled beyond which appends wait, then fail with 429 (settle is behind)")
      ->check(CLI::Range(1, 1 << 30));
  opt("--max-streams", o.max_streams,
      "Streams this server holds at most (table buckets and Kafka partitions count); creates past it get 403 "
      "quota_exhausted (Kafka: POLICY_VIOLATION)")
      ->check(CLI::Range(1, 100'000'000));
  opt("--max-basins", o.max_basins,
      "Basins the metastore holds at most (all nodes'); clients' creates past it get 403 quota_exhausted (the "
      "server's own, the default basin and Kafka's, are made whatever the count)")
      ->check(CLI::Range(1, 100'000'000));
  opt("--settle-min-kib", o.settle_min_kib,
      "A stream's records settle into a segment once it holds this many KiB, or the oldest is "
      "--settle-max-delay-s old, or memory needs them (0: every stream every second)")
      ->check(CLI::Range(0, 1 << 20));
  opt("--settle-max-delay-s", o.settle_max_delay_s,
      "Longest a record waits to settle (a start replays the WAL from the oldest record waiting)")
      ->check(CLI::Range(0.0, 3600.0));
  opt("--retention-interval-s", o.retention_interval_s,
      "How often expired or trimmed segments, and streams due for delete_on_empty, are deleted")
      ->check(CLI::Range(0.1, 86400.0));
  opt("--drain-timeout-s", o.drain_timeout_s,
      "After SIGTERM, how long requests in flight get to finish before the WAL closes (what is still open is "
      "then acknowledged or failed) and connections are closed")
      ->check(CLI::Range(0.0, 86400.0));
  opt("--wal-close-timeout-s", o.wal_close_timeout_s,
      "At a stop, how long the WAL waits for appends still open to become durable before it fails them "
      "(unavailable: they may still land)")
      ->check(CLI::Range(1.0, 86400.0));
  opt("--admission-timeout-ms", o.admission_timeout_ms, "How long an append waits for pool budget before 429")
      ->check(CLI::Range(0.0, 600000.0));
  opt("--auth-token-file", o.auth_token_file, "Require Authorization: Bearer <token in this file>");
  opt("--max-request-bytes", o.max_request_bytes, "Largest accepted request body")->check(CLI::Range(1024, 1 << 30));
  opt("--http-threads", o.http_threads, "Network I/O threads")->check(CLI::Range(1, 64));
  opt("--worker-threads", o.worker_threads, "Request handler threads")->check(CLI::Range(1, 256));
  opt("--http-max-in-flight-mib", o.http_max_in_flight_mib,
      "Memory (MiB) for HTTP request bodies read and not yet answered, all connections; more wait unread")
      ->check(CLI::Range(1, 1 << 20));
  opt("--http-max-unwritten-mib", o.http_max_unwritten_mib,
      "Memory (MiB) for HTTP responses queued and not yet written, all connections (each at most a sixteenth, at "
      "least 1 MiB); a read takes at most half of what is left, or waits")
      ->check(CLI::Range(1, 1 << 20));
  opt("--http-max-connections", o.http_max_connections, "Open HTTP connections; more are closed on accept")
      ->check(CLI::Range(1, 1 << 20));
  opt("--http-stall-timeout-s", o.http_stall_timeout_s,
      "A request body not whole this long after its head, or a response write stuck as long, ends its "
      "connection (HTTP/2: resets the stream, for a body)")
      ->check(CLI::Range(1.0, 86400.0));
  opt("--kafka-addr", o.kafka_addr, "Kafka listen address HOST:PORT (port 0 picks a free one; \"\" turns it off)");
  opt("--kafka-advertised-addr", o.kafka_advertised_addr,
      "Kafka address given to clients in metadata (default: --kafka-addr as given, with the port bound for 0)");
  opt("--kafka-auto-create-partitions", o.kafka_auto_create_partitions,
      "Partitions of a topic created on first use, and of CreateTopics asking for the default (Kafka's "
      "num.partitions; 0: no auto-creation, and CreateTopics' default is 1)")
      ->check(CLI::Range(0, 10000));
  opt("--kafka-max-request-bytes", o.kafka_max_request_bytes, "Largest accepted Kafka request")
      ->check(CLI::Range(1024, 1 << 30));
  opt("--kafka-max-in-flight-mib", o.kafka_max_in_flight_mib,
      "Memory (MiB) for Kafka requests read and not yet answered, all connections; more wait unread")
      ->check(CLI::Range(1, 1 << 20));
  opt("--kafka-max-unwritten-mib", o.kafka_max_unwritten_mib,
      "Memory (MiB) for Kafka responses not yet read by their clients, all connections; fetches shrink past it")
      ->check(CLI::Range(4, 1 << 20));
  opt("--kafka-max-connections", o.kafka_max_connections, "Open Kafka connections; more are closed on accept")
      ->check(CLI::Range(1, 1 << 20));
  opt("--kafka-stall-timeout-s", o.kafka_stall_timeout_s,
      "A Kafka request body not whole this long after its size, or responses not read for as long, ends the "
      "connection")
      ->check(CLI::Range(1.0, 86400.0));
  opt("--flight-addr", o.flight_addr,
      "Arrow Flight (gRPC) listen address HOST:PORT: DoPut into log tables, DoGet out of them (port 0 picks a "
      "free one; \"\", the default, turns it off)");
  opt("--flight-max-message-mib", o.flight_max_message_mib,
      "Largest accepted Flight message (an Arrow batch with its header), in MiB")
      ->check(CLI::Range(1, 1024));
  opt("--flight-max-put-calls", o.flight_max_put_calls,
      "Flight DoPut calls open at once (each holds at most one message undecoded); more are refused")
      ->check(CLI::Range(1, 1 << 20));
  opt("--flight-max-get-calls", o.flight_max_get_calls,
      "Flight DoGet calls open at once (each may hold a message of about 1 MiB its client has not taken); more "
      "are refused")
      ->check(CLI::Range(1, 1 << 20));
  opt("--flight-max-info-calls", o.flight_max_info_calls,
      "Flight GetFlightInfo, GetSchema, PollFlightInfo, ListFlights, ListActions and DoAction calls open at once "
      "(each holds its request and answer until the client takes it); more are refused")
      ->check(CLI::Range(1, 1 << 20));
  // Checked by RunServe: CLI11's split would drop an empty piece ("50,").
  opt("--inject-put-latency-ms", o.inject_put_latency_ms, "Test/bench: object store PUT latency P50[,P99] in ms");
  opt("--inject-put-error-rate", o.inject_put_error_rate, "Test/bench: fraction of PUTs that fail")
      ->check(CLI::Range(0.0, 1.0));
  opt("--inject-put-ambiguous-rate", o.inject_put_ambiguous_rate,
      "Test/bench: fraction of PUTs applied but reported as timed out")
      ->check(CLI::Range(0.0, 1.0));
  return cmd;
}

// The client commands' connection flags given before the command
// (`weir --server URL stream list`, `weir stream --json list`) go after it,
// where the command defines them: CLI11 takes an option only after the
// command that has it. Only those flags, and only ahead of the first other
// word or between a command group (basin, stream, bench) and its command; the
// rest is left in place (a flag that fits no command is still an error).
std::vector<char*> ConnectionFlagsAfterTheCommand(int argc, char** argv) {
  static const std::set<std::string, std::less<>> kValued = {"--server", "--basin", "--auth-token", "--timeout"};
  static const std::set<std::string, std::less<>> kGroups = {"basin", "stream", "bench"};
  std::vector<char*> moved;
  std::vector<char*> words{argv[0]};
  int i = 1;
  // Moves the connection flags at argv[i...] into `moved`.
  auto move_flags = [&] {
    while (i < argc) {
      const std::string_view arg = argv[i];
      const std::string_view name = arg.substr(0, arg.find('='));
      if (arg == "--json" || (name != arg && kValued.count(name) != 0)) {
        moved.push_back(argv[i++]);
      } else if (kValued.count(arg) != 0 && i + 1 < argc) {
        moved.push_back(argv[i++]);
        moved.push_back(argv[i++]);
      } else {
        break;
      }
    }
  };
  move_flags();
  if (i < argc && kGroups.count(std::string_view(argv[i])) != 0) {
    words.push_back(argv[i++]);
    move_flags();
  }
  // Ahead of a `--`, after which every word is an argument.
  char** rest_end = std::find_if(argv + i, argv + argc, [](const char* a) { return std::string_view(a) == "--"; });
  std::vector<char*> out = std::move(words);
  out.insert(out.end(), argv + i, rest_end);
  out.insert(out.end(), moved.begin(), moved.end());
  out.insert(out.end(), rest_end, argv + argc);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Slot-sized buffers (up to 8 MiB) come from the heap and freed memory stays
  // mapped for reuse, instead of an mmap/munmap and page faults per slot.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  CLI::App app{"weir: an object-storage-native stream and table store"};
  app.set_version_flag("--version", std::string("weir ") + WEIR_VERSION);
  app.require_subcommand(1);

  weir::server::ServeOptions serve;
  std::vector<EmptyEnv> empty_env;
  auto* serve_cmd = AddServe(app, serve, &empty_env);

  auto* bench = app.add_subcommand("bench", "Run a benchmark and print one JSON line");
  bench->require_subcommand(1);
  weir::bench::WalBenchOptions wal;
  auto* wal_cmd = bench->add_subcommand("wal", "Drive the WAL writer with concurrent appenders");
  wal_cmd->add_option("--store", wal.store, "Object store: mem, file, or a URI (s3://BUCKET/PREFIX?endpoint=...)");
  wal_cmd->add_option("--dir", wal.dir, "Directory for --store file (default: a temp dir, removed after)");
  wal_cmd->add_option("--put-latency-ms", wal.put_latency_ms, "Injected fixed PUT latency in ms")
      ->check(CLI::Range(0.0, 60000.0));
  wal_cmd->add_option("--appenders", wal.appenders, "Concurrent appenders")->check(CLI::Range(1, 4096));
  wal_cmd->add_option("--inflight", wal.inflight, "Unacknowledged appends per appender")
      ->check(CLI::Range(1, 100000));
  wal_cmd->add_option("--threads", wal.threads, "Driver threads the appenders are multiplexed over")
      ->check(CLI::Range(1, 256));
  wal_cmd->add_option("--streams", wal.streams, "Distinct streams (default: one per appender)")
      ->check(CLI::Range(0, 1000000));
  wal_cmd->add_option("--record-bytes", wal.record_bytes, "Record value size in bytes")
      ->check(CLI::Range(1, 4 << 20));
  wal_cmd->add_option("--duration", wal.duration_s, "Measured seconds")->check(CLI::Range(0.1, 3600.0));
  wal_cmd->add_option("--warmup", wal.warmup_s, "Warm-up seconds before measuring")->check(CLI::Range(0.0, 600.0));
  wal_cmd->add_option("--linger-ms", wal.linger_ms, "WAL linger in ms")->check(CLI::Range(0.0, 10000.0));
  wal_cmd->add_option("--window", wal.window, "Slots in flight")->check(CLI::Range(1, 1024));
  wal_cmd->add_option("--slot-cap-bytes", wal.slot_cap_bytes, "Slot size cap");
  wal_cmd->add_option("--budget-bytes", wal.budget_bytes, "Pool memory budget");

  weir::bench::EngineBenchOptions eng;
  auto* eng_cmd = bench->add_subcommand("engine", "Sustained appends through the stream engine: metastore ops, cache reads");
  eng_cmd->add_option("--streams", eng.streams, "Streams")->check(CLI::Range(1, 100000));
  eng_cmd->add_option("--appenders", eng.appenders, "Appending threads")->check(CLI::Range(1, 1024));
  eng_cmd->add_option("--record-bytes", eng.record_bytes, "Record size")->check(CLI::Range(1, 1 << 20));
  eng_cmd->add_option("--batch", eng.batch, "Records per append")->check(CLI::Range(1, 1000));
  eng_cmd->add_option("--duration", eng.duration_s, "Measured seconds")->check(CLI::Range(0.1, 3600.0));
  eng_cmd->add_option("--put-latency-ms", eng.put_latency_ms, "Injected PUT latency")->check(CLI::Range(0.0, 60000.0));
  eng_cmd->add_option("--rate", eng.rate, "Appends per second in all, paced (0: each appender as fast as acks come)")
      ->check(CLI::Range(0.0, 1e7));
  eng_cmd->add_option("--settle-min-kib", eng.settle_min_kib, "As weir serve's")->check(CLI::Range(0, 1 << 20));
  eng_cmd->add_option("--settle-max-delay-s", eng.settle_max_delay_s, "As weir serve's")
      ->check(CLI::Range(0.0, 3600.0));

  weir::bench::RecoveryBenchOptions rec;
  auto* rec_cmd = bench->add_subcommand("recovery", "Time to recover N MiB of unsettled WAL");
  rec_cmd->add_option("--unsettled-mib", rec.unsettled_mib, "Unsettled WAL payload in MiB")->check(CLI::Range(1, 65536));
  rec_cmd->add_option("--get-latency-ms", rec.get_latency_ms, "Injected GET latency during recovery")
      ->check(CLI::Range(0.0, 60000.0));
  rec_cmd->add_option("--record-bytes", rec.record_bytes, "Record size")->check(CLI::Range(1, 1 << 20));
  rec_cmd->add_option("--batch", rec.batch, "Records per append")->check(CLI::Range(1, 1000));

  weir::bench::S3BenchOptions s3b;
  auto* s3_cmd = bench->add_subcommand("s3", "Object store PUT MB/s at several concurrencies, ranged GETs/s");
  s3_cmd->add_option("--object-store", s3b.store, "Object store URI, e.g. s3://BUCKET/PREFIX?endpoint=URL")->required();
  s3_cmd->add_option("--object-bytes", s3b.object_bytes, "PUT object size")->check(CLI::Range(1, 1 << 30));
  s3_cmd->add_option("--inflight", s3b.inflight, "PUT concurrency levels")->delimiter(',');
  s3_cmd->add_option("--step-seconds", s3b.step_s, "Seconds per PUT level")->check(CLI::Range(0.1, 3600.0));
  s3_cmd->add_option("--range-bytes", s3b.range_bytes, "Ranged GET size")->check(CLI::Range(1, 1 << 30));
  s3_cmd->add_option("--range-inflight", s3b.range_inflight, "Concurrent ranged GETs")->check(CLI::Range(1, 1024));
  s3_cmd->add_option("--range-seconds", s3b.range_s, "Seconds of ranged GETs")->check(CLI::Range(0.1, 3600.0));

  weir::cli::ClientCommands client(app, *bench);  // basin, stream, append, read, tail, bench http
  weir::cli::MakeNumbersStrict(app);
  ScopeEnvToTheCommandRun(app);
  app.footer(
      "Client commands (basin, stream, append, read, tail, bench http) take --server URL, --basin NAME, "
      "--auth-token TOKEN, --timeout S and --json before or after the command (or WEIR_SERVER, WEIR_BASIN, "
      "WEIR_AUTH_TOKEN, WEIR_TIMEOUT; bench http takes all but --timeout); "
      "`weir COMMAND --help` lists a command's own flags.");
  std::vector<char*> args = ConnectionFlagsAfterTheCommand(argc, argv);
  // A first word that is no command is named (CLI11 would only say that a
  // command is required).
  if (args.size() > 1 && args[1][0] != '-') {
    const std::string first = args[1];
    const auto commands = app.get_subcommands([](CLI::App*) { return true; });
    if (std::none_of(commands.begin(), commands.end(), [&](CLI::App* c) { return c->check_name(first); })) {
      std::cerr << "weir: unknown command \"" << first << "\" (see weir --help)\n";
      return 1;
    }
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // one line and exit 1, like every other error
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::cerr << "weir: " << what << " (see weir --help)\n";
    return 1;
  }
  if (auto rc = client.Run()) return *rc;

  if (serve_cmd->parsed()) {
    ApplyEmptyEnv(empty_env);
    return weir::server::RunServe(serve);
  }

  weir::Status st;
  std::string what;
  if (wal_cmd->parsed()) {
    what = "wal";
    st = weir::bench::RunWalBench(wal);
  } else if (eng_cmd->parsed()) {
    what = "engine";
    st = weir::bench::RunEngineBench(eng);
  } else if (rec_cmd->parsed()) {
    what = "recovery";
    st = weir::bench::RunRecoveryBench(rec);
  } else if (s3_cmd->parsed()) {
    what = "s3";
    st = weir::bench::RunS3Bench(s3b);
  }
  if (!st.ok()) {
    std::cerr << "weir bench " << what << ": " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}
