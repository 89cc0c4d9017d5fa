// The S3 server of the tests: the s3 CTest fixture (tests/s3/ceph-s3-start.sh)
// starts radosgw and writes a KEY=VALUE file; tests that run on s3:// get its
// path in WEIR_TEST_S3_ENV. Without it they run on mem:// only.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include <fmt/format.h>

#include "objstore/mem_store.h"
#include "objstore/s3_store.h"

namespace weir::testing {

struct S3TestEnv {
  std::string endpoint, access_key, secret_key, region, bucket;
};

// The fixture's server, or nullopt when WEIR_TEST_S3_ENV is unset (aborts the
// test program if it is set but unreadable: a broken fixture must not pass).
inline std::optional<S3TestEnv> LoadS3TestEnv() {
  const char* path = ::getenv("WEIR_TEST_S3_ENV");
  if (path == nullptr || *path == '\0') return std::nullopt;
  std::ifstream in(path);
  S3TestEnv env;
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = line.substr(0, eq), value = line.substr(eq + 1);
    if (name == "S3_ENDPOINT") env.endpoint = value;
    if (name == "AWS_ACCESS_KEY_ID") env.access_key = value;
    if (name == "AWS_SECRET_ACCESS_KEY") env.secret_key = value;
    if (name == "AWS_DEFAULT_REGION") env.region = value;
    if (name == "S3_BUCKET") env.bucket = value;
  }
  if (env.endpoint.empty() || env.access_key.empty() || env.secret_key.empty()) {
    fmt::print(stderr, "WEIR_TEST_S3_ENV={} does not describe an S3 server\n", path);
    ::abort();
  }
  if (env.region.empty()) env.region = "us-east-1";
  return env;
}

inline S3TestEnv MustLoadS3TestEnv() {
  static const std::optional<S3TestEnv> env = LoadS3TestEnv();
  if (!env) {
    fmt::print(stderr, "this test needs WEIR_TEST_S3_ENV (run it through CTest's s3 fixture)\n");
    ::abort();
  }
  return *env;
}

// Options for the fixture's server, bucket `bucket`, no probe.
inline objstore::S3Options S3TestOptions(const S3TestEnv& env, const std::string& bucket,
                                         const std::string& prefix = "") {
  objstore::S3Options o;
  o.bucket = bucket;
  o.prefix = prefix;
  o.endpoint = env.endpoint;
  o.region = env.region;
  o.access_key = env.access_key;
  o.secret_key = env.secret_key;
  o.probe_conditional_put = false;
  return o;
}

// A name for a bucket of one's own: "weir-t-<pid>-<n>-<random>".
inline std::string FreshBucketName() {
  static std::atomic<int> n{0};
  static const uint32_t salt = std::random_device{}();
  return fmt::format("weir-t-{}-{}-{:08x}", ::getpid(), n.fetch_add(1), salt);
}

// Empties the store's prefix (the whole bucket when it has none).
inline Status PurgeS3Store(objstore::S3Store& store) {
  while (true) {
    auto page = store.List("", {}, 1000);
    if (!page.ok()) return page.status();
    if (page->objects.empty()) return Status::Ok();
    std::vector<std::string> keys;
    for (const auto& o : page->objects) keys.push_back(o.key);
    WEIR_RETURN_IF_ERROR(store.DeleteMany(keys));
  }
}

// A store on a fresh bucket of the fixture's server, with the conditional-PUT
// probe run. When the last reference goes, its objects and bucket are deleted
// (radosgw keeps everything in RAM).
inline Result<std::shared_ptr<objstore::S3Store>> NewS3TestStore(const S3TestEnv& env) {
  auto opened = objstore::OpenS3Store(S3TestOptions(env, FreshBucketName()));
  if (!opened.ok()) return opened.status();
  std::shared_ptr<objstore::S3Store> store = *opened;
  WEIR_RETURN_IF_ERROR(store->CreateBucket());
  WEIR_RETURN_IF_ERROR(store->ProbeConditionalPut());
  return std::shared_ptr<objstore::S3Store>(store.get(), [store](objstore::S3Store*) mutable {
    if (PurgeS3Store(*store).ok()) store->DeleteBucket().IgnoreError();
    store.reset();
  });
}

// The store a backend-neutral test runs on: a fresh s3:// bucket under the
// fixture, else a fresh mem:// store.
inline std::shared_ptr<objstore::ObjectStore> NewTestStore() {
  static const std::optional<S3TestEnv> env = LoadS3TestEnv();
  if (!env) return objstore::NewMemStore();
  auto store = NewS3TestStore(*env);
  if (!store.ok()) {
    fmt::print(stderr, "cannot create an s3:// test store: {}\n", store.status().ToString());
    ::abort();
  }
  return *store;
}

// Whether NewTestStore returns s3:// stores in this run.
inline bool TestStoreIsS3() { return LoadS3TestEnv().has_value(); }

}  // namespace weir::testing
