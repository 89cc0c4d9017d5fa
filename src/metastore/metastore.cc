// Enum names and URI dispatch for the Metastore interface.
#include "metastore/metastore.h"

#include <exception>
#include <new>

#include "metastore/sqlite_metastore.h"

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

namespace {

Result<std::shared_ptr<Metastore>> OpenMetastoreUnchecked(std::string_view uri) {
  constexpr std::string_view kSqlite = "sqlite://";
  if (uri.starts_with(kSqlite)) {
    const std::string_view path = uri.substr(kSqlite.size());
    if (path.empty()) {
      return InvalidArgument(
          "metastore URI \"{}\": sqlite:// needs a database file (sqlite:///abs/meta.db, sqlite://rel/meta.db) "
          "or :memory:",
          uri);
    }
    auto store = SqliteMetastore::Open(std::string(path));
    if (!store.ok()) return store.status();
    return std::shared_ptr<Metastore>(std::move(store).value());
  }
  return InvalidArgument(
      "unsupported metastore URI scheme in \"{}\"; supported: sqlite://PATH, sqlite://:memory: "
      "(postgres:// arrives later)",
      uri);
}

}  // namespace

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
