// postgres://...: the SqlDb driver for a PostgreSQL server, through libpq.
#include "metastore/postgres_db.h"

#include <libpq-fe.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/bytes.h"
#include "base/log.h"

namespace weir::metastore {

namespace {

// Type OIDs (pg_type), for binary parameters and results.
constexpr Oid kBoolOid = 16;
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;
constexpr Oid kInt2Oid = 21;
constexpr Oid kInt4Oid = 23;

// The writers' transaction-scoped advisory lock: every write transaction
// holds it, so writers are serialized. Its key is "weir" (0x77656972) and the
// schema's name, so deployments in other schemas of the database do not wait
// for each other (unless their names' hashes collide: then they only wait).
constexpr const char kTakeWriterLock[] =
    "SELECT pg_advisory_xact_lock(2003134834, hashtext(coalesce(current_schema(), '')))";

constexpr const char kNowMs[] = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

// Run on every new connection. A commit acknowledged must be durable (and,
// with synchronous standbys, on them) whatever the server's, database's or
// role's default: settle deletes WAL slots once its commit is acknowledged.
constexpr const char* kSessionSettings[] = {
    "SET lock_timeout = '5s'",
    "SET statement_timeout = '60s'",
    "SET idle_in_transaction_session_timeout = '60s'",
    "SET synchronous_commit = on",
};

// Connection parameters set unless the URI sets them.
constexpr std::pair<const char*, const char*> kDefaultParams[] = {
    {"connect_timeout", "10"},     {"keepalives_idle", "30"},    {"keepalives_interval", "10"},
    {"keepalives_count", "3"},     {"tcp_user_timeout", "30000"}, {"application_name", "weir"},
    // With several hosts: the primary, never a standby (whose writes all fail).
    {"target_session_attrs", "read-write"},
};

// The schema (kSchemaVersion, sql_metastore.h), as SQLite's with bytea for every name, key
// and blob (compared byte-wise) and bigint for every integer.
#define WEIR_BASIN_CONFIG_DDL                                                                             \
  "on_append BIGINT NOT NULL DEFAULT 0, on_read BIGINT NOT NULL DEFAULT 0, default_storage_class BYTEA, " \
  "default_retention_age_s BIGINT, default_timestamping BYTEA, default_uncapped BIGINT, "                 \
  "default_delete_on_empty_s BIGINT"
constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS basins(name BYTEA PRIMARY KEY, created_at_ms BIGINT NOT NULL, " WEIR_BASIN_CONFIG_DDL
    ")",
    "CREATE TABLE IF NOT EXISTS streams(id BIGINT PRIMARY KEY, basin BYTEA NOT NULL REFERENCES basins(name), "
    "name BYTEA NOT NULL, storage_class BYTEA NOT NULL, retention_age_s BIGINT NOT NULL, "
    "timestamping BYTEA NOT NULL, uncapped BIGINT NOT NULL, created_at_ms BIGINT NOT NULL, "
    "delete_on_empty_s BIGINT NOT NULL DEFAULT 0, UNIQUE(basin, name))",
    "CREATE TABLE IF NOT EXISTS stream_states(stream_id BIGINT PRIMARY KEY REFERENCES streams(id), "
    "settled_offset BIGINT NOT NULL, trim_point BIGINT NOT NULL, fencing_token BYTEA NOT NULL, "
    "last_timestamp_ms BIGINT NOT NULL, producer_state BYTEA NOT NULL)",
    "CREATE TABLE IF NOT EXISTS segments(stream_id BIGINT NOT NULL, start_offset BIGINT NOT NULL, "
    "end_offset BIGINT NOT NULL, first_ts BIGINT NOT NULL, last_ts BIGINT NOT NULL, "
    "object_key BYTEA NOT NULL, size_bytes BIGINT NOT NULL, PRIMARY KEY(stream_id, start_offset))",
    "CREATE TABLE IF NOT EXISTS nodes(node BYTEA PRIMARY KEY, epoch BIGINT NOT NULL, \"window\" BIGINT NOT NULL, "
    "ckpt_epoch BIGINT NOT NULL, ckpt_seq BIGINT NOT NULL, heartbeat_ms BIGINT NOT NULL DEFAULT 0, "
    "takeover BIGINT NOT NULL DEFAULT 0, minted_by BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS counters(name BYTEA PRIMARY KEY, value BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tables(id BIGINT PRIMARY KEY, basin BYTEA NOT NULL REFERENCES basins(name), "
    "name BYTEA NOT NULL, kind BYTEA NOT NULL, bucket_count BIGINT NOT NULL, config BYTEA NOT NULL, "
    "created_at_ms BIGINT NOT NULL, UNIQUE(basin, name))",
    "CREATE TABLE IF NOT EXISTS group_offsets(group_id BYTEA NOT NULL, topic BYTEA NOT NULL, part BIGINT NOT NULL, "
    "committed_offset BIGINT NOT NULL, leader_epoch BIGINT NOT NULL, metadata BYTEA NOT NULL, "
    "commit_time_ms BIGINT NOT NULL, PRIMARY KEY(group_id, topic, part))",
    "CREATE TABLE IF NOT EXISTS create_tokens(basin BYTEA NOT NULL, stream BYTEA NOT NULL, token BYTEA NOT NULL, "
    "PRIMARY KEY(basin, stream))",
    "CREATE INDEX IF NOT EXISTS group_offsets_topic ON group_offsets(topic)",
};
#undef WEIR_BASIN_CONFIG_DDL

// ?N -> $N, outside quoted text.
std::string Renumber(std::string_view sql) {
  std::string out;
  out.reserve(sql.size());
  char quote = 0;
  for (size_t i = 0; i < sql.size(); ++i) {
    const char c = sql[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '?' && i + 1 < sql.size() && std::isdigit(static_cast<unsigned char>(sql[i + 1])) != 0) {
      out += '$';
      continue;
    }
    out += c;
  }
  return out;
}

std::string Trimmed(const char* message) {
  std::string s = message != nullptr ? message : "";
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.pop_back();
  return s;
}

// A Status for an error with SQLSTATE `state` (empty if none).
Status FromSqlState(std::string_view state, const std::string& text) {
  if (state == "23505") return AlreadyExists("{}", text);         // unique_violation
  if (state == "23503") return PreconditionFailed("{}", text);    // foreign_key_violation
  if (state == "57014") return Timeout("{}", text);               // query_canceled (statement_timeout)
  if (state == "25006") return Unavailable("{} (a read-only server; reconnecting to the primary)", text);
  if (state == "40001" || state == "40P01" || state == "55P03" ||  // serialization, deadlock, lock_timeout
      state.starts_with("08") || state.starts_with("57P") || state == "53300") {
    return Unavailable("{} (retry)", text);
  }
  if (state.starts_with("53")) return ResourceExhausted("{}", text);  // disk full, out of memory
  if (state == "XX001" || state == "XX002") return Corruption("{}", text);
  if (state.starts_with("42")) return Internal("{}", text);  // a statement or schema this build did not expect
  return IOError("{}", text);
}

// `message` with the URI's password (as written: it may not parse) replaced.
std::string WithoutPassword(std::string message, std::string_view uri) {
  const size_t scheme = uri.find("://");
  if (scheme == std::string_view::npos) return message;
  std::string_view rest = uri.substr(scheme + 3);
  rest = rest.substr(0, rest.find_first_of("/?"));
  const size_t at = rest.rfind('@');
  if (at == std::string_view::npos) return message;
  const size_t colon = rest.substr(0, at).find(':');
  if (colon == std::string_view::npos || colon + 1 == at) return message;
  const std::string password(rest.substr(colon + 1, at - colon - 1));
  for (size_t i = message.find(password); i != std::string::npos; i = message.find(password, i + 3)) {
    message.replace(i, password.size(), "***");
  }
  return message;
}

}  // namespace

// The driver: one connection. Ownership: its SqlMetastore, or
// PostgresWalStore's pool (idle_, or the call that took it). Threads: one at a
// time (the metastore's mutex, or that one WAL store call). Guarantees: see
// OpenPostgresMetastore and OpenPostgresWalStore.
class PostgresDb final : public SqlDb {
 public:
  // `kind` names its use in errors: "metastore" or "WAL store".
  PostgresDb(PGconn* conn, std::string describe, std::string kind = "metastore")
      : conn_(conn), describe_(std::move(describe)), kind_(std::move(kind)) {
    PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);  // NOTICEs ("already exists") are noise
  }
  ~PostgresDb() override {
    statements_.clear();
    PQfinish(conn_);
  }
  PostgresDb(const PostgresDb&) = delete;
  PostgresDb& operator=(const PostgresDb&) = delete;

  // The session settings of a new connection.
  Status Configure() {
    for (const char* sql : kSessionSettings) WEIR_RETURN_IF_ERROR(Run(sql, "configure the session"));
    for (const char* sql : extra_settings_) WEIR_RETURN_IF_ERROR(Run(sql, "configure the session"));
    return Status::Ok();
  }
  // Settings of this connection's use, run after the common ones (now and
  // on every reconnect).
  Status AddSettings(std::vector<const char*> sql) {
    extra_settings_ = std::move(sql);
    for (const char* q : extra_settings_) WEIR_RETURN_IF_ERROR(Run(q, "configure the session"));
    return Status::Ok();
  }

  Result<SqlStatement*> Prepare(const char* sql) override;
  Status Exec(const char* sql, std::string_view what) override {
    WEIR_RETURN_IF_ERROR(EnsureConnected(what));
    return Run(sql, what);
  }
  // The connection broke, and no transaction of ours was open on it.
  bool BrokenOutsideTransaction() const { return !in_transaction_ && PQstatus(conn_) != CONNECTION_OK; }
  Status Begin(std::string_view what) override;
  Status Commit(std::string_view what) override;
  void RollbackIfActive() override {
    in_transaction_ = false;
    if (PQstatus(conn_) != CONNECTION_OK) return;
    const PGTransactionStatusType t = PQtransactionStatus(conn_);
    if (t == PQTRANS_INTRANS || t == PQTRANS_INERROR) PQclear(PQexec(conn_, "ROLLBACK"));
  }
  // Run only when the stored version is not this build's: the DDL may wait
  // for locks other sessions hold (a pg_dump's, a session idle in a
  // transaction) and build an index over a large table, longer than the
  // session's 5 s and 60 s timeouts allow (SET LOCAL: this transaction only).
  std::vector<const char*> Schema() const override {
    std::vector<const char*> out = {"SET LOCAL lock_timeout = '300s'", "SET LOCAL statement_timeout = 0"};
    out.insert(out.end(), std::begin(kSchema), std::end(kSchema));
    return out;
  }
  // PostgreSQL databases start at 5.
  std::vector<const char*> Upgrade(int from_version) const override {
    std::vector<const char*> out;
    if (from_version < 6) out.push_back("ALTER TABLE nodes ADD COLUMN IF NOT EXISTS heartbeat_ms BIGINT NOT NULL DEFAULT 0");
    if (from_version < 7) out.push_back("ALTER TABLE nodes ADD COLUMN IF NOT EXISTS takeover BIGINT NOT NULL DEFAULT 0");
    if (from_version < 8) out.push_back("ALTER TABLE nodes ADD COLUMN IF NOT EXISTS minted_by BIGINT NOT NULL DEFAULT 0");
    return out;
  }
  Result<int64_t> NowMs() override {
    WEIR_ASSIGN_OR_RETURN(SqlStatement * st, Prepare(kNowMs));
    struct GiveBack {  // also if an exception unwinds (the statement stays usable)
      SqlStatement* stmt;
      ~GiveBack() { stmt->Reset(); }
    } give_back{st};
    auto row = st->Step("read the server's clock");
    const int64_t ms = row.ok() && *row ? st->ColInt(0) : 0;
    if (!row.ok()) return row.status();
    if (ms <= 0) return Internal("{} {}: the server's clock read {}", kind_, describe_, ms);
    return ms;
  }
  Status ExecForTest(const std::string& sql) override { return Exec(sql.c_str(), "test statement"); }
  std::string Describe() const override { return describe_; }

  // A broken connection is reopened here, outside a transaction.
  Status EnsureConnected(std::string_view what);
  // The Status for a failed command (`res` may be null).
  Status ResultError(const PGresult* res, std::string_view what) const;
  PGconn* conn() const { return conn_; }

 private:
  class Statement;

  // One command without parameters, on the connection as it is.
  Status Run(const char* sql, std::string_view what) {
    PGresult* res = PQexec(conn_, sql);
    const ExecStatusType s = res != nullptr ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    Status st = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK ? Status::Ok() : ResultError(res, what);
    PQclear(res);
    return st;
  }

  PGconn* const conn_;
  const std::string describe_;
  const std::string kind_;
  bool in_transaction_ = false;
  mutable bool reconnect_ = false;  // the next call reconnects (set by ResultError, which is const)
  std::vector<const char*> extra_settings_;
  std::unordered_map<std::string, std::unique_ptr<Statement>> statements_;  // by SQL text
};

// One statement: its parameters are bound in binary (int8, bytea) and its
// results read in binary; it runs at the first Step, with every row at once.
// Owned by its PostgresDb (cached by SQL text); used by the thread that
// borrowed it (Prepare) until Reset, which frees its result.
class PostgresDb::Statement final : public SqlStatement {
 public:
  Statement(PostgresDb* owner, std::string sql) : owner_(owner), sql_(std::move(sql)) {}
  ~Statement() override { PQclear(res_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool borrowed() const { return borrowed_; }
  void Borrow() { borrowed_ = true; }

  void BindInt(int i, int64_t v) override {
    Param& p = At(i);
    p.type = kInt8Oid;
    p.null = false;
    p.value.clear();
    PutBE64(&p.value, static_cast<uint64_t>(v));
  }
  void BindText(int i, std::string_view v) override { BindBlob(i, v); }
  void BindBlob(int i, std::string_view v) override {
    Param& p = At(i);
    p.type = kByteaOid;
    p.null = false;
    p.value.assign(v);
  }
  void BindNull(int i) override {
    Param& p = At(i);
    p.type = 0;  // the server infers it from the context
    p.null = true;
    p.value.clear();
  }

  Result<bool> Step(std::string_view what) override {
    if (!executed_) {
      executed_ = true;
      std::vector<Oid> types;
      std::vector<const char*> values;
      std::vector<int> lengths, formats;
      for (const Param& p : params_) {
        types.push_back(p.type);
        values.push_back(p.null ? nullptr : p.value.data());
        lengths.push_back(static_cast<int>(p.value.size()));
        formats.push_back(1);
      }
      for (int attempt = 1;; ++attempt) {
        WEIR_RETURN_IF_ERROR(owner_->EnsureConnected(what));
        res_ = PQexecParams(owner_->conn(), sql_.c_str(), static_cast<int>(params_.size()), types.data(),
                            values.data(), lengths.data(), formats.data(), /*resultFormat=*/1);
        const ExecStatusType s = res_ != nullptr ? PQresultStatus(res_) : PGRES_FATAL_ERROR;
        if (s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK) break;
        // A read outside a transaction on a connection the server ended:
        // once more on a new one (it changes nothing, so it may run twice).
        const bool again = attempt == 1 && sql_.starts_with("SELECT") && owner_->BrokenOutsideTransaction();
        Status st = again ? Status::Ok() : owner_->ResultError(res_, what);
        PQclear(res_);
        res_ = nullptr;
        if (!again) return st;
      }
    }
    if (res_ == nullptr) return false;
    ++row_;
    return row_ < PQntuples(res_);
  }
  int64_t Changes() const override {
    const char* n = res_ != nullptr ? PQcmdTuples(res_) : "";
    return *n != '\0' ? std::strtoll(n, nullptr, 10) : 0;
  }

  int64_t ColInt(int c) const override {
    if (ColNull(c)) return 0;
    const char* p = PQgetvalue(res_, row_, c);
    const int n = PQgetlength(res_, row_, c);
    switch (PQftype(res_, c)) {  // two's complement, big-endian
      case kInt8Oid:
        return n == 8 ? static_cast<int64_t>(LoadBE64(p)) : 0;
      case kInt4Oid:
        return n == 4 ? static_cast<int32_t>(LoadBE32(p)) : 0;
      case kInt2Oid:
        return n == 2 ? static_cast<int16_t>(LoadBE16(p)) : 0;
      case kBoolOid:
        return n == 1 && p[0] != 0 ? 1 : 0;
      default:
        return 0;
    }
  }
  bool ColNull(int c) const override { return res_ == nullptr || PQgetisnull(res_, row_, c) != 0; }
  std::string ColBytes(int c) const override {
    if (ColNull(c)) return {};
    return std::string(PQgetvalue(res_, row_, c), static_cast<size_t>(PQgetlength(res_, row_, c)));
  }

  void Reset() override {
    PQclear(res_);
    res_ = nullptr;
    row_ = -1;
    executed_ = false;
    borrowed_ = false;
    params_.clear();
  }

 private:
  struct Param {
    Oid type = kByteaOid;  // a parameter the statement does not bind: a NULL bytea
    bool null = true;
    std::string value;
  };
  Param& At(int i) {
    if (params_.size() < static_cast<size_t>(i)) params_.resize(static_cast<size_t>(i));
    return params_[static_cast<size_t>(i) - 1];
  }

  PostgresDb* const owner_;
  const std::string sql_;  // with $N parameters
  std::vector<Param> params_;
  PGresult* res_ = nullptr;
  int row_ = -1;
  bool executed_ = false;
  bool borrowed_ = false;
};

Result<SqlStatement*> PostgresDb::Prepare(const char* sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    it = statements_.emplace(sql, std::make_unique<Statement>(this, Renumber(sql))).first;
  } else if (it->second->borrowed()) {
    return Internal("{} {}: statement \"{}\" is already in use", kind_, describe_, sql);
  }
  it->second->Borrow();
  return static_cast<SqlStatement*>(it->second.get());
}

Status PostgresDb::EnsureConnected(std::string_view what) {
  if (PQstatus(conn_) == CONNECTION_OK && !reconnect_) return Status::Ok();
  if (in_transaction_) {
    return Unavailable("{} {}: {}: the connection broke inside a transaction (retry)", kind_, describe_, what);
  }
  reconnect_ = false;
  PQreset(conn_);
  if (PQstatus(conn_) != CONNECTION_OK) {
    return Unavailable("{} {}: {}: reconnect: {} (retry)", kind_, describe_, what, Trimmed(PQerrorMessage(conn_)));
  }
  Status configured = Configure();
  if (!configured.ok()) reconnect_ = true;  // not used without its settings: the next call tries again
  return configured;
}

Status PostgresDb::ResultError(const PGresult* res, std::string_view what) const {
  std::string message = res != nullptr ? Trimmed(PQresultErrorMessage(res)) : "";
  if (message.empty()) message = Trimmed(PQerrorMessage(conn_));
  const std::string text = fmt::format("{} {}: {}: {}", kind_, describe_, what, message);
  if (PQstatus(conn_) != CONNECTION_OK) {
    return Unavailable("{} (the connection broke; the next call reconnects)", text);
  }
  const char* state = res != nullptr ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  // A server that became a standby (a failover): the next call connects again,
  // to whichever host is the primary then.
  if (state != nullptr && std::string_view(state) == "25006") reconnect_ = true;
  return FromSqlState(state != nullptr ? state : "", text);
}

Status PostgresDb::Begin(std::string_view what) {
  // READ COMMITTED whatever the database's default: each statement then sees
  // every commit made before the writers' lock was granted.
  const std::string begin = fmt::format("{}: begin", what);
  Status begun = Exec("BEGIN ISOLATION LEVEL READ COMMITTED", begin);
  // A BEGIN on a connection the server ended (a restart, a failover, an
  // idle timeout) changed nothing: once more on a new connection, so the
  // call does not fail for it.
  if (!begun.ok() && BrokenOutsideTransaction()) begun = Exec("BEGIN ISOLATION LEVEL READ COMMITTED", begin);
  WEIR_RETURN_IF_ERROR(begun);
  in_transaction_ = true;
  WEIR_ASSIGN_OR_RETURN(SqlStatement * lock, Prepare(kTakeWriterLock));
  // Given back however this ends (also by a bad_alloc): a statement left
  // borrowed would fail every later transaction.
  struct GiveBack {
    SqlStatement* stmt;
    ~GiveBack() { stmt->Reset(); }
  } give_back{lock};
  auto taken = lock->Step(fmt::format("{}: take the writers' lock", what));
  if (!taken.ok()) {
    RollbackIfActive();
    return taken.status();
  }
  return Status::Ok();
}

Status PostgresDb::Commit(std::string_view what) {
  in_transaction_ = false;
  // A statement timeout that cancels a COMMIT's wait for a synchronous
  // standby leaves it committed locally and answers success with only a
  // warning: no timeout for the COMMIT. (If the transaction failed, this SET
  // fails too, and the COMMIT rolls back as before.)
  PQclear(PQexec(conn_, "SET LOCAL statement_timeout = 0"));
  PGresult* res = PQexec(conn_, "COMMIT");
  const ExecStatusType s = res != nullptr ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  Status st;
  if (s == PGRES_COMMAND_OK) {
    // COMMIT of a failed transaction succeeds as a ROLLBACK.
    if (std::string_view(PQcmdStatus(res)) != "COMMIT") {
      st = Internal("{} {}: {}: commit: the transaction had failed and was rolled back", kind_, describe_, what);
    }
  } else if (PQstatus(conn_) != CONNECTION_OK) {
    st = Unavailable("{} {}: {}: commit: {}; the connection broke, so whether it committed is unknown",
                     kind_, describe_, what, Trimmed(PQerrorMessage(conn_)));
  } else if (res == nullptr) {
    // No result (libpq out of memory): the COMMIT may not have been sent,
    // leaving the transaction open on the server. The next call connects
    // again, which ends it there (rolled back unless it had committed).
    reconnect_ = true;
    st = Unavailable("{} {}: {}: commit: no result ({}); whether it committed is unknown", kind_, describe_, what,
                     Trimmed(PQerrorMessage(conn_)));
  } else {
    st = ResultError(res, fmt::format("{}: commit", what));
  }
  PQclear(res);
  return st;
}

namespace {

// Opens a connection to `uri` with weir's defaults and session settings;
// `kind` ("metastore", "WAL store") names it in errors.
Result<std::unique_ptr<PostgresDb>> Connect(std::string_view uri, const std::string& kind) {
  const std::string text(uri);
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(text.c_str(), &error);
  if (options == nullptr) {
    const std::string why = error != nullptr ? WithoutPassword(Trimmed(error), uri) : "out of memory";
    PQfreemem(error);
    return InvalidArgument("{} URI: {} (expected postgres://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE)", kind, why);
  }
  std::vector<std::string> keys, values;
  std::unordered_map<std::string, std::string> given;
  for (const PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    keys.emplace_back(o->keyword);
    values.emplace_back(o->val);
    given[o->keyword] = o->val;
  }
  PQconninfoFree(options);
  for (const auto& [key, value] : kDefaultParams) {
    if (given.count(key) != 0) continue;
    keys.emplace_back(key);
    values.emplace_back(value);
  }
  // Described without the password.
  const std::string& user = given["user"];
  const std::string& port = given["port"];
  const std::string describe = fmt::format("postgres://{}{}{}{}/{}", user.empty() ? "" : user + "@", given["host"],
                                           port.empty() ? "" : ":", port, given["dbname"]);

  std::vector<const char*> key_ptrs, value_ptrs;
  for (size_t i = 0; i < keys.size(); ++i) {
    key_ptrs.push_back(keys[i].c_str());
    value_ptrs.push_back(values[i].c_str());
  }
  key_ptrs.push_back(nullptr);
  value_ptrs.push_back(nullptr);
  PGconn* conn = PQconnectdbParams(key_ptrs.data(), value_ptrs.data(), /*expand_dbname=*/0);
  if (conn == nullptr) return ResourceExhausted("{} {}: connect: out of memory", kind, describe);
  if (PQstatus(conn) != CONNECTION_OK) {
    const std::string why = WithoutPassword(Trimmed(PQerrorMessage(conn)), uri);
    PQfinish(conn);
    return Unavailable("{} {}: connect: {}", kind, describe, why);
  }
  std::unique_ptr<PostgresDb> driver;
  try {
    driver = std::make_unique<PostgresDb>(conn, describe, kind);
  } catch (...) {
    PQfinish(conn);
    throw;
  }
  WEIR_RETURN_IF_ERROR(driver->Configure());
  return driver;
}

}  // namespace

Result<std::shared_ptr<SqlMetastore>> OpenPostgresMetastore(std::string_view uri) {
  try {
    WEIR_ASSIGN_OR_RETURN(auto driver, Connect(uri, "metastore"));
    return SqlMetastore::Open(std::move(driver));
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("metastore postgres: open: out of memory");
  } catch (const std::exception& e) {
    return Internal("metastore postgres: open: unexpected exception: {}", e.what());
  }
}

// ---- the WAL store ----------------------------------------------------------

namespace {

constexpr const char kWalCreate[] = "CREATE TABLE IF NOT EXISTS weir_wal(key BYTEA PRIMARY KEY, body BYTEA NOT NULL)";
// Uncompressed out of line: a ranged read fetches only its chunks. Set once
// (the ALTER locks the table against every node's WAL).
constexpr const char kWalStorage[] =
    "SELECT attstorage FROM pg_attribute WHERE attrelid = to_regclass('weir_wal') AND attname = 'body'";
constexpr const char kWalSetStorage[] = "ALTER TABLE weir_wal ALTER COLUMN body SET STORAGE EXTERNAL";
// Every WAL connection: a commit acknowledged is durable (and, with
// synchronous standbys, on them), whatever the server's or role's default;
// no statement timeout cancels a commit's wait for a standby (which would
// report success with a warning).
constexpr const char* kWalSessionSettings[] = {
    "SET synchronous_commit = on",
    "SET statement_timeout = 0",
};
constexpr const char kWalInsert[] = "INSERT INTO weir_wal(key, body) VALUES (?1, ?2)";
constexpr const char kWalUpsert[] =
    "INSERT INTO weir_wal(key, body) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET body = EXCLUDED.body";
constexpr const char kWalGet[] = "SELECT body FROM weir_wal WHERE key = ?1";
// PostgreSQL's substr counts from 1; the length comes along to tell a range
// past the end from a missing row.
constexpr const char kWalGetRange[] =
    "SELECT substr(body, (?2)::int, (?3)::int), octet_length(body) FROM weir_wal WHERE key = ?1";
constexpr const char kWalHead[] = "SELECT octet_length(body) FROM weir_wal WHERE key = ?1";
constexpr const char kWalList[] =
    "SELECT key, octet_length(body) FROM weir_wal WHERE key >= ?1 AND key > ?2 AND (?3::bytea IS NULL OR key < ?3) "
    "ORDER BY key LIMIT ?4";
constexpr const char kWalDelete[] = "DELETE FROM weir_wal WHERE key = ?1";

// The smallest key greater than every key with `prefix`, if there is one.
std::optional<std::string> PrefixEnd(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  if (prefix.empty()) return std::nullopt;
  prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
  return prefix;
}

// The WAL store on PostgreSQL. Ownership: shared (the engine, the WAL
// writer). Threads: any; each call borrows a connection of its own from a
// pool (up to `connections`, opened as needed). Guarantees: ObjectStore's;
// a row is durable once its INSERT is acknowledged (synchronous_commit on).
class PostgresWalStore final : public objstore::ObjectStore {
 public:
  PostgresWalStore(std::string uri, std::string describe, size_t connections)
      : uri_(std::move(uri)), describe_(std::move(describe)), max_(connections) {
    idle_.reserve(max_);  // giving a connection back never allocates
  }

  Status Put(std::string_view key, std::string_view data, const objstore::PutOptions& options) override {
    WEIR_RETURN_IF_ERROR(objstore::ValidateKey(key));
    return With([&](PostgresDb& db) -> Status {
      WEIR_ASSIGN_OR_RETURN(SqlStatement * st, db.Prepare(options.if_none_match ? kWalInsert : kWalUpsert));
      st->BindText(1, key);
      st->BindBlob(2, data);
      auto done = st->Step("put");
      st->Reset();
      if (!done.ok() && done.status().code() == Code::kAlreadyExists) {
        return PreconditionFailed("{} exists in {}", key, describe_);
      }
      return done.status();
    });
  }

  Result<std::string> Get(std::string_view key, std::optional<objstore::ByteRange> range) override {
    WEIR_RETURN_IF_ERROR(objstore::ValidateKey(key));
    Result<std::string> out = Status();
    Status st = With([&](PostgresDb& db) -> Status {
      WEIR_ASSIGN_OR_RETURN(SqlStatement * q, db.Prepare(range ? kWalGetRange : kWalGet));
      q->BindText(1, key);
      if (range) {
        // Past INT32_MAX the object cannot reach: rows are at most 1 GB.
        q->BindInt(2, static_cast<int64_t>(std::min<uint64_t>(range->offset, INT32_MAX - 1)) + 1);
        q->BindInt(3, static_cast<int64_t>(std::min<uint64_t>(range->length, INT32_MAX)));
      }
      auto row = q->Step("get");
      if (!row.ok() || !*row) {
        q->Reset();
        if (!row.ok()) return row.status();
        out = NotFound("{} does not exist in {}", key, describe_);
        return Status::Ok();
      }
      std::string bytes = q->ColBytes(0);
      const int64_t size = range ? q->ColInt(1) : static_cast<int64_t>(bytes.size());
      q->Reset();
      if (range && range->offset >= static_cast<uint64_t>(size) && !(size == 0 && range->offset == 0)) {
        out = OutOfRange("{}: range starts at {}, past its {} bytes", key, range->offset, size);
      } else {
        out = std::move(bytes);
      }
      return Status::Ok();
    });
    if (!st.ok()) return st;
    return out;
  }

  Result<objstore::ObjectInfo> Head(std::string_view key) override {
    WEIR_RETURN_IF_ERROR(objstore::ValidateKey(key));
    Result<objstore::ObjectInfo> out = Status();
    Status st = With([&](PostgresDb& db) -> Status {
      WEIR_ASSIGN_OR_RETURN(SqlStatement * q, db.Prepare(kWalHead));
      q->BindText(1, key);
      auto row = q->Step("head");
      const bool found = row.ok() && *row;
      const int64_t size = found ? q->ColInt(0) : 0;
      q->Reset();
      if (!row.ok()) return row.status();
      if (!found) {
        out = NotFound("{} does not exist in {}", key, describe_);
      } else {
        out = objstore::ObjectInfo{std::string(key), static_cast<uint64_t>(size)};
      }
      return Status::Ok();
    });
    if (!st.ok()) return st;
    return out;
  }

  Result<objstore::ListPage> List(std::string_view prefix, std::string_view start_after, size_t max_keys) override {
    if (max_keys < 1 || max_keys > 1000) return InvalidArgument("list: max_keys {} is not 1..1000", max_keys);
    objstore::ListPage page;
    const std::optional<std::string> end = PrefixEnd(std::string(prefix));
    Status st = With([&](PostgresDb& db) -> Status {
      page.objects.clear();
      WEIR_ASSIGN_OR_RETURN(SqlStatement * q, db.Prepare(kWalList));
      q->BindText(1, prefix);
      q->BindText(2, start_after);
      if (end) {
        q->BindBlob(3, *end);
      } else {
        q->BindNull(3);
      }
      q->BindInt(4, static_cast<int64_t>(max_keys) + 1);  // one more says whether more follow
      while (true) {
        auto row = q->Step("list");
        if (!row.ok()) {
          q->Reset();
          return row.status();
        }
        if (!*row) break;
        page.objects.push_back(objstore::ObjectInfo{q->ColBytes(0), static_cast<uint64_t>(q->ColInt(1))});
      }
      q->Reset();
      return Status::Ok();
    });
    if (!st.ok()) return st;
    if (page.objects.size() > max_keys) {
      page.objects.pop_back();
      page.next_start_after = page.objects.back().key;
    }
    return page;
  }

  Status Delete(std::string_view key) override {
    WEIR_RETURN_IF_ERROR(objstore::ValidateKey(key));
    return With([&](PostgresDb& db) -> Status {
      WEIR_ASSIGN_OR_RETURN(SqlStatement * q, db.Prepare(kWalDelete));
      q->BindText(1, key);
      auto done = q->Step("delete");
      q->Reset();
      return done.status();
    });
  }

  Status DeleteMany(std::span<const std::string> keys) override {
    Status first;
    for (const std::string& key : keys) {
      Status st = Delete(key);
      if (!st.ok() && first.ok()) first = st;
    }
    return first;
  }

  std::string Describe() const override { return describe_; }
  size_t PreferredParallelPuts() const override { return max_; }

  // Takes the first connection, and makes the table unless it is there as
  // it should be: under the writers' lock (two starts at once would race in
  // CREATE TABLE), and only then (PostgreSQL checks CREATE on the schema
  // before IF NOT EXISTS, and the ALTER locks the table).
  Status Init(std::unique_ptr<PostgresDb> db) {
    auto storage = [&]() -> Result<std::string> {
      WEIR_ASSIGN_OR_RETURN(SqlStatement * q, db->Prepare(kWalStorage));
      auto row = q->Step("read the WAL table's storage");
      const std::string got = row.ok() && *row ? q->ColBytes(0) : "";  // "": no table
      q->Reset();
      WEIR_RETURN_IF_ERROR(row.status());
      return got;
    };
    WEIR_ASSIGN_OR_RETURN(const std::string found, storage());
    if (found.empty()) {
      WEIR_RETURN_IF_ERROR(db->Begin("create the WAL table"));
      Status st = [&]() -> Status {
        WEIR_RETURN_IF_ERROR(db->Exec(kWalCreate, "create the WAL table"));
        WEIR_ASSIGN_OR_RETURN(const std::string now, storage());
        if (now != "e") WEIR_RETURN_IF_ERROR(db->Exec(kWalSetStorage, "store WAL bodies uncompressed"));
        return db->Commit("create the WAL table");
      }();
      if (!st.ok()) {
        db->RollbackIfActive();
        return st;
      }
    } else if (found != "e") {
      // Made beforehand another way: served as it is if this role may not change it.
      if (Status st = db->Exec(kWalSetStorage, "store WAL bodies uncompressed"); !st.ok()) {
        Log().warn("WAL store {}: weir_wal's bodies stay stored as they are ({}); ranged reads fetch whole rows",
                   describe_, st.message());
      }
    }
    std::lock_guard lk(mu_);
    idle_.push_back(std::move(db));
    open_ = 1;
    return Status::Ok();
  }

 private:
  // Runs fn on a connection of its own: an idle one, a new one while fewer
  // than max_ are open, or the next one given back.
  template <typename Fn>
  Status With(Fn&& fn) {
    std::unique_ptr<PostgresDb> db;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return !idle_.empty() || open_ < max_; });
      if (!idle_.empty()) {
        db = std::move(idle_.back());
        idle_.pop_back();
      } else {
        ++open_;
      }
    }
    // Gives the connection back, or its place in the pool if there is none
    // (a failed connect, an exception).
    struct GiveBack {
      PostgresWalStore* pool;
      std::unique_ptr<PostgresDb>* db;
      ~GiveBack() {
        {
          std::lock_guard lk(pool->mu_);
          if (*db) {
            pool->idle_.push_back(std::move(*db));
          } else {
            --pool->open_;
          }
        }
        pool->cv_.notify_one();
      }
    } give_back{this, &db};
    try {
      if (!db) {
        auto made = Connect(uri_, "WAL store");
        if (!made.ok()) return made.status();
        WEIR_RETURN_IF_ERROR((*made)->AddSettings({std::begin(kWalSessionSettings), std::end(kWalSessionSettings)}));
        db = std::move(*made);
      }
      return fn(*db);
    } catch (const std::bad_alloc&) {
      db.reset();  // in an unknown state
      return ResourceExhausted("WAL store {}: out of memory", describe_);
    } catch (const std::exception& e) {
      db.reset();
      return Internal("WAL store {}: unexpected exception: {}", describe_, e.what());
    }
  }

  const std::string uri_;
  const std::string describe_;
  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<PostgresDb>> idle_;
  size_t open_ = 0;  // idle or borrowed
};

}  // namespace

Result<std::shared_ptr<objstore::ObjectStore>> OpenPostgresWalStore(std::string_view uri, size_t connections) {
  if (connections == 0) return InvalidArgument("a WAL store on PostgreSQL needs a connection at least");
  try {
    WEIR_ASSIGN_OR_RETURN(auto first, Connect(uri, "WAL store"));
    WEIR_RETURN_IF_ERROR(first->AddSettings({std::begin(kWalSessionSettings), std::end(kWalSessionSettings)}));
    auto store = std::make_shared<PostgresWalStore>(std::string(uri), first->Describe(), connections);
    WEIR_RETURN_IF_ERROR(store->Init(std::move(first)));
    return std::shared_ptr<objstore::ObjectStore>(std::move(store));
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("WAL store postgres: open: out of memory");
  } catch (const std::exception& e) {
    return Internal("WAL store postgres: open: unexpected exception: {}", e.what());
  }
}

}  // namespace weir::metastore
