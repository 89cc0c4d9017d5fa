// Generic test helpers: Status assertions, printable codes, temp dirs.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

#include "base/status.h"

namespace weir {
// Lets gtest print codes by name in failed EXPECT_EQs.
inline void PrintTo(Code code, std::ostream* os) { *os << CodeName(code); }
}  // namespace weir

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const ::weir::Status _st = (expr);                        \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st.ToString(); \
  } while (0)
#define EXPECT_OK(expr)                                       \
  do {                                                        \
    const ::weir::Status _st = (expr);                        \
    EXPECT_TRUE(_st.ok()) << #expr << ": " << _st.ToString(); \
  } while (0)
// Declares `lhs` from a Result, failing the test if it is an error.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSERT_OK_AND_ASSIGN_IMPL(WEIR_CONCAT(_res_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)                    \
  auto tmp = (expr);                                                 \
  ASSERT_TRUE(tmp.ok()) << #expr << ": " << tmp.status().ToString(); \
  lhs = std::move(tmp).value()

namespace weir::testing {

// A fresh directory under /tmp, removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "weir-test") {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace weir::testing
