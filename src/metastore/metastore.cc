// Enum names and URI dispatch for the Metastore interface.
#include "metastore/metastore.h"

#include <exception>
#include <new>

#include <fmt/format.h>

#include "metastore/postgres_db.h"
#include "metastore/sqlite_db.h"

namespace weir::metastore {

std::string_view StorageClassName(StorageClass c) {
  switch (c) {
    case StorageClass::kStandard:
      return "standard";
    case StorageClass::kExpress:
      return "express";
  }
  return "unknown";
}

std::string_view TimestampingModeName(TimestampingMode m) {
  switch (m) {
    case TimestampingMode::kClientPrefer:
      return "client-prefer";
    case TimestampingMode::kClientRequire:
      return "client-require";
    case TimestampingMode::kArrival:
      return "arrival";
  }
  return "unknown";
}

Result<StorageClass> ParseStorageClass(std::string_view s) {
  for (StorageClass c : {StorageClass::kStandard, StorageClass::kExpress}) {
    if (s == StorageClassName(c)) return c;
  }
  return InvalidArgument("unknown storage class \"{}\"; valid: standard, express", s);
}

Result<TimestampingMode> ParseTimestampingMode(std::string_view s) {
  for (TimestampingMode m :
       {TimestampingMode::kClientPrefer, TimestampingMode::kClientRequire, TimestampingMode::kArrival}) {
    if (s == TimestampingModeName(m)) return m;
  }
  return InvalidArgument("unknown timestamping mode \"{}\"; valid: client-prefer, client-require, arrival", s);
}

StreamConfigLayer StreamConfigLayer::Of(const StreamConfig& c) {
  return StreamConfigLayer{c.storage_class, c.retention_age_s, c.timestamping, c.uncapped_timestamps,
                           c.delete_on_empty_min_age_s};
}

StreamConfigLayer StreamConfigLayer::Over(const StreamConfigLayer& below) const {
  return StreamConfigLayer{storage_class ? storage_class : below.storage_class,
                           retention_age_s ? retention_age_s : below.retention_age_s,
                           timestamping ? timestamping : below.timestamping,
                           uncapped_timestamps ? uncapped_timestamps : below.uncapped_timestamps,
                           delete_on_empty_min_age_s ? delete_on_empty_min_age_s : below.delete_on_empty_min_age_s};
}

StreamConfig StreamConfigLayer::Resolve() const {
  const StreamConfig d;
  return StreamConfig{storage_class.value_or(d.storage_class), retention_age_s.value_or(d.retention_age_s),
                      timestamping.value_or(d.timestamping), uncapped_timestamps.value_or(d.uncapped_timestamps),
                      delete_on_empty_min_age_s.value_or(d.delete_on_empty_min_age_s)};
}

std::string BucketStreamName(std::string_view table, uint32_t bucket) {
  return fmt::format("{}/{}", table, bucket);
}

Status CheckLogTableName(std::string_view name, std::string_view what) {
  if (name.empty() || name.size() > 249) return InvalidArgument("{} name must be 1 to 249 characters", what);
  if (name == "." || name == "..") return InvalidArgument("{} name cannot be \"{}\"", what, name);
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return InvalidArgument("{} name \"{}\" may hold only ASCII letters, digits, '.', '_' and '-'", what, name);
  }
  return Status::Ok();
}

StreamConfig LogTableStreamConfig() {
  StreamConfig cfg;
  cfg.timestamping = TimestampingMode::kClientPrefer;
  cfg.uncapped_timestamps = true;
  return cfg;
}

std::optional<BucketRef> ParseBucketStreamName(std::string_view stream) {
  const size_t slash = stream.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return std::nullopt;
  const std::string_view digits = stream.substr(slash + 1);
  // At most 5 digits: kMaxTableBuckets - 1 = 9999.
  if (digits.empty() || digits.size() > 5 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  uint32_t bucket = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    bucket = bucket * 10 + static_cast<uint32_t>(c - '0');
  }
  if (bucket >= kMaxTableBuckets) return std::nullopt;
  return BucketRef{stream.substr(0, slash), bucket};
}

namespace {

Result<std::shared_ptr<Metastore>> OpenMetastoreUnchecked(std::string_view uri) {
  WEIR_RETURN_IF_ERROR(CheckMetastoreScheme(uri));
  constexpr std::string_view kSqlite = "sqlite://";
  if (uri.starts_with(kSqlite)) {
    const std::string_view path = uri.substr(kSqlite.size());
    if (path.empty()) {
      return InvalidArgument(
          "metastore URI \"{}\": sqlite:// needs a database file (sqlite:///abs/meta.db, sqlite://rel/meta.db) "
          "or :memory:",
          uri);
    }
    auto store = OpenSqliteMetastore(std::string(path));
    if (!store.ok()) return store.status();
    return std::shared_ptr<Metastore>(std::move(store).value());
  }
  if (uri.starts_with("postgres://") || uri.starts_with("postgresql://")) {
    auto store = OpenPostgresMetastore(uri);
    if (!store.ok()) return store.status();
    return std::shared_ptr<Metastore>(std::move(store).value());
  }
  return Internal("OpenMetastore: no backend for this URI's scheme");  // CheckMetastoreScheme took it
}

}  // namespace

Status CheckMetastoreScheme(std::string_view uri) {
  if (uri.starts_with("sqlite://") || uri.starts_with("postgres://") || uri.starts_with("postgresql://")) {
    return Status::Ok();
  }
  // Only the scheme: the rest may hold a password.
  const size_t scheme = uri.find("://");
  return InvalidArgument(
      "unsupported metastore URI scheme \"{}\"; supported: sqlite://PATH, sqlite://:memory:, "
      "postgres://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE[?PARAM=VALUE...]",
      scheme == std::string_view::npos ? "(none)" : uri.substr(0, scheme));
}

Result<std::shared_ptr<Metastore>> OpenMetastore(std::string_view uri) {
  try {
    return OpenMetastoreUnchecked(uri);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("OpenMetastore: out of memory");
  } catch (const std::exception& e) {
    return Internal("OpenMetastore: unexpected exception: {}", e.what());
  }
}

}  // namespace weir::metastore
