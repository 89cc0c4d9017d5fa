#include "base/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace weir {

Status ErrnoStatus(int err, std::string_view what, std::string_view path) {
  const std::string text = std::error_code(err, std::generic_category()).message();
  if (err == ENOSPC || err == EDQUOT) return ResourceExhausted("{} {}: {}", what, path, text);
  return IOError("{} {}: {}", what, path, text);
}

namespace {
// fsync(2) of a directory: 0, or the errno of the open or the fsync (`*what`).
int SyncDir(const std::string& dir, const char** what) {
  int fd;
  do fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    *what = "open directory";
    return errno;
  }
  int rc;
  do rc = ::fsync(fd);
  while (rc != 0 && errno == EINTR);
  const int err = rc == 0 ? 0 : errno;
  ::close(fd);
  *what = "fsync directory";
  return err;
}
}  // namespace

Status FsyncDir(const std::string& dir) {
  const char* what = "";
  const int err = SyncDir(dir, &what);
  return err == 0 ? Status::Ok() : ErrnoStatus(err, what, dir);
}

Status MakeDirsSynced(const std::string& path) {
  struct stat st{};
  size_t end = 0;
  while (end < path.size()) {
    end = path.find('/', end + 1);
    if (end == std::string::npos) end = path.size();
    const std::string sub = path.substr(0, end);
    if (sub.empty()) continue;  // the root
    bool existed = ::stat(sub.c_str(), &st) == 0;
    if (!existed && ::mkdir(sub.c_str(), 0755) != 0) {
      if (errno != EEXIST) return ErrnoStatus(errno, "mkdir", sub);
      existed = ::stat(sub.c_str(), &st) == 0;  // made meanwhile by another
      if (!existed) return ErrnoStatus(errno, "stat", sub);
    }
    if (existed && !S_ISDIR(st.st_mode)) return InvalidArgument("{}: {} is not a directory", path, sub);
    // Its entry synced in its parent also when it was there already: whoever
    // made it (a start that failed or was killed next, a deploy script) may
    // not have. A parent this process may not open, around a directory it
    // did not make, is left as it is.
    const size_t slash = sub.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : sub.substr(0, slash);
    const char* what = "";
    const int err = SyncDir(parent, &what);
    if (err != 0 && !(existed && (err == EACCES || err == EPERM))) return ErrnoStatus(err, what, parent);
  }
  return Status::Ok();
}

}  // namespace weir
