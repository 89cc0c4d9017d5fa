// weir_kafka_bench: a Kafka producer load generator on Debian's librdkafka
// (the C API), for weir's Kafka listener or any broker.
//
// Produces fixed-size records to one topic as fast as librdkafka's local
// queue and the broker's acknowledgements allow: produce() is called until
// the queue is full (queue.buffering.max.messages), then the delivery reports
// free room. Records carry no key and go to the partitioner's pick
// (librdkafka's default spreads keyless records at random over partitions).
//
// --rate N offers N records/s instead (an open loop, as long as the queue
// has room), to measure latency below saturation.
//
// Measured window: [--warmup, --warmup + --duration) seconds after the start.
// Throughput counts successful delivery reports that arrive in the window;
// latency is from the produce() call to its delivery report, for records
// produced in the window (so it includes time queued in librdkafka). After the
// window the tool stops producing and flushes (bounded), then prints one JSON
// line on stdout:
//   {"records_per_s", "mb_per_s" (record values, 10^6 bytes), "p50_ms",
//    "p99_ms", "p999_ms", "max_ms", "mean_ms", "errors", "first_error", ...}
// and the parameters. "broker_rtt_p50_ms"/"broker_rtt_p99_ms" come from
// librdkafka's statistics: request round trips on the broker connection (the
// median of per-second p50s, the largest per-second p99), i.e. the broker's
// share of the latency without the time records wait in librdkafka (an
// idempotent librdkafka 2.0 producer keeps one request in flight per
// partition, so at load records wait for the previous request). Exit status 1 if nothing was acknowledged or librdkafka
// raised a fatal error.
//
// Usage (one command line):
//   weir_kafka_bench --brokers 127.0.0.1:9092 --topic bench --partitions 8
//     --record-bytes 1024 --duration 10 --linger-ms 5 --acks all [--no-idempotent]
//     [--compression none|gzip|snappy|lz4|zstd] [--set key=value ...]
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string brokers = "127.0.0.1:9092";
  std::string topic = "weir-bench";
  int partitions = 8;
  size_t record_bytes = 1024;
  double duration_s = 10;
  double warmup_s = 1;
  double linger_ms = 5;
  std::string acks = "all";
  bool idempotent = true;
  std::string compression = "none";
  int queue_messages = 100000;
  double rate = 0;  // records/s to offer; 0 = as fast as the queue allows
  double flush_timeout_s = 120;
  std::vector<std::string> set;  // extra librdkafka properties, key=value
};

struct Run {
  Clock::time_point t0;
  int64_t window_start_ns = 0;
  int64_t window_end_ns = 0;
  // Filled by the delivery report callback (served by rd_kafka_poll/flush
  // on the main thread only: no locking).
  std::vector<float> latency_ms;  // records produced in the window
  uint64_t acked_in_window = 0;
  uint64_t acked_total = 0;
  uint64_t errors = 0;
  std::string first_error;
  // Broker round trips from librdkafka's statistics (one window a second,
  // windows inside the measured one): per-window p50 and p99, in ms.
  std::vector<double> rtt_p50, rtt_p99;
  // One-second progress on a TTY.
  uint64_t acked_last = 0;
  int64_t progress_ns = 0;

  int64_t Now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  }
};

void OnDelivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  auto* run = static_cast<Run*>(opaque);
  const int64_t now = run->Now();
  if (m->err) {
    if (run->errors++ == 0) run->first_error = rd_kafka_err2str(m->err);
    return;
  }
  ++run->acked_total;
  if (now >= run->window_start_ns && now < run->window_end_ns) ++run->acked_in_window;
  const auto sent = static_cast<int64_t>(reinterpret_cast<uintptr_t>(m->_private));
  if (sent >= run->window_start_ns && sent < run->window_end_ns) {
    run->latency_ms.push_back(static_cast<float>(static_cast<double>(now - sent) / 1e6));
  }
}

// librdkafka's statistics JSON: brokers.<name>.rtt holds the window's
// request round-trip percentiles in microseconds (Produce requests here).
int OnStats(rd_kafka_t*, char* json, size_t len, void* opaque) {
  auto* run = static_cast<Run*>(opaque);
  const int64_t now = run->Now();
  if (now <= run->window_start_ns + 1'000'000'000 || now > run->window_end_ns) return 0;
  auto doc = nlohmann::json::parse(json, json + len, nullptr, false);
  if (doc.is_discarded() || !doc.contains("brokers")) return 0;
  for (const auto& [name, b] : doc["brokers"].items()) {
    if (b.value("nodeid", -1) < 0 || !b.contains("rtt")) continue;  // bootstrap entries
    const auto& rtt = b["rtt"];
    if (rtt.value("cnt", 0) == 0) continue;
    run->rtt_p50.push_back(rtt.value("p50", 0) / 1000.0);
    run->rtt_p99.push_back(rtt.value("p99", 0) / 1000.0);
  }
  return 0;  // librdkafka frees json
}

void OnError(rd_kafka_t*, int err, const char* reason, void* opaque) {
  auto* run = static_cast<Run*>(opaque);
  // Transport errors are retried by librdkafka; count only what is fatal.
  if (err == RD_KAFKA_RESP_ERR__FATAL) {
    if (run->errors++ == 0) run->first_error = std::string("fatal: ") + reason;
  }
  std::fprintf(stderr, "weir_kafka_bench: librdkafka: %s: %s\n",
               rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(err)), reason);
}

bool Set(rd_kafka_conf_t* conf, const std::string& key, const std::string& value) {
  char err[512];
  if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
    std::fprintf(stderr, "weir_kafka_bench: %s=%s: %s\n", key.c_str(), value.c_str(), err);
    return false;
  }
  return true;
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

// JSON string literal (the error texts are ASCII; escape the few specials).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Creates the topic with `partitions` partitions unless it exists. Failure
// is not fatal: the broker may create it on first use (auto-creation).
void CreateTopic(rd_kafka_t* rk, const Options& o) {
  char err[512];
  rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(o.topic.c_str(), o.partitions, 1, err, sizeof err);
  if (!nt) {
    std::fprintf(stderr, "weir_kafka_bench: topic %s: %s\n", o.topic.c_str(), err);
    return;
  }
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
  rd_kafka_AdminOptions_t* ao = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
  rd_kafka_AdminOptions_set_operation_timeout(ao, 30000, err, sizeof err);
  rd_kafka_AdminOptions_set_request_timeout(ao, 60000, err, sizeof err);
  rd_kafka_CreateTopics(rk, &nt, 1, ao, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 90000);
  if (!ev) {
    std::fprintf(stderr, "weir_kafka_bench: CreateTopics: no answer; relying on auto-creation\n");
  } else if (rd_kafka_event_error(ev)) {
    std::fprintf(stderr, "weir_kafka_bench: CreateTopics: %s; relying on auto-creation\n",
                 rd_kafka_event_error_string(ev));
  } else {
    size_t n = 0;
    const rd_kafka_topic_result_t** res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    for (size_t i = 0; i < n; ++i) {
      rd_kafka_resp_err_t e = rd_kafka_topic_result_error(res[i]);
      if (e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
        std::fprintf(stderr, "weir_kafka_bench: topic %s exists\n", o.topic.c_str());
      } else if (e) {
        std::fprintf(stderr, "weir_kafka_bench: CreateTopics %s: %s\n", o.topic.c_str(),
                     rd_kafka_topic_result_error_string(res[i]));
      }
    }
  }
  if (ev) rd_kafka_event_destroy(ev);
  rd_kafka_AdminOptions_destroy(ao);
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(nt);
}

double Percentile(std::vector<float>& v, double q) {
  if (v.empty()) return 0;
  auto k = static_cast<size_t>(std::min<double>(static_cast<double>(v.size()) - 1,
                                                std::ceil(q * static_cast<double>(v.size())) - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Kafka producer load generator (librdkafka): one JSON line of throughput and latency"};
  // A flag given twice takes the last value (scripts put defaults first).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--brokers", o.brokers, "Bootstrap brokers HOST:PORT[,...]")->capture_default_str();
  app.add_option("--topic", o.topic, "Topic to produce to")->capture_default_str();
  app.add_option("--partitions", o.partitions, "Partitions of the topic if this tool creates it")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--record-bytes", o.record_bytes, "Value size of each record")
      ->check(CLI::Range(size_t{1}, size_t{64} << 20))
      ->capture_default_str();
  app.add_option("--duration", o.duration_s, "Measured seconds")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", o.warmup_s, "Seconds before the measured window")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--linger-ms", o.linger_ms, "librdkafka linger.ms")->capture_default_str();
  app.add_option("--acks", o.acks, "acks: all, 1 or 0")->check(CLI::IsMember({"all", "-1", "1", "0"}))
      ->capture_default_str();
  app.add_flag("--idempotent,!--no-idempotent", o.idempotent, "enable.idempotence (default on)");
  app.add_option("--compression", o.compression, "none, gzip, snappy, lz4 or zstd")
      ->check(CLI::IsMember({"none", "gzip", "snappy", "lz4", "zstd"}))
      ->capture_default_str();
  app.add_option("--queue-messages", o.queue_messages,
                 "librdkafka queue.buffering.max.messages: records produced and not yet acknowledged")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  app.add_option("--rate", o.rate,
                 "Offered load in records/s (0: as fast as the queue allows); below saturation the "
                 "latency is the broker's, not time queued in librdkafka")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--flush-timeout", o.flush_timeout_s, "Seconds to wait for outstanding records at the end")
      ->capture_default_str();
  app.add_option("--set", o.set, "Extra librdkafka property key=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  CLI11_PARSE(app, argc, argv);

  Run run;
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  bool ok = Set(conf, "bootstrap.servers", o.brokers) && Set(conf, "acks", o.acks) &&
            Set(conf, "enable.idempotence", o.idempotent ? "true" : "false") &&
            Set(conf, "linger.ms", Num(o.linger_ms)) && Set(conf, "compression.codec", o.compression) &&
            Set(conf, "queue.buffering.max.messages", std::to_string(o.queue_messages)) &&
            Set(conf, "queue.buffering.max.kbytes", "2097151") && Set(conf, "message.timeout.ms", "120000") &&
            Set(conf, "socket.timeout.ms", "60000") && Set(conf, "statistics.interval.ms", "1000") && Set(conf, "message.max.bytes", std::to_string(std::max<size_t>(
                                                                                           1000000, o.record_bytes + 4096)));
  for (const auto& kv : o.set) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "weir_kafka_bench: --set %s: expected key=value\n", kv.c_str());
      return 2;
    }
    ok = ok && Set(conf, kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (!ok) return 2;
  rd_kafka_conf_set_dr_msg_cb(conf, OnDelivery);
  rd_kafka_conf_set_error_cb(conf, OnError);
  rd_kafka_conf_set_stats_cb(conf, OnStats);
  rd_kafka_conf_set_opaque(conf, &run);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!rk) {
    std::fprintf(stderr, "weir_kafka_bench: %s\n", err);
    return 2;
  }
  // Fail fast when no broker answers (librdkafka would retry for minutes).
  const rd_kafka_metadata_t* md = nullptr;
  if (rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, nullptr, &md, 30000); e) {
    std::fprintf(stderr, "weir_kafka_bench: no metadata from %s: %s\n", o.brokers.c_str(), rd_kafka_err2str(e));
    rd_kafka_destroy(rk);
    return 1;
  }
  rd_kafka_metadata_destroy(md);
  CreateTopic(rk, o);

  // Distinct values (random letters), used in rotation; librdkafka sends
  // them from here without copying (they outlive the producer).
  constexpr size_t kValues = 256;
  std::vector<std::string> values(kValues);
  std::mt19937_64 rng(42);
  for (auto& v : values) {
    v.resize(o.record_bytes);
    for (auto& c : v) c = static_cast<char>('a' + rng() % 26);
  }

  const bool tty = isatty(STDERR_FILENO);
  run.t0 = Clock::now();
  run.window_start_ns = static_cast<int64_t>(o.warmup_s * 1e9);
  run.window_end_ns = run.window_start_ns + static_cast<int64_t>(o.duration_s * 1e9);
  run.latency_ms.reserve(1 << 20);
  uint64_t produced = 0;
  int64_t now = 0;
  bool fatal = false;
  while ((now = run.Now()) < run.window_end_ns) {
    if (o.rate > 0 && static_cast<double>(produced) >= o.rate * static_cast<double>(now) / 1e9) {
      rd_kafka_poll(rk, 1);  // ahead of the offered load: serve reports, wait
      continue;
    }
    const std::string& v = values[produced % kValues];
    rd_kafka_resp_err_t e =
        rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(o.topic.c_str()), RD_KAFKA_V_VALUE(const_cast<char*>(v.data()), v.size()),
                          RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(static_cast<uintptr_t>(now))), RD_KAFKA_V_END);
    if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      rd_kafka_poll(rk, 1);  // wait for delivery reports to make room
    } else if (e) {
      if (run.errors++ == 0) run.first_error = rd_kafka_err2str(e);
      if (e == RD_KAFKA_RESP_ERR__FATAL) {
        fatal = true;
        break;
      }
      rd_kafka_poll(rk, 10);
    } else {
      ++produced;
      rd_kafka_poll(rk, 0);
    }
    if (tty && now - run.progress_ns >= 1'000'000'000) {
      std::fprintf(stderr, "\r%5.1f s  %10" PRIu64 " acked  %8.0f records/s  in flight %d   ", now / 1e9,
                   run.acked_total, static_cast<double>(run.acked_total - run.acked_last) * 1e9 /
                                        static_cast<double>(std::max<int64_t>(1, now - run.progress_ns)),
                   rd_kafka_outq_len(rk));
      run.acked_last = run.acked_total;
      run.progress_ns = now;
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  rd_kafka_resp_err_t fe = rd_kafka_flush(rk, static_cast<int>(o.flush_timeout_s * 1000));
  const int left = rd_kafka_outq_len(rk);
  if (fe) std::fprintf(stderr, "weir_kafka_bench: flush: %s (%d records outstanding)\n", rd_kafka_err2str(fe), left);
  if (rd_kafka_fatal_error(rk, err, sizeof err)) {
    fatal = true;
    if (run.first_error.empty()) run.first_error = err;
  }
  rd_kafka_destroy(rk);

  std::vector<float>& lat = run.latency_ms;
  double mean = 0, max = 0;
  for (float x : lat) {
    mean += x;
    max = std::max<double>(max, x);
  }
  if (!lat.empty()) mean /= static_cast<double>(lat.size());
  const double rps = static_cast<double>(run.acked_in_window) / o.duration_s;
  // Broker round trips: the median of the per-second p50s, the largest p99.
  std::sort(run.rtt_p50.begin(), run.rtt_p50.end());
  const double rtt_p50 = run.rtt_p50.empty() ? 0 : run.rtt_p50[run.rtt_p50.size() / 2];
  const double rtt_p99 = run.rtt_p99.empty() ? 0 : *std::max_element(run.rtt_p99.begin(), run.rtt_p99.end());
  const double p50 = Percentile(lat, 0.50), p99 = Percentile(lat, 0.99), p999 = Percentile(lat, 0.999);
  std::printf(
      "{\"records_per_s\":%s,\"mb_per_s\":%s,\"p50_ms\":%s,\"p99_ms\":%s,\"p999_ms\":%s,\"max_ms\":%s,"
      "\"mean_ms\":%s,\"broker_rtt_p50_ms\":%s,\"broker_rtt_p99_ms\":%s,\"errors\":%" PRIu64 ",\"first_error\":%s,\"acked\":%" PRIu64 ",\"produced\":%" PRIu64
      ",\"unflushed\":%d,\"record_bytes\":%zu,\"duration_s\":%s,\"linger_ms\":%s,\"acks\":%s,"
      "\"idempotent\":%s,\"compression\":%s,\"partitions\":%d,\"queue_messages\":%d,\"rate\":%s,"
      "\"topic\":%s}\n",
      Num(rps).c_str(), Num(rps * static_cast<double>(o.record_bytes) / 1e6).c_str(), Num(p50).c_str(),
      Num(p99).c_str(), Num(p999).c_str(), Num(max).c_str(), Num(mean).c_str(), Num(rtt_p50).c_str(), Num(rtt_p99).c_str(), run.errors,
      run.first_error.empty() ? "null" : Quote(run.first_error).c_str(), run.acked_total, produced, left,
      o.record_bytes, Num(o.duration_s).c_str(), Num(o.linger_ms).c_str(), Quote(o.acks).c_str(),
      o.idempotent ? "true" : "false", Quote(o.compression).c_str(), o.partitions, o.queue_messages,
      Num(o.rate).c_str(), Quote(o.topic).c_str());
  std::fflush(stdout);
  return (fatal || run.acked_total == 0) ? 1 : 0;
}
