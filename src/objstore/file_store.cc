// file://DIR: one regular file per key under DIR, published atomically from a
// fsynced temp file in DIR/.weir-tmp.
#include "objstore/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/fs.h"
#include "base/log.h"
#include "objstore/internal.h"

namespace weir::objstore {

namespace {

using internal::CatchAll;
using internal::QuoteKey;

constexpr std::string_view kTmpDirName = ".weir-tmp";
// Objects at least this large leave the page cache once durable (WriteTemp).
constexpr size_t kDropCacheMinBytes = 64 << 10;
constexpr size_t kMaxSegmentBytes = 255;  // NAME_MAX on the filesystems we target
// Temp files older than this at open are leftovers of a crashed writer.
constexpr auto kStaleTmpAge = std::chrono::hours(1);
// Deleted objects up to this size are kept as free files and rewritten by a
// later Put instead of creating a new file (see FileStore). The pool is
// bounded by count and bytes; a free file is reused only after a quarantine,
// so that any reader still holding it sees its ctime move (see DoGet).
constexpr size_t kFreeFileMaxBytes = 8 << 20;
constexpr size_t kFreePoolMaxFiles = 4096;
constexpr size_t kFreePoolMaxBytes = 256 << 20;
constexpr auto kFreeFileQuarantine = std::chrono::milliseconds(250);

// SetFileStoreReadHookForTest: checked with one atomic load per Get.
std::atomic<bool> g_read_hook_set{false};
std::function<void(const std::string&)>& ReadHook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

// SetFileStoreDirSyncHookForTest: likewise, one atomic load per directory sync.
std::atomic<bool> g_dir_sync_hook_set{false};
std::function<Status(const std::string&)>& DirSyncHook() {
  static std::function<Status(const std::string&)> hook;
  return hook;
}

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

template <typename F>
auto RetryEintr(F&& f) {
  while (true) {
    auto r = f();
    if (r == -1 && errno == EINTR) continue;
    return r;
  }
}

// Owns one file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = other.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  // Closes now; returns close(2)'s result (no retry: Linux closes even on EINTR).
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

// flock(2) failed because the file system has no locks, not because of a holder.
bool LocksUnsupported(int err) { return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL; }

// The file whose flock marks the store of that salt as alive (OwnerLock).
std::string OwnerFileName(uint64_t salt) { return fmt::format("owner-{:016x}", salt); }
// A temp file of the store whose owner file is OwnerFileName(salt).
std::string TempFileName(uint64_t salt, uint64_t n) { return fmt::format("tmp-{:016x}-{}.tmp", salt, n); }

// Owns a DIR* from fdopendir.
struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

// Writes the concatenation of `parts` with writev, IOV_MAX buffers at a time.
Status WriteAll(int fd, std::span<const std::string_view> parts, std::string_view path) {
  std::vector<iovec> iov;
  iov.reserve(std::min<size_t>(parts.size(), IOV_MAX));
  size_t next = 0;  // first part not yet in iov
  while (true) {
    while (next < parts.size() && iov.size() < IOV_MAX) {
      if (!parts[next].empty()) {
        iov.push_back(iovec{const_cast<char*>(parts[next].data()), parts[next].size()});
      }
      ++next;
    }
    if (iov.empty()) return Status::Ok();
    const ssize_t n = ::writev(fd, iov.data(), static_cast<int>(iov.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path);
    }
    if (n == 0) return IOError("write {}: no progress", path);
    // Drop what was written, keeping a partly written buffer's rest.
    auto left = static_cast<size_t>(n);
    size_t done = 0;
    while (done < iov.size() && left >= iov[done].iov_len) left -= iov[done++].iov_len;
    if (done < iov.size()) {
      iov[done].iov_base = static_cast<char*>(iov[done].iov_base) + left;
      iov[done].iov_len -= left;
    }
    iov.erase(iov.begin(), iov.begin() + static_cast<std::ptrdiff_t>(done));
  }
}

Status Fsync(int fd, std::string_view path) {
  if (RetryEintr([&] { return ::fsync(fd); }) != 0) return ErrnoStatus(errno, "fsync", path);
  return Status::Ok();
}

// weir::FsyncDir behind the test hook.
Status FsyncDir(const std::string& path) {
  if (g_dir_sync_hook_set.load(std::memory_order_acquire)) WEIR_RETURN_IF_ERROR(DirSyncHook()(path));
  return weir::FsyncDir(path);
}

// FsyncDir, saying whether fsync(2) itself failed (`*sync_failed`; the test
// hook's failures count as such) rather than the open; with `if_any`, a
// directory that does not exist is fine (nothing in it to make durable).
Status SyncDirTelling(const std::string& path, bool if_any, bool* sync_failed) {
  *sync_failed = false;
  if (g_dir_sync_hook_set.load(std::memory_order_acquire)) {
    Status st = DirSyncHook()(path);
    *sync_failed = !st.ok();
    WEIR_RETURN_IF_ERROR(st);
  }
  Fd fd(RetryEintr([&] { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); }));
  if (!fd.valid()) {
    if (if_any && (errno == ENOENT || errno == ENOTDIR)) return Status::Ok();
    return ErrnoStatus(errno, "open directory", path);
  }
  Status st = Fsync(fd.get(), path);
  *sync_failed = !st.ok();
  return st;
}

std::string_view ParentOf(std::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return {};
  return slash == 0 ? path.substr(0, 1) : path.substr(0, slash);
}

// Whether `dir` (a prefix's directory part, "" or ending in '/') could name a
// directory of keys: valid segments and not the reserved temp dir.
bool IsListableDir(std::string_view dir) {
  if (dir.empty()) return true;
  dir.remove_suffix(1);  // the trailing '/'
  if (dir.find('\0') != std::string_view::npos) return false;
  if (!ValidateKey(dir).ok()) return false;
  return dir.substr(0, dir.find('/')) != kTmpDirName;
}

// FileStore: owned by its shared_ptr holders; called from any thread. Objects
// are immutable files replaced by link/rename, so readers see old or new bytes;
// a successful Put is fsynced (file, and every directory entry leading to it).
// Other processes may use the same DIR: nothing relies on in-process locking
// for correctness; the directory cache only skips redundant mkdir/fsync work.
//
// Free files: Delete renames a small object into the temp dir instead of
// unlinking it, and a later Put rewrites that file in place (same inode)
// before linking it under its new key. Allocating a fresh inode per object
// is the largest single cost of a small PUT on some file systems (ext4
// without a journal steps over every inode of the group deleted in the last
// one to six minutes), and each unlink adds to that cost for minutes: the
// pool is sized to take every slot a busy WAL deletes (a quarantine's worth
// at several hundred MB/s), so slots hardly allocate or free inodes. It is
// in-memory only: free files of an earlier process are never reused, since
// a crash between link and unlink can leave a temp name on a live object.
// A file joins it only once its removal is synced (PoolFreeFiles).
// Readers stay safe without locks: a free file is rewritten only after a
// quarantine (250 ms), so a read done within half of that counts, and a
// slower one is redone if the file's ctime moved or its key no longer names it.
class FileStore final : public ObjectStore {
 public:
  // `owner` is the locked owner file (OwnerLock) naming this store's free files.
  FileStore(std::string root, uint64_t salt, Fd owner)
      : root_(std::move(root)), tmp_dir_(Join(root_, kTmpDirName)), salt_(salt), owner_(std::move(owner)) {}
  ~FileStore() override {
    for (const FreeFile& f : free_) ::unlink(f.path.c_str());
    ::unlink(Join(tmp_dir_, OwnerFileName(salt_)).c_str());  // before owner_'s lock is released
  }
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  Status Put(std::string_view key, std::string_view data, const PutOptions& options) override {
    return CatchAll("file:// Put", [&] { return DoPut(key, std::span(&data, 1), options); });
  }

  Status PutParts(std::string_view key, std::span<const std::string_view> parts,
                  const PutOptions& options) override {
    return CatchAll("file:// Put", [&] { return DoPut(key, parts, options); });
  }

  // The store refuses writes and deletes once a directory sync failed: the
  // kernel may have dropped the entries that sync was to make durable, and
  // a later sync (on a new descriptor) reports only errors after its open,
  // so a retried create-only PUT could find its own unsynced link, have it
  // "synced", and answer "exists" for an object a crash then loses (as
  // PostgreSQL stops on a failed fsync). Reads go on; a restart (a new
  // store) resumes writing. Any thread.
  Status Failed() const {
    if (!sync_failed_.load(std::memory_order_acquire)) return Status::Ok();
    std::lock_guard lock(failed_mu_);
    return IOError(
        "file://{}: refusing writes since a directory sync failed ({}): a later sync could report success without "
        "making the earlier change durable; restart weir once the file system is sound",
        root_, failed_why_);
  }

  Result<std::string> Get(std::string_view key, std::optional<ByteRange> range) override {
    return CatchAll("file:// Get", [&] { return DoGet(key, range); });
  }

  Result<ObjectInfo> Head(std::string_view key) override {
    return CatchAll("file:// Head", [&]() -> Result<ObjectInfo> {
      WEIR_RETURN_IF_ERROR(CheckKey(key));
      const std::string path = Join(root_, key);
      struct stat st{};
      if (RetryEintr([&] { return ::stat(path.c_str(), &st); }) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return NotFoundError(key);
        return ErrnoStatus(errno, "stat", path);
      }
      if (!S_ISREG(st.st_mode)) return NotFoundError(key);
      return ObjectInfo{std::string(key), static_cast<uint64_t>(st.st_size)};
    });
  }

  Result<ListPage> List(std::string_view prefix, std::string_view start_after, size_t max_keys) override {
    return CatchAll("file:// List", [&] { return DoList(prefix, start_after, max_keys); });
  }

  // A key already gone is answered only once its parent is synced too: the
  // removal may be a concurrent delete's, or a failed attempt's whose sync
  // failed. A deleted file joins the free pool only once its removal is
  // durable, so a crash can never bring a key back onto a rewritten file.
  Status Delete(std::string_view key) override {
    return CatchAll("file:// Delete", [&]() -> Status {
      std::vector<PendingFree> pending;
      WEIR_RETURN_IF_ERROR(CheckKey(key));
      WEIR_RETURN_IF_ERROR(Failed());
      WEIR_RETURN_IF_ERROR(Unlink(key, &pending));
      Status st = SyncDir(std::string(ParentOf(Join(root_, key))), /*if_any=*/true);
      PoolFreeFiles(std::move(pending), st.ok());
      return st;
    });
  }

  Status DeleteMany(std::span<const std::string> keys) override {
    return CatchAll("file:// DeleteMany", [&]() -> Status {
      WEIR_RETURN_IF_ERROR(Failed());
      Status first;
      std::vector<std::string> dirs;  // parents to fsync once each, at the end
      std::map<std::string, std::vector<PendingFree>> pending;  // by parent
      for (const std::string& key : keys) {
        if (Status st = CheckKey(key); !st.ok()) {
          if (first.ok()) first = std::move(st);
          continue;
        }
        std::string dir(ParentOf(Join(root_, key)));
        Status st = Unlink(key, &pending[dir]);
        if (first.ok() && !st.ok()) first = std::move(st);
        dirs.push_back(std::move(dir));
      }
      std::sort(dirs.begin(), dirs.end());
      dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
      for (const std::string& dir : dirs) {
        Status st = SyncDir(dir, /*if_any=*/true);
        PoolFreeFiles(std::move(pending[dir]), st.ok());
        if (first.ok() && !st.ok()) first = std::move(st);
      }
      return first;
    });
  }

  std::string Describe() const override { return "file://" + root_; }
  std::string Identity() const override {
    struct stat st {};
    if (::stat(root_.c_str(), &st) != 0) return Location();
    return fmt::format("file-device-{}-inode-{}", static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
  }
  size_t PreferredParallelPuts() const override { return 4; }

 private:
  static std::string Join(std::string_view dir, std::string_view rel) {
    std::string out(dir);
    if (out.empty() || out.back() != '/') out += '/';
    out += rel;
    return out;
  }

  Status NotFoundError(std::string_view key) const {
    return NotFound("object {} not found in file://{}", key, root_);
  }

  // ValidateKey plus the file:// rules: the reserved temp dir, NAME_MAX segments.
  static Status CheckKey(std::string_view key) {
    WEIR_RETURN_IF_ERROR(ValidateKey(key));
    size_t start = 0;
    while (start <= key.size()) {
      size_t slash = key.find('/', start);
      if (slash == std::string_view::npos) slash = key.size();
      const std::string_view segment = key.substr(start, slash - start);
      if (start == 0 && segment == kTmpDirName) {
        return InvalidArgument("invalid object key {}: the first segment \".weir-tmp\" is reserved by file://",
                               QuoteKey(key));
      }
      if (segment.size() > kMaxSegmentBytes) {
        return InvalidArgument("invalid object key {}: file:// allows at most {} bytes per path segment",
                               QuoteKey(key), kMaxSegmentBytes);
      }
      start = slash + 1;
    }
    return Status::Ok();
  }

  Status ConflictError(std::string_view key, std::string_view what) const {
    return NotSupported(
        "object {} conflicts with {} in file://{}: a key cannot also be the directory of other keys", key, what,
        root_);
  }

  // mkdir -p of the key directory `rel` ("" is the root). Each directory not yet
  // known is created if needed and its parent fsynced, so its entry is durable
  // even if another thread or process created it and has not synced yet.
  Status EnsureDir(std::string_view key, std::string_view rel) {
    if (rel.empty()) return Status::Ok();
    {
      std::lock_guard lock(dirs_mu_);
      if (known_dirs_.contains(std::string(rel))) return Status::Ok();
    }
    size_t end = 0;
    while (end < rel.size()) {
      end = rel.find('/', end + 1);
      if (end == std::string_view::npos) end = rel.size();
      const std::string sub(rel.substr(0, end));
      {
        std::lock_guard lock(dirs_mu_);
        if (known_dirs_.contains(sub)) continue;
      }
      const std::string path = Join(root_, sub);
      if (::mkdir(path.c_str(), 0755) != 0) {
        if (errno != EEXIST) return ErrnoStatus(errno, "mkdir", path);
        struct stat st{};
        if (RetryEintr([&] { return ::stat(path.c_str(), &st); }) != 0) return ErrnoStatus(errno, "stat", path);
        if (!S_ISDIR(st.st_mode)) return ConflictError(key, fmt::format("object {}", sub));
      }
      WEIR_RETURN_IF_ERROR(SyncDir(std::string(ParentOf(path)), /*if_any=*/false));
      std::lock_guard lock(dirs_mu_);
      known_dirs_.insert(sub);
    }
    return Status::Ok();
  }

  void ForgetDirs() {
    std::lock_guard lock(dirs_mu_);
    known_dirs_.clear();
  }

  // Fills a fsynced temp file, a free file if one is ready (`reuse`), else a
  // new one; returns its path.
  Result<std::string> WriteTemp(std::span<const std::string_view> parts, bool reuse) {
    size_t size = 0;
    for (std::string_view p : parts) size += p.size();
    while (reuse) {
      std::optional<std::string> free = TakeFreeFile();
      if (!free) break;
      Fd fd(RetryEintr([&] { return ::open(free->c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW); }));
      if (!fd.valid()) {
        const int err = errno;
        ::unlink(free->c_str());
        // Removed behind our back (another process's cleanup) or not a
        // file: try the next. Out of descriptors, say: so would the next
        // be, and they stay pooled for later Puts.
        if (err == ENOENT || err == ELOOP) continue;
        break;
      }
      Status st = WriteAll(fd.get(), parts, *free);
      if (st.ok() && RetryEintr([&] { return ::ftruncate(fd.get(), static_cast<off_t>(size)); }) != 0) {
        st = ErrnoStatus(errno, "truncate", *free);
      }
      if (st.ok()) st = Fsync(fd.get(), *free);
      if (st.ok() && size >= kDropCacheMinBytes) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
      if (st.ok() && fd.Close() != 0) st = ErrnoStatus(errno, "close", *free);
      if (!st.ok()) {
        ::unlink(free->c_str());
        return st;
      }
      return std::move(*free);
    }
    for (int attempt = 0;; ++attempt) {
      const uint64_t n = tmp_counter_.fetch_add(1, std::memory_order_relaxed);
      // Named by its store (the owner file's salt), so that a crashed
      // store's temps are removed at the next open, however recent.
      const std::string path = Join(tmp_dir_, TempFileName(salt_, n));
      Fd fd(RetryEintr([&] { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644); }));
      if (!fd.valid()) {
        if (errno == EEXIST && attempt < 3) continue;
        return ErrnoStatus(errno, "create temp file", path);
      }
      Status st = WriteAll(fd.get(), parts, path);
      if (st.ok()) st = Fsync(fd.get(), path);
      // The pages are clean now; nothing reads a new object soon (the log
      // cache serves recent records), so give them back while they are warm:
      // a page cache that only grows makes every write touch fresh memory,
      // which costs several times the copy itself on the VMs we measured.
      if (st.ok() && size >= kDropCacheMinBytes) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
      if (st.ok() && fd.Close() != 0) st = ErrnoStatus(errno, "close", path);
      if (!st.ok()) {
        ::unlink(path.c_str());
        return st;
      }
      return path;
    }
  }

  Status DoPut(std::string_view key, std::span<const std::string_view> parts, const PutOptions& options) {
    WEIR_RETURN_IF_ERROR(CheckKey(key));
    WEIR_RETURN_IF_ERROR(Failed());
    const std::string_view parent_rel = ParentOf(key);
    WEIR_RETURN_IF_ERROR(EnsureDir(key, parent_rel));
    WEIR_ASSIGN_OR_RETURN(std::string tmp, WriteTemp(parts, /*reuse=*/true));
    const std::string path = Join(root_, key);

    bool tmp_consumed = false;  // rename moved the temp file into place
    bool fresh_tmp = false;     // rewritten into a new temp file after the free one vanished
    bool dirs_rebuilt = false;
    Status st;
    for (int attempt = 0; attempt < 3; ++attempt) {
      int rc;
      if (options.if_none_match) {
        rc = ::link(tmp.c_str(), path.c_str());
      } else {
        rc = ::rename(tmp.c_str(), path.c_str());
        tmp_consumed = rc == 0;
      }
      if (rc == 0) {
        st = Status::Ok();
        break;
      }
      const int err = errno;
      if (err == ENOENT && !fresh_tmp && ::access(tmp.c_str(), F_OK) != 0) {
        // The free file we rewrote was removed by another process's cleanup.
        fresh_tmp = true;
        WEIR_ASSIGN_OR_RETURN(tmp, WriteTemp(parts, /*reuse=*/false));
        continue;
      }
      if (err == ENOENT && !dirs_rebuilt) {
        // A directory vanished behind our cache (removed externally): rebuild it.
        dirs_rebuilt = true;
        ForgetDirs();
        st = EnsureDir(key, parent_rel);
        if (!st.ok()) break;
        continue;
      }
      struct stat existing{};
      const bool is_dir = ::lstat(path.c_str(), &existing) == 0 && S_ISDIR(existing.st_mode);
      if (is_dir || err == EISDIR || err == ENOTDIR) {
        st = ConflictError(key, "a directory of the same name");
      } else if (err == EEXIST && options.if_none_match) {
        // Answered only once the existing object's name is durable: it may be
        // a concurrent create's, or a failed attempt's whose sync failed, and
        // a caller told "it exists" may act on it (a WAL slot read back as
        // ours is acknowledged).
        st = SyncDir(std::string(ParentOf(path)), /*if_any=*/false);
        if (st.ok()) st = PreconditionFailed("object {} already exists", key);
      } else {
        st = ErrnoStatus(err, options.if_none_match ? "link" : "rename", path);
      }
      break;
    }
    if (!tmp_consumed) ::unlink(tmp.c_str());
    if (!st.ok()) return st;
    return SyncDir(std::string(ParentOf(path)), /*if_any=*/false);
  }

  // A directory's fsync (with `if_any`, of one that may not exist), unless
  // the store failed; a failed fsync fails the store (Failed()).
  Status SyncDir(const std::string& dir, bool if_any) {
    WEIR_RETURN_IF_ERROR(Failed());
    bool sync_failed = false;
    Status st = SyncDirTelling(dir, if_any, &sync_failed);
    // A sync that passed while another thread's failed (its error reported
    // to that thread only) may not have made this entry durable either: the
    // latch is looked at again (the window left is the failing thread's few
    // instructions between its fsync and the latch).
    if (st.ok()) return Failed();
    // An open that failed (out of descriptors, say) consumed no writeback
    // error: a later sync will still report it.
    if (!sync_failed) return st;
    {
      std::lock_guard lock(failed_mu_);
      if (failed_why_.empty()) failed_why_ = st.ToString();
    }
    if (!sync_failed_.exchange(true, std::memory_order_acq_rel)) {
      Log().error("file://{}: a directory sync failed ({}); writes and deletes are refused until a restart", root_,
                  st.ToString());
    }
    return st;
  }

  Result<std::string> DoGet(std::string_view key, std::optional<ByteRange> range) {
    WEIR_RETURN_IF_ERROR(CheckKey(key));
    const std::string path = Join(root_, key);
    // A file can be deleted and, after the quarantine, rewritten as another
    // object while we read it (free files). The key named the file when we
    // opened it, so no rewrite can start within a quarantine of the open: a
    // read that finished sooner counts. A slower one counts only if the file
    // did not change meanwhile and the key still names it.
    for (int attempt = 0; attempt < 4; ++attempt) {
      const auto opened = std::chrono::steady_clock::now();
      Fd fd(RetryEintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); }));
      if (!fd.valid()) {
        if (errno == ENOENT || errno == ENOTDIR) return NotFoundError(key);
        return ErrnoStatus(errno, "open", path);
      }
      struct stat before{};
      if (::fstat(fd.get(), &before) != 0) return ErrnoStatus(errno, "fstat", path);
      if (g_read_hook_set.load(std::memory_order_acquire)) ReadHook()(path);
      if (!S_ISREG(before.st_mode)) return NotFoundError(key);
      const uint64_t size = static_cast<uint64_t>(before.st_size);
      uint64_t offset = 0;
      uint64_t want = size;
      const bool past_end = range && range->offset > 0 && range->offset >= size;
      if (range && !past_end) {
        offset = range->offset;
        want = std::min(range->length, size - offset);
      }
      std::string out(past_end ? 0 : want, '\0');
      size_t got = 0;
      while (got < out.size()) {
        const ssize_t n = ::pread(fd.get(), out.data() + got, out.size() - got, static_cast<off_t>(offset + got));
        if (n < 0) {
          if (errno == EINTR) continue;
          return ErrnoStatus(errno, "read", path);
        }
        if (n == 0) break;  // truncated behind our back; the checks below retry
        got += static_cast<size_t>(n);
      }
      const bool whole = got == out.size();
      out.resize(got);
      const bool quick = std::chrono::steady_clock::now() - opened < kFreeFileQuarantine / 2;
      if (quick && whole) {
        if (past_end) {
          return OutOfRange("range offset {} is past the end of object {} ({} bytes)", range->offset, key, size);
        }
        return out;
      }
      struct stat after{};
      if (::fstat(fd.get(), &after) != 0) return ErrnoStatus(errno, "fstat", path);
      struct stat named{};
      if (RetryEintr([&] { return ::stat(path.c_str(), &named); }) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return NotFoundError(key);  // deleted while we read
        return ErrnoStatus(errno, "stat", path);
      }
      if (SameVersion(before, after) && SameVersion(before, named)) {
        if (past_end) {
          return OutOfRange("range offset {} is past the end of object {} ({} bytes)", range->offset, key, size);
        }
        return out;
      }
    }
    return Unavailable("object {} in file://{} kept changing while it was read", key, root_);
  }

  // The same file, unchanged: inode and change time (rename, link, write, truncate).
  static bool SameVersion(const struct stat& a, const struct stat& b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_ctim.tv_sec == b.st_ctim.tv_sec &&
           a.st_ctim.tv_nsec == b.st_ctim.tv_nsec && a.st_size == b.st_size;
  }

  // A deleted object's file, renamed out of its key and counted in
  // free_bytes_, that joins the pool once the key's removal is durable.
  struct PendingFree {
    std::string path;
    size_t size;
  };

  // Removes a checked key's file (none is not an error); a file kept for
  // the free pool is added to `pending`, for PoolFreeFiles once its parent
  // directory is synced.
  Status Unlink(std::string_view key, std::vector<PendingFree>* pending) {
    const std::string path = Join(root_, key);
    struct stat st{};
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && KeepAsFreeFile(path, st, pending)) {
      return Status::Ok();
    }
    if (::unlink(path.c_str()) != 0) {
      if (errno == ENOENT || errno == ENOTDIR || errno == EISDIR) return Status::Ok();
      return ErrnoStatus(errno, "unlink", path);
    }
    return Status::Ok();
  }

  // `durable`: the renames out of the keys are synced, so the files join the
  // pool (their quarantine starts now); otherwise a crash could still bring
  // a key back onto the file, so it is never rewritten: removed instead.
  void PoolFreeFiles(std::vector<PendingFree> files, bool durable) {
    if (files.empty()) return;
    if (!durable) {
      for (const PendingFree& f : files) ::unlink(f.path.c_str());
    }
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(free_mu_);
    for (PendingFree& f : files) {
      if (durable) {
        free_.push_back(FreeFile{std::move(f.path), f.size, now});
      } else {
        free_bytes_ -= f.size;
      }
    }
  }

  // Moves the regular file at `path` (whose stat is `st`) out of its key,
  // into `pending` for the free pool, if it fits; false leaves it where it
  // is, for the caller to unlink.
  bool KeepAsFreeFile(const std::string& path, const struct stat& st, std::vector<PendingFree>* pending) {
    const auto size = static_cast<size_t>(st.st_size);
    if (size > kFreeFileMaxBytes) return false;
    const uint64_t n = tmp_counter_.fetch_add(1, std::memory_order_relaxed);
    std::string free = Join(tmp_dir_, fmt::format("free-{:016x}-{}", salt_, n));
    {
      std::lock_guard lock(free_mu_);
      if (free_.size() >= kFreePoolMaxFiles || free_bytes_ + size > kFreePoolMaxBytes) return false;
      free_bytes_ += size;  // reserved before the rename, so concurrent deletes respect the bound
    }
    if (::rename(path.c_str(), free.c_str()) != 0) {
      std::lock_guard lock(free_mu_);
      free_bytes_ -= size;
      return false;
    }
    struct stat moved{};
    if (::lstat(free.c_str(), &moved) != 0 || moved.st_ino != st.st_ino || moved.st_dev != st.st_dev ||
        moved.st_nlink != 1) {
      // A Put replaced the object between the stat and the rename: that file
      // is deleted all the same, but not pooled (its size was not reserved).
      // Nor is a file linked elsewhere too (a hard-link backup of the data
      // directory): rewriting it in place would change the backup's copy.
      ::unlink(free.c_str());
      std::lock_guard lock(free_mu_);
      free_bytes_ -= size;
      return true;
    }
    pending->push_back(PendingFree{std::move(free), size});
    return true;
  }

  // The oldest free file past its quarantine, taken out of the pool.
  std::optional<std::string> TakeFreeFile() {
    std::lock_guard lock(free_mu_);
    if (free_.empty() || std::chrono::steady_clock::now() - free_.front().freed < kFreeFileQuarantine) {
      return std::nullopt;
    }
    FreeFile f = std::move(free_.front());
    free_.pop_front();
    free_bytes_ -= f.size;
    return std::move(f.path);
  }

  struct Walk {
    std::string_view start_after;
    size_t limit;  // stop once `out` holds this many keys
    std::vector<ObjectInfo>* out;
  };

  // Appends the regular files under the open directory `dirfd` (whose keys
  // start with `rel`, "" or ending in '/'; at the top level only names
  // starting with `name_prefix`) that sort after walk.start_after, in key
  // order, until walk.out holds walk.limit keys; true once it does. Takes
  // ownership of dirfd. A page costs the directories it passes through, not
  // the whole tree: subtrees before start_after are skipped unread, and only
  // the keys returned are stat'ed.
  Result<bool> WalkDir(int dirfd, const std::string& rel, std::string_view name_prefix, const Walk& walk) {
    DirPtr dir(::fdopendir(dirfd));
    if (!dir) {
      const int err = errno;
      ::close(dirfd);
      return ErrnoStatus(err, "opendir", Join(root_, rel));
    }
    // Every key below directory "d" starts with "d/", so ordering entries by
    // name, with '/' appended to directories, orders all the keys.
    struct Entry {
      std::string sort_name;
      bool is_dir;
    };
    std::vector<Entry> entries;
    while (true) {
      errno = 0;
      const dirent* entry = ::readdir(dir.get());
      if (entry == nullptr) {
        if (errno != 0) return ErrnoStatus(errno, "readdir", Join(root_, rel));
        break;
      }
      const std::string_view name = entry->d_name;
      if (name == "." || name == "..") continue;
      if (rel.empty() && name == kTmpDirName) continue;
      if (!name.starts_with(name_prefix)) continue;
      if (rel.size() + name.size() > 1024) continue;  // not a key this store could have written
      unsigned char type = entry->d_type;
      if (type == DT_UNKNOWN) {
        struct stat st{};
        if (::fstatat(::dirfd(dir.get()), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
          if (errno == ENOENT) continue;  // deleted while listing
          return ErrnoStatus(errno, "stat", Join(root_, rel + std::string(name)));
        }
        type = S_ISREG(st.st_mode) ? DT_REG : S_ISDIR(st.st_mode) ? DT_DIR : DT_UNKNOWN;
      }
      if (type == DT_DIR) {
        const std::string key = rel + std::string(name) + '/';
        // Skip the subtree if all of its keys sort at or before start_after.
        if (walk.start_after > key && !walk.start_after.starts_with(key)) continue;
        entries.push_back(Entry{std::string(name) + '/', true});
      } else if (type == DT_REG) {
        if (rel + std::string(name) <= walk.start_after) continue;
        entries.push_back(Entry{std::string(name), false});
      }
    }
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.sort_name < b.sort_name; });
    for (const Entry& e : entries) {
      std::string key = rel + e.sort_name;
      if (e.is_dir) {
        const std::string name = e.sort_name.substr(0, e.sort_name.size() - 1);
        const int sub = RetryEintr([&] {
          return ::openat(::dirfd(dir.get()), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        });
        if (sub < 0) {
          if (errno == ENOENT || errno == ENOTDIR) continue;
          return ErrnoStatus(errno, "open directory", Join(root_, key));
        }
        WEIR_ASSIGN_OR_RETURN(const bool full, WalkDir(sub, key, {}, walk));
        if (full) return true;
        continue;
      }
      struct stat st{};
      if (::fstatat(::dirfd(dir.get()), e.sort_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // deleted while listing
        return ErrnoStatus(errno, "stat", Join(root_, key));
      }
      if (!S_ISREG(st.st_mode)) continue;
      walk.out->push_back(ObjectInfo{std::move(key), static_cast<uint64_t>(st.st_size)});
      if (walk.out->size() >= walk.limit) return true;
    }
    return false;
  }

  Result<ListPage> DoList(std::string_view prefix, std::string_view start_after, size_t max_keys) {
    if (max_keys < 1 || max_keys > 1000) return InvalidArgument("List max_keys {} is not in 1..1000", max_keys);
    ListPage page;
    const size_t slash = prefix.rfind('/');
    const std::string dir_rel(slash == std::string_view::npos ? std::string_view() : prefix.substr(0, slash + 1));
    const std::string_view name_prefix = prefix.substr(dir_rel.size());
    if (!IsListableDir(dir_rel) || name_prefix.find('\0') != std::string_view::npos) return page;

    const std::string dir_path = dir_rel.empty() ? root_ : Join(root_, dir_rel);
    const int fd = RetryEintr([&] { return ::open(dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR || errno == ENAMETOOLONG) return page;
      return ErrnoStatus(errno, "open directory", dir_path);
    }
    // One key past the page tells whether there is more.
    std::vector<ObjectInfo> found;
    WEIR_RETURN_IF_ERROR(WalkDir(fd, dir_rel, name_prefix, Walk{start_after, max_keys + 1, &found}).status());
    if (found.size() > max_keys) {
      found.resize(max_keys);
      page.next_start_after = found.back().key;
    }
    page.objects = std::move(found);
    return page;
  }

  const std::string root_;     // absolute, no trailing '/' (unless it is "/")
  const std::string tmp_dir_;  // root_/.weir-tmp
  const uint64_t salt_;        // random per store: temp names stay unique across pid reuse
  const Fd owner_;             // holds the flock on .weir-tmp/owner-<salt>: free-<salt>-* are ours
  std::atomic<uint64_t> tmp_counter_{0};
  struct FreeFile {
    std::string path;
    size_t size;
    std::chrono::steady_clock::time_point freed;
  };
  std::mutex free_mu_;
  std::deque<FreeFile> free_;  // deleted objects' files, oldest first
  size_t free_bytes_ = 0;      // their sizes, plus renames in progress
  std::mutex dirs_mu_;
  std::unordered_set<std::string> known_dirs_;  // key directories known to exist and be synced
  std::atomic<bool> sync_failed_{false};  // a directory sync failed: see Failed()
  mutable std::mutex failed_mu_;
  std::string failed_why_;  // the first failure (failed_mu_)
};

// mkdir -p for the store root, fsyncing the parent of each directory it creates.
Status MakeRoot(const std::string& root) {
  Status st = MakeDirsSynced(root);
  return st.ok() ? st : st.WithContext("file://" + root);
}

// Free files belong to the store that made them: `free-<salt>-<n>`, with a
// file `owner-<salt>` that store holds an exclusive flock on (made under a
// temporary name, locked, then renamed, so it is never seen unlocked while
// its store lives). The lock goes with the process however it ends, so a
// crashed store's free files are found at the next open, whatever its pid.
Result<Fd> OwnerLock(const std::string& tmp_dir, uint64_t salt) {
  const std::string name = tmp_dir + "/" + OwnerFileName(salt);
  const std::string made = name + ".new";
  Fd fd(RetryEintr([&] { return ::open(made.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644); }));
  if (!fd.valid()) return ErrnoStatus(errno, "create", made);
  // A file system without locks (some NFS or FUSE mounts) keeps the file
  // unlocked: the next opens cannot tell whether its store is alive, and
  // leave its free files (after a crash, up to the pool's 256 MiB stay).
  if (RetryEintr([&] { return ::flock(fd.get(), LOCK_EX | LOCK_NB); }) != 0 && !LocksUnsupported(errno)) {
    Status st = ErrnoStatus(errno, "lock", made);
    ::unlink(made.c_str());
    return st;
  }
  if (::rename(made.c_str(), name.c_str()) != 0) {
    Status st = ErrnoStatus(errno, "rename", made);
    ::unlink(made.c_str());
    return st;
  }
  return fd;
}

enum class Owner { kAlive, kGone, kUnknown };

// Whether the store owning free files `free-<owner>-*` is gone: no owner file
// (it is made before any free file; names of older versions have none), or
// one nobody holds a lock on (then removed, with the lock held). kUnknown
// where the file system has no locks.
Owner OwnerState(const std::string& tmp_dir, std::string_view owner) {
  const std::string name = tmp_dir + "/owner-" + std::string(owner);
  Fd fd(RetryEintr([&] { return ::open(name.c_str(), O_RDWR | O_CLOEXEC); }));
  if (!fd.valid()) return errno == ENOENT ? Owner::kGone : Owner::kUnknown;
  if (RetryEintr([&] { return ::flock(fd.get(), LOCK_EX | LOCK_NB); }) != 0) {
    return errno == EWOULDBLOCK ? Owner::kAlive : Owner::kUnknown;
  }
  ::unlink(name.c_str());
  return Owner::kGone;
}

// Create-only Puts link their temp file to the key: a file system without
// hard links (vfat, exFAT, most FUSE bucket mounts) is refused at open, not
// found by every WAL write failing.
Status CheckHardLinks(const std::string& root, const std::string& tmp_dir) {
  std::random_device rd;
  const std::string a = fmt::format("{}/link-check-{:08x}", tmp_dir, rd());
  const std::string b = a + ".linked";
  Fd fd(RetryEintr([&] { return ::open(a.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644); }));
  if (!fd.valid()) return ErrnoStatus(errno, "create", a);
  (void)fd.Close();
  const int linked = ::link(a.c_str(), b.c_str());
  const int err = errno;
  ::unlink(b.c_str());
  ::unlink(a.c_str());
  if (linked == 0) return Status::Ok();
  if (err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == ENOSYS || err == EXDEV) {
    return NotSupported("file://{}: the file system does not support hard links ({}), which create-only writes use; "
                        "put the directory on a local file system such as ext4 or XFS",
                        root, ErrnoText(err));
  }
  return ErrnoStatus(err, "link", a);
}

// Removes temp files of stores that are gone (or, where that cannot be
// told, old enough to be leftovers of a crashed writer), and the free files
// (and owner files) of stores that are gone.
void RemoveStaleTemps(const std::string& tmp_dir) {
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  std::map<std::string, Owner, std::less<>> owners;  // asked once each
  for (std::filesystem::directory_iterator it(tmp_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (!it->is_regular_file(ec2)) continue;
    const std::string name = it->path().filename().string();
    if (name.starts_with("free-") || name.starts_with("tmp-")) {
      const size_t from = name.find('-') + 1;
      const size_t dash = name.find('-', from);
      const std::string owner = name.substr(from, dash == std::string::npos ? std::string::npos : dash - from);
      auto [o, fresh] = owners.try_emplace(owner, Owner::kUnknown);
      if (fresh) o->second = OwnerState(tmp_dir, owner);
      if (o->second == Owner::kGone) {
        std::filesystem::remove(it->path(), ec2);
        continue;
      }
      // Kept otherwise, however old: a live store's, or one whose liveness
      // cannot be told without locks (its mtime is the old object's); a
      // temp file of the latter goes by its age, below.
      if (name.starts_with("free-") || o->second == Owner::kAlive) continue;
    } else if (name.starts_with("owner-") && !name.ends_with(".new")) {
      auto [o, fresh] = owners.try_emplace(name.substr(6), Owner::kUnknown);
      if (fresh) o->second = OwnerState(tmp_dir, name.substr(6));
      continue;  // removed by OwnerState if its store is gone; never by age
    }
    const auto mtime = it->last_write_time(ec2);
    if (!ec2 && now - mtime > kStaleTmpAge) std::filesystem::remove(it->path(), ec2);
  }
}

}  // namespace

void SetFileStoreReadHookForTest(std::function<void(const std::string& path)> hook) {
  g_read_hook_set.store(false, std::memory_order_release);
  ReadHook() = std::move(hook);
  if (ReadHook()) g_read_hook_set.store(true, std::memory_order_release);
}

void SetFileStoreDirSyncHookForTest(std::function<Status(const std::string& dir)> hook) {
  g_dir_sync_hook_set.store(false, std::memory_order_release);
  DirSyncHook() = std::move(hook);
  if (DirSyncHook()) g_dir_sync_hook_set.store(true, std::memory_order_release);
}

Result<std::shared_ptr<ObjectStore>> OpenFileStore(const std::string& dir) {
  return CatchAll("OpenFileStore", [&]() -> Result<std::shared_ptr<ObjectStore>> {
    if (dir.empty()) return InvalidArgument("file:// store directory is empty");
    if (dir.find('\0') != std::string::npos) return InvalidArgument("file:// store directory contains a NUL byte");
    std::error_code ec;
    std::string root = std::filesystem::absolute(dir, ec).lexically_normal().string();
    if (ec) return IOError("file://{}: cannot make the path absolute: {}", dir, ec.message());
    while (root.size() > 1 && root.back() == '/') root.pop_back();

    WEIR_RETURN_IF_ERROR(MakeRoot(root));
    const std::string tmp_dir = root + (root == "/" ? "" : "/") + std::string(kTmpDirName);
    if (::mkdir(tmp_dir.c_str(), 0755) == 0) {
      WEIR_RETURN_IF_ERROR(FsyncDir(root));
    } else if (errno != EEXIST) {
      return ErrnoStatus(errno, "mkdir", tmp_dir);
    }
    struct stat st{};
    if (::stat(tmp_dir.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", tmp_dir);
    if (!S_ISDIR(st.st_mode)) return InvalidArgument("file://{}: {} is not a directory", root, tmp_dir);
    for (const std::string& d : {root, tmp_dir}) {
      if (::access(d.c_str(), W_OK | X_OK) != 0) {
        return IOError("file://{} is not writable: {}: {}", root, d, ErrnoText(errno));
      }
    }
    RemoveStaleTemps(tmp_dir);
    WEIR_RETURN_IF_ERROR(CheckHardLinks(root, tmp_dir));

    std::random_device rd;
    const uint64_t salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    WEIR_ASSIGN_OR_RETURN(Fd owner, OwnerLock(tmp_dir, salt));
    return std::shared_ptr<ObjectStore>(std::make_shared<FileStore>(std::move(root), salt, std::move(owner)));
  });
}

}  // namespace weir::objstore
