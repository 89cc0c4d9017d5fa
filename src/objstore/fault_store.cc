// FaultStore: seeded fault and latency injection in front of any ObjectStore.
#include "objstore/fault_store.h"

#include <cassert>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numbers>
#include <random>
#include <thread>

#include "objstore/internal.h"

namespace weir::objstore {

namespace {

// z such that P(N(0,1) <= z) = 0.99: a log-normal's p99 is exp(mu + sigma * z).
constexpr double kZ99 = 2.3263478740408408;

// Uniform in [0, 1) from the top 53 bits: the same stream on every platform.
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// One latency sample in ms from two uniforms (always both consumed, so the
// PRNG stream does not depend on the distribution chosen).
double SampleLatencyMs(const LatencySpec& spec, double u1, double u2) {
  if (spec.p50_ms <= 0) return 0;
  if (spec.p99_ms <= spec.p50_ms) return spec.p50_ms;
  const double mu = std::log(spec.p50_ms);
  const double sigma = (std::log(spec.p99_ms) - mu) / kZ99;
  // Box-Muller; 1 - u1 is in (0, 1], so the log is finite.
  const double z = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
  return std::exp(mu + sigma * z);
}

void SleepMs(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(std::llround(ms * 1e6)));
}

enum class PutFault { kNone, kError, kTimeout, kAmbiguous };

}  // namespace

// The PRNG and options, guarded by mu. Draws happen under mu; sleeps and calls
// to the inner store happen outside it.
struct FaultStore::Impl {
  std::mutex mu;
  FaultOptions options;
  std::mt19937_64 rng;

  explicit Impl(const FaultOptions& o) : options(o), rng(o.seed) {}

  struct PutDraw {
    PutFault fault;
    double latency_ms;
  };
  struct GetDraw {
    bool error;
    double latency_ms;
  };

  // Each draw consumes exactly three PRNG outputs: the decision, then two for
  // latency. Returns them with the options they apply to, read under mu.
  struct Uniforms {
    double decision, u1, u2;
    FaultOptions options;
  };
  Uniforms Draw() {
    std::lock_guard lock(mu);
    const double u = Uniform(rng);
    const double u1 = Uniform(rng);
    const double u2 = Uniform(rng);
    return Uniforms{u, u1, u2, options};
  }

  PutDraw DrawPut() {
    const Uniforms r = Draw();
    const double u = r.decision;
    const FaultOptions& options = r.options;
    PutDraw d{PutFault::kNone, SampleLatencyMs(options.put_latency, r.u1, r.u2)};
    double edge = options.put_error_rate;
    if (u < edge) {
      d.fault = PutFault::kError;
    } else if (u < (edge += options.put_timeout_rate)) {
      d.fault = PutFault::kTimeout;
    } else if (u < (edge += options.put_ambiguous_rate)) {
      d.fault = PutFault::kAmbiguous;
    }
    return d;
  }

  GetDraw DrawGet() {
    const Uniforms r = Draw();
    return GetDraw{r.decision < r.options.get_error_rate, SampleLatencyMs(r.options.get_latency, r.u1, r.u2)};
  }
};

FaultStore::FaultStore(std::shared_ptr<ObjectStore> inner, FaultOptions options)
    : inner_(std::move(inner)), impl_(std::make_unique<Impl>(options)) {
  assert(inner_ != nullptr && "FaultStore needs an inner store");
}

FaultStore::~FaultStore() = default;

template <typename PutFn>
Status FaultStore::FaultyPut(std::string_view key, PutFn&& put) {
  return internal::CatchAll("fault Put", [&]() -> Status {
    WEIR_RETURN_IF_ERROR(ValidateKey(key));  // a bad key never reaches the "network"
    counters_.puts.fetch_add(1, std::memory_order_relaxed);
    const Impl::PutDraw d = impl_->DrawPut();
    switch (d.fault) {
      case PutFault::kError:
        counters_.put_errors.fetch_add(1, std::memory_order_relaxed);
        SleepMs(d.latency_ms);
        return Unavailable("injected PUT error for {}", key);
      case PutFault::kTimeout:
        counters_.put_timeouts.fetch_add(1, std::memory_order_relaxed);
        SleepMs(d.latency_ms);
        return Timeout("injected PUT timeout for {} (not applied)", key);
      case PutFault::kAmbiguous: {
        Status st = put();
        SleepMs(d.latency_ms);
        if (!st.ok()) return st;
        counters_.put_ambiguous.fetch_add(1, std::memory_order_relaxed);
        return Timeout("injected ambiguous PUT timeout for {} (applied)", key);
      }
      case PutFault::kNone:
        break;
    }
    SleepMs(d.latency_ms);
    return put();
  });
}

Status FaultStore::Put(std::string_view key, std::string_view data, const PutOptions& options) {
  return FaultyPut(key, [&] { return inner_->Put(key, data, options); });
}

Status FaultStore::PutParts(std::string_view key, std::span<const std::string_view> parts,
                            const PutOptions& options) {
  return FaultyPut(key, [&] { return inner_->PutParts(key, parts, options); });
}

Status FaultStore::ReadFault(std::string_view op, std::string_view key) {
  counters_.gets.fetch_add(1, std::memory_order_relaxed);
  const Impl::GetDraw d = impl_->DrawGet();
  SleepMs(d.latency_ms);
  if (!d.error) return Status::Ok();
  counters_.get_errors.fetch_add(1, std::memory_order_relaxed);
  return Unavailable("injected {} error for {}", op, internal::QuoteKey(key));
}

Result<std::string> FaultStore::Get(std::string_view key, std::optional<ByteRange> range) {
  return internal::CatchAll("fault Get", [&]() -> Result<std::string> {
    WEIR_RETURN_IF_ERROR(ValidateKey(key));
    WEIR_RETURN_IF_ERROR(ReadFault("GET", key));
    return inner_->Get(key, range);
  });
}

Result<ObjectInfo> FaultStore::Head(std::string_view key) {
  return internal::CatchAll("fault Head", [&]() -> Result<ObjectInfo> {
    WEIR_RETURN_IF_ERROR(ValidateKey(key));
    WEIR_RETURN_IF_ERROR(ReadFault("HEAD", key));
    return inner_->Head(key);
  });
}

Result<ListPage> FaultStore::List(std::string_view prefix, std::string_view start_after, size_t max_keys) {
  return internal::CatchAll("fault List", [&]() -> Result<ListPage> {
    WEIR_RETURN_IF_ERROR(ReadFault("LIST", prefix));
    return inner_->List(prefix, start_after, max_keys);
  });
}

Status FaultStore::Delete(std::string_view key) { return inner_->Delete(key); }

Status FaultStore::DeleteMany(std::span<const std::string> keys) { return inner_->DeleteMany(keys); }

std::string FaultStore::Describe() const { return "fault(" + inner_->Describe() + ")"; }

size_t FaultStore::PreferredParallelPuts() const {
  std::lock_guard lk(impl_->mu);
  return impl_->options.put_latency.p50_ms > 0 ? ObjectStore::PreferredParallelPuts()
                                                : inner_->PreferredParallelPuts();
}

void FaultStore::SetOptions(const FaultOptions& options) {
  std::lock_guard lock(impl_->mu);
  impl_->options = options;  // options.seed is ignored: the PRNG stream continues
}

}  // namespace weir::objstore
