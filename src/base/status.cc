#include "base/status.h"

namespace weir {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kNotFound: return "NotFound";
    case Code::kAlreadyExists: return "AlreadyExists";
    case Code::kPreconditionFailed: return "PreconditionFailed";
    case Code::kOutOfRange: return "OutOfRange";
    case Code::kCorruption: return "Corruption";
    case Code::kTimeout: return "Timeout";
    case Code::kUnavailable: return "Unavailable";
    case Code::kResourceExhausted: return "ResourceExhausted";
    case Code::kFenced: return "Fenced";
    case Code::kCancelled: return "Cancelled";
    case Code::kIOError: return "IOError";
    case Code::kNotSupported: return "NotSupported";
    case Code::kInternal: return "Internal";
    case Code::kQuotaExhausted: return "QuotaExhausted";
  }
  return "Unknown";
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", CodeName(rep_->code), rep_->message);
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(rep_->code, fmt::format("{}: {}", context, rep_->message));
}

}  // namespace weir
