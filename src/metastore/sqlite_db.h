// sqlite://PATH: the embedded default metastore, one SQLite database file.
#pragma once

#include <memory>
#include <string>

#include "metastore/sql_metastore.h"

namespace weir::metastore {

// Opens PATH (created if missing; its parent directory must exist) or, for
// ":memory:", a private in-memory database, and creates or upgrades its
// schema. A committed transaction survives a crash or power loss (WAL
// journal, synchronous=FULL). Other processes may open the same file: SQLite
// serializes their writers, and a lock held longer than 5 s surfaces as
// kUnavailable (retryable).
Result<std::shared_ptr<SqlMetastore>> OpenSqliteMetastore(const std::string& path);

}  // namespace weir::metastore
