// postgres://...: the metastore on a PostgreSQL server (through libpq), for
// nodes that keep no state on their own disk.
#pragma once

#include <memory>
#include <string_view>

#include "metastore/sql_metastore.h"
#include "objstore/object_store.h"

namespace weir::metastore {

// Connects to `uri`, a libpq connection URI (postgres:// or postgresql://;
// e.g. postgres://weir:secret@db.internal:5432/weir?sslmode=require), and
// creates or upgrades the schema in the connection's default schema.
//
// - Writers of the database are serialized by a transaction-scoped advisory
//   lock, as SQLite's BEGIN IMMEDIATE serializes them, so every node sharing
//   the database sees the same rules. A lock not granted within 5 s is
//   kUnavailable (retryable).
// - Names and keys are stored as bytea, so they compare byte-wise as on SQLite.
// - Unless the URI sets them: connect_timeout 10 s, TCP keep-alives (30 s
//   idle, then 3 probes 10 s apart), tcp_user_timeout 30 s and
//   application_name "weir". Statements time out after 60 s; a transaction
//   left idle for 60 s (a stopped process) is ended by the server, freeing
//   the writers' lock.
// - A broken connection is reopened by the next call; the call that found it
//   broken fails with kUnavailable. A commit whose answer was lost fails with
//   kUnavailable and says that its outcome is unknown.
Result<std::shared_ptr<SqlMetastore>> OpenPostgresMetastore(std::string_view uri);

// A WAL store on PostgreSQL (`--wal-store postgres://...`, DESIGN.md §6,
// docs/storage-classes.md): slots are rows of the table weir_wal (made in the
// connection's default schema), a create-only PUT is an INSERT whose primary
// key conflict is kPreconditionFailed, and a row is durable once its INSERT
// is acknowledged. Up to `connections` connections, opened as calls need
// them; the connection settings and error rules are the metastore's above.
Result<std::shared_ptr<objstore::ObjectStore>> OpenPostgresWalStore(std::string_view uri, size_t connections = 8);

}  // namespace weir::metastore
