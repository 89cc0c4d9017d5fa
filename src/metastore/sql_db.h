// The SQL driver under SqlMetastore: one connection to SQLite or PostgreSQL.
// SqlMetastore holds every query and rule; a driver only runs statements.
//
// SQL handed to a driver is written once for both databases: parameters are
// ?1, ?2, ... (a PostgreSQL driver renumbers them $1, $2, ...), strings are
// compared byte-wise, integers are 64-bit, and no statement uses an SQL
// dialect's own functions (MAX(a, b), x'' literals, INSERT OR REPLACE).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace weir::metastore {

// One statement, borrowed from its SqlDb for one use: bind, step, read
// columns, then Reset. Owned by its SqlDb (cached by SQL text); used by the
// one thread that borrowed it, until Reset. Bind errors surface at the next Step.
class SqlStatement {
 public:
  virtual ~SqlStatement() = default;
  virtual void BindInt(int i, int64_t v) = 0;
  virtual void BindText(int i, std::string_view v) = 0;  // names, keys: compared byte-wise
  virtual void BindBlob(int i, std::string_view v) = 0;  // opaque bytes
  virtual void BindNull(int i) = 0;
  // true: a row is ready; false: no more rows.
  virtual Result<bool> Step(std::string_view what) = 0;
  virtual int64_t Changes() const = 0;  // rows changed by the last run
  virtual int64_t ColInt(int c) const = 0;
  virtual bool ColNull(int c) const = 0;
  virtual std::string ColBytes(int c) const = 0;  // a text or blob column's bytes
  // Forgets bindings and results, so the statement can be borrowed again.
  virtual void Reset() = 0;
};

// A connection. Ownership: a SqlMetastore owns its SqlDb (PostgresWalStore
// pools PostgresDbs of its own). Threads: one at a time (SqlMetastore's mutex,
// or the WAL store call holding it). Guarantees: statements are cached by SQL
// text and lent one at a time (kInternal if borrowed); the methods say the rest.
class SqlDb {
 public:
  virtual ~SqlDb() = default;
  // The statement for `sql` (cached by its text), borrowed until Reset.
  // kInternal if it is already borrowed.
  virtual Result<SqlStatement*> Prepare(const char* sql) = 0;
  // Runs a statement without parameters or rows (schema changes).
  virtual Status Exec(const char* sql, std::string_view what) = 0;
  // A write transaction, serialized with every other writer of the database
  // (in this process or any other) until Commit or Rollback.
  virtual Status Begin(std::string_view what) = 0;
  // kUnavailable when the outcome is unknown (the connection broke during it).
  virtual Status Commit(std::string_view what) = 0;
  virtual void RollbackIfActive() = 0;
  // The driver's CREATE TABLE IF NOT EXISTS statements for schema
  // kSchemaVersion (sql_metastore.h), after any settings their transaction
  // needs (run only when the stored version is another), and the changes
  // that bring a database of an older version up to it (tables the first
  // list creates aside).
  virtual std::vector<const char*> Schema() const = 0;
  virtual std::vector<const char*> Upgrade(int from_version) const = 0;
  // The database's clock, in milliseconds since the Unix epoch: one clock
  // for every node that shares the database.
  virtual Result<int64_t> NowMs() = 0;
  // Tests only: runs one statement of the driver's own SQL.
  virtual Status ExecForTest(const std::string& sql) = 0;
  // The URI, without a password.
  virtual std::string Describe() const = 0;
};

}  // namespace weir::metastore
