// sqlite://PATH: the SqlDb driver for one SQLite database file, through the C API.
#include "metastore/sqlite_db.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <exception>
#include <filesystem>
#include <new>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/fs.h"

namespace weir::metastore {

namespace {

constexpr int kBusyTimeoutMs = 5000;

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

// Schema 5: the basin config. NULL default_* columns are unset fields.
#define WEIR_BASIN_CONFIG_DDL                                                                           \
  "on_append INTEGER NOT NULL DEFAULT 0, on_read INTEGER NOT NULL DEFAULT 0, default_storage_class TEXT, " \
  "default_retention_age_s INTEGER, default_timestamping TEXT, default_uncapped INTEGER, "               \
  "default_delete_on_empty_s INTEGER"
constexpr const char* kAddBasinConfig[] = {
    "ALTER TABLE basins ADD COLUMN on_append INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE basins ADD COLUMN on_read INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE basins ADD COLUMN default_storage_class TEXT",
    "ALTER TABLE basins ADD COLUMN default_retention_age_s INTEGER",
    "ALTER TABLE basins ADD COLUMN default_timestamping TEXT",
    "ALTER TABLE basins ADD COLUMN default_uncapped INTEGER",
    "ALTER TABLE basins ADD COLUMN default_delete_on_empty_s INTEGER",
};

constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS basins(name TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL, " WEIR_BASIN_CONFIG_DDL
    ") WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS streams(id INTEGER PRIMARY KEY, basin TEXT NOT NULL REFERENCES basins(name), "
    "name TEXT NOT NULL, storage_class TEXT NOT NULL, retention_age_s INTEGER NOT NULL, "
    "timestamping TEXT NOT NULL, uncapped INTEGER NOT NULL, created_at_ms INTEGER NOT NULL, "
    "delete_on_empty_s INTEGER NOT NULL DEFAULT 0, UNIQUE(basin, name))",
    "CREATE TABLE IF NOT EXISTS stream_states(stream_id INTEGER PRIMARY KEY REFERENCES streams(id), "
    "settled_offset INTEGER NOT NULL, trim_point INTEGER NOT NULL, fencing_token BLOB NOT NULL, "
    "last_timestamp_ms INTEGER NOT NULL, producer_state BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS segments(stream_id INTEGER NOT NULL, start_offset INTEGER NOT NULL, "
    "end_offset INTEGER NOT NULL, first_ts INTEGER NOT NULL, last_ts INTEGER NOT NULL, "
    "object_key TEXT NOT NULL, size_bytes INTEGER NOT NULL, PRIMARY KEY(stream_id, start_offset)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS nodes(node TEXT PRIMARY KEY, epoch INTEGER NOT NULL, window INTEGER NOT NULL, "
    "ckpt_epoch INTEGER NOT NULL, ckpt_seq INTEGER NOT NULL, heartbeat_ms INTEGER NOT NULL DEFAULT 0, "
    "takeover INTEGER NOT NULL DEFAULT 0, minted_by INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID",
    // Allocators: value = the last id handed out; only ever increases.
    "CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    // Schema 2. A table's bucket streams are found by name (BucketStreamName).
    "CREATE TABLE IF NOT EXISTS tables(id INTEGER PRIMARY KEY, basin TEXT NOT NULL REFERENCES basins(name), "
    "name TEXT NOT NULL, kind TEXT NOT NULL, bucket_count INTEGER NOT NULL, config BLOB NOT NULL, "
    "created_at_ms INTEGER NOT NULL, UNIQUE(basin, name))",
    "CREATE TABLE IF NOT EXISTS group_offsets(group_id TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL, "
    "committed_offset INTEGER NOT NULL, leader_epoch INTEGER NOT NULL, metadata BLOB NOT NULL, "
    "commit_time_ms INTEGER NOT NULL, PRIMARY KEY(group_id, topic, part)) WITHOUT ROWID",
    // Schema 3. The request token a basin (stream '') or stream was created with.
    "CREATE TABLE IF NOT EXISTS create_tokens(basin TEXT NOT NULL, stream TEXT NOT NULL, token TEXT NOT NULL, "
    "PRIMARY KEY(basin, stream)) WITHOUT ROWID",
    // Schema 9. Deleting a topic deletes its committed offsets by topic.
    "CREATE INDEX IF NOT EXISTS group_offsets_topic ON group_offsets(topic)",
};

// Schema 6: nodes.heartbeat_ms (likewise).
constexpr const char kAddHeartbeat[] = "ALTER TABLE nodes ADD COLUMN heartbeat_ms INTEGER NOT NULL DEFAULT 0";
// Schema 7: nodes.takeover (likewise): 0 for heartbeats older builds left.
constexpr const char kAddTakeover[] = "ALTER TABLE nodes ADD COLUMN takeover INTEGER NOT NULL DEFAULT 0";
// Schema 8: nodes.minted_by (likewise): 0 for epochs older builds minted.
constexpr const char kAddMintedBy[] = "ALTER TABLE nodes ADD COLUMN minted_by INTEGER NOT NULL DEFAULT 0";
// Schema 4: streams.delete_on_empty_s (created with the table since).
constexpr const char kAddDeleteOnEmpty[] =
    "ALTER TABLE streams ADD COLUMN delete_on_empty_s INTEGER NOT NULL DEFAULT 0";


}  // namespace

// The driver. Ownership: its SqlMetastore. Threads: one at a time (the
// metastore's mutex). The connection runs in WAL journal mode with
// synchronous=FULL, so a committed transaction survives a crash or power
// loss; other processes may open the same file: SQLite serializes their
// writers (BEGIN IMMEDIATE), and a lock held longer than 5 s surfaces as
// kUnavailable (retryable).
class SqliteDb final : public SqlDb {
 public:
  SqliteDb(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  ~SqliteDb() override {
    statements_.clear();  // finalizes them
    sqlite3_close_v2(db_);
  }
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  Status Configure();

  Result<SqlStatement*> Prepare(const char* sql) override;
  Status Exec(const char* sql, std::string_view what) override {
    const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? Status::Ok() : Error(rc, what);
  }
  Status Begin(std::string_view what) override { return Exec("BEGIN IMMEDIATE", fmt::format("{}: begin", what)); }
  Status Commit(std::string_view what) override { return Exec("COMMIT", fmt::format("{}: commit", what)); }
  void RollbackIfActive() override {
    // Some errors (disk full, I/O) already rolled the transaction back.
    if (sqlite3_get_autocommit(db_) == 0) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  std::vector<const char*> Schema() const override { return {std::begin(kSchema), std::end(kSchema)}; }
  std::vector<const char*> Upgrade(int from_version) const override {
    std::vector<const char*> out;
    if (from_version < 4) out.push_back(kAddDeleteOnEmpty);
    if (from_version < 5) out.insert(out.end(), std::begin(kAddBasinConfig), std::end(kAddBasinConfig));
    if (from_version < 6) out.push_back(kAddHeartbeat);
    if (from_version < 7) out.push_back(kAddTakeover);
    if (from_version < 8) out.push_back(kAddMintedBy);
    return out;
  }
  // One file, so one machine: its clock.
  Result<int64_t> NowMs() override { return WallMillis(); }
  Status ExecForTest(const std::string& sql) override { return Exec(sql.c_str(), "test statement"); }
  std::string Describe() const override { return "sqlite://" + path_; }

  Status Error(int rc, std::string_view what) const;

 private:
  class Statement;

  const std::string path_;
  sqlite3* const db_;
  std::unordered_map<std::string, std::unique_ptr<Statement>> statements_;  // by SQL text
};

// A cached prepared statement. Owned by its SqliteDb (finalized with it);
// used by the one thread that borrowed it, under the metastore's mutex, until
// Reset clears its bindings. A bind failure is reported by the next Step.
class SqliteDb::Statement final : public SqlStatement {
 public:
  Statement(const SqliteDb* owner, sqlite3_stmt* stmt) : owner_(owner), stmt_(stmt) {}
  ~Statement() override { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  bool busy() const { return sqlite3_stmt_busy(stmt_) != 0 || bound_; }

  void BindInt(int i, int64_t v) override { Check(sqlite3_bind_int64(stmt_, i, v)); }
  void BindText(int i, std::string_view v) override {
    // A null data pointer would bind SQL NULL; an empty view binds ''.
    Check(sqlite3_bind_text64(stmt_, i, v.empty() ? "" : v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  void BindBlob(int i, std::string_view v) override {
    Check(sqlite3_bind_blob64(stmt_, i, v.empty() ? "" : v.data(), v.size(), SQLITE_TRANSIENT));
  }
  void BindNull(int i) override { Check(sqlite3_bind_null(stmt_, i)); }

  Result<bool> Step(std::string_view what) override {
    if (bind_rc_ != SQLITE_OK) {
      // Said by the bind's own code: the connection's last message may be
      // another call's (a later bind that succeeded resets it).
      const std::string text =
          fmt::format("metastore {}: {}: binding a value: {}", owner_->Describe(), what, sqlite3_errstr(bind_rc_));
      if ((bind_rc_ & 0xff) == SQLITE_NOMEM) return ResourceExhausted("{}", text);
      if ((bind_rc_ & 0xff) == SQLITE_TOOBIG) return InvalidArgument("{} (over SQLite's length limit)", text);
      return Internal("{}", text);
    }
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return owner_->Error(rc, what);
  }
  int64_t Changes() const override { return sqlite3_changes64(sqlite3_db_handle(stmt_)); }

  int64_t ColInt(int c) const override { return sqlite3_column_int64(stmt_, c); }
  bool ColNull(int c) const override { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }
  std::string ColBytes(int c) const override {
    // sqlite3_column_blob returns a text column's bytes as they are.
    const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, c));
    const int n = sqlite3_column_bytes(stmt_, c);
    return p == nullptr ? std::string() : std::string(p, static_cast<size_t>(n));
  }

  void Reset() override {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    bind_rc_ = SQLITE_OK;
    bound_ = false;
  }
  void Borrow() { bound_ = true; }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  }

  const SqliteDb* owner_;
  sqlite3_stmt* stmt_;
  int bind_rc_ = SQLITE_OK;
  bool bound_ = false;  // borrowed and not yet Reset
};

Status SqliteDb::Configure() {
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  WEIR_RETURN_IF_ERROR(Exec("PRAGMA foreign_keys = ON", "enable foreign keys"));
  {
    WEIR_ASSIGN_OR_RETURN(SqlStatement * st, Prepare("PRAGMA journal_mode = WAL"));
    auto row = st->Step("enable the WAL journal");
    const std::string mode = row.ok() && *row ? st->ColBytes(0) : std::string();
    st->Reset();
    WEIR_RETURN_IF_ERROR(row.status());
    if (path_ != ":memory:" && mode != "wal") {
      return IOError("metastore {}: could not enable the WAL journal (journal_mode is \"{}\")", Describe(), mode);
    }
  }
  return Exec("PRAGMA synchronous = FULL", "set synchronous=FULL");
}

Result<SqlStatement*> SqliteDb::Prepare(const char* sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) {
      Status st = Error(rc, fmt::format("prepare \"{}\"", sql));
      sqlite3_finalize(stmt);
      return st;
    }
    std::unique_ptr<Statement> owned;
    try {
      owned = std::make_unique<Statement>(this, stmt);
    } catch (...) {
      sqlite3_finalize(stmt);
      throw;
    }
    it = statements_.emplace(sql, std::move(owned)).first;
  } else if (it->second->busy()) {
    return Internal("metastore {}: statement \"{}\" is already in use", Describe(), sql);
  }
  it->second->Borrow();
  return static_cast<SqlStatement*>(it->second.get());
}

Status SqliteDb::Error(int rc, std::string_view what) const {
  const std::string text = fmt::format("metastore {}: {}: {}", Describe(), what, sqlite3_errmsg(db_));
  if (rc == SQLITE_IOERR_NOMEM) return ResourceExhausted("{}", text);
  switch (rc & 0xff) {
    case SQLITE_FULL:  // as the file store's ENOSPC: retryable, settle and retention free space
      return ResourceExhausted("{}", text);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Unavailable("{} (another connection holds the database lock; retry)", text);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return Corruption("{}", text);
    case SQLITE_NOMEM:
      return ResourceExhausted("{}", text);
    case SQLITE_CONSTRAINT:
      if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) return AlreadyExists("{}", text);
      if (rc == SQLITE_CONSTRAINT_FOREIGNKEY) return PreconditionFailed("{}", text);
      return Internal("{}", text);
    default:
      return IOError("{}", text);
  }
}

Result<std::shared_ptr<SqlMetastore>> OpenSqliteMetastore(const std::string& path) {
  try {
    const std::string uri = "sqlite://" + path;
    if (path.empty()) return InvalidArgument("metastore {}: empty database path", uri);
    const bool memory = path == ":memory:";
    std::string filename = path;
    bool created = false;
    std::string parent;
    if (!memory) {
      if (path.back() == '/') {
        return InvalidArgument("metastore {}: the path names a directory; name the database file, e.g. {}meta.db",
                               uri, path);
      }
      parent = std::filesystem::path(path).parent_path().string();
      if (parent.empty()) parent = ".";
      struct stat st {};
      if (::stat(parent.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT) return InvalidArgument("metastore {}: parent directory {} does not exist", uri, parent);
        return IOError("metastore {}: stat parent directory {}: {}", uri, parent, ErrnoText(err));
      }
      if (!S_ISDIR(st.st_mode)) return InvalidArgument("metastore {}: {} is not a directory", uri, parent);
      if (::stat(path.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
          return InvalidArgument("metastore {}: {} is a directory; name the database file, e.g. {}/meta.db", uri,
                                 path, path);
        }
      } else if (errno == ENOENT) {
        created = true;
      }
      // SQLite reads names starting with "file:" as URIs; "./" keeps a path a path.
      if (path.front() != '/') filename = "./" + path;
    }

    sqlite3* db = nullptr;
    const int rc = sqlite3_open_v2(filename.c_str(), &db,
                                   SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
    if (rc != SQLITE_OK) {
      const int sys_errno = db != nullptr ? sqlite3_system_errno(db) : 0;
      std::string msg = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
      sqlite3_close_v2(db);
      if (sys_errno != 0) msg += ": " + ErrnoText(sys_errno);
      if ((rc & 0xff) == SQLITE_NOMEM) return ResourceExhausted("metastore {}: open: {}", uri, msg);
      return IOError("metastore {}: open: {}", uri, msg);
    }
    std::unique_ptr<SqliteDb> driver;
    try {
      driver = std::make_unique<SqliteDb>(path, db);
    } catch (...) {
      sqlite3_close_v2(db);
      throw;
    }
    WEIR_RETURN_IF_ERROR(driver->Configure());
    WEIR_ASSIGN_OR_RETURN(std::shared_ptr<SqlMetastore> store, SqlMetastore::Open(std::move(driver)));
    if (created) WEIR_RETURN_IF_ERROR(FsyncDir(parent).WithContext("metastore " + uri));
    return store;
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("metastore sqlite://{}: open: out of memory", path);
  } catch (const std::exception& e) {
    return Internal("metastore sqlite://{}: open: unexpected exception: {}", path, e.what());
  }
}

}  // namespace weir::metastore
