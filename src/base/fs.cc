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

Status FsyncDir(const std::string& dir) {
  int fd;
  do fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "open directory", dir);
  int rc;
  do rc = ::fsync(fd);
  while (rc != 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? Status::Ok() : ErrnoStatus(err, "fsync directory", dir);
}

Status MakeDirsSynced(const std::string& path) {
  struct stat st{};
  size_t end = 0;
  while (end < path.size()) {
    end = path.find('/', end + 1);
    if (end == std::string::npos) end = path.size();
    const std::string sub = path.substr(0, end);
    if (::stat(sub.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return InvalidArgument("{}: {} is not a directory", path, sub);
      continue;
    }
    if (::mkdir(sub.c_str(), 0755) == 0) {
      const size_t slash = sub.rfind('/');
      const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : sub.substr(0, slash);
      WEIR_RETURN_IF_ERROR(FsyncDir(parent));
    } else if (errno != EEXIST) {
      return ErrnoStatus(errno, "mkdir", sub);
    }
  }
  return Status::Ok();
}

}  // namespace weir
