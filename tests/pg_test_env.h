// The PostgreSQL server of the tests: the pg CTest fixture (tests/pg/pg-start.sh)
// starts one and writes a file with a line POSTGRES_URI=...; tests that run on
// postgres:// get its path in WEIR_TEST_POSTGRES_ENV. Without it they skip.
#pragma once

#include <libpq-fe.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace weir::testing {

// The fixture's server: "postgres://weir@127.0.0.1:PORT/postgres", or "" when
// WEIR_TEST_POSTGRES_ENV is unset (aborts if it is set but unreadable: a
// broken fixture must not pass as skipped).
inline std::string PostgresBaseUri() {
  const char* path = ::getenv("WEIR_TEST_POSTGRES_ENV");
  if (path == nullptr || *path == '\0') return "";
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("POSTGRES_URI=")) return line.substr(std::string_view("POSTGRES_URI=").size());
  }
  fmt::print(stderr, "WEIR_TEST_POSTGRES_ENV={} names no POSTGRES_URI\n", path);
  ::abort();
}

// Runs one statement on the server at `uri`; false, and a test failure, if it fails.
inline bool PostgresExec(const std::string& uri, const std::string& sql) {
  PGconn* conn = PQconnectdb(uri.c_str());
  bool ok = PQstatus(conn) == CONNECTION_OK;
  if (!ok) {
    ADD_FAILURE() << uri << ": " << PQerrorMessage(conn);
  } else {
    PGresult* res = PQexec(conn, sql.c_str());
    const ExecStatusType st = PQresultStatus(res);
    ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok) ADD_FAILURE() << sql << ": " << PQresultErrorMessage(res);
    PQclear(res);
  }
  PQfinish(conn);
  return ok;
}

}  // namespace weir::testing
