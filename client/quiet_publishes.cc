#include "client/quiet_publishes.h"

#include <string>
#include <utility>

namespace tensord::internal {

void QuietPublishes::OnFailure(absl::Status failure) {
  absl::MutexLock lock(&mu_);
  ++failed_;
  if (failures_.size() < kKeptFailures) failures_.push_back(std::move(failure));
}

absl::Status QuietPublishes::Report() {
  std::vector<absl::Status> failures;
  uint64_t failed = 0;
  {
    absl::MutexLock lock(&mu_);
    failures.swap(failures_);
    failed = std::exchange(failed_, 0);
  }
  if (failed == 0) return absl::OkStatus();
  std::string message = failed == 1
      ? "flush: a publish sent without waiting failed: "
      : "flush: " + std::to_string(failed) + " publishes sent without waiting failed; the first: ";
  message += std::string(failures[0].message());
  for (size_t i = 1; i < failures.size(); ++i) {
    message += i == 1 ? "; then: " : "; ";
    message += std::string(failures[i].message());
  }
  if (failed > failures.size()) message += "; ...";
  return absl::Status(failures[0].code(), message);
}

}  // namespace tensord::internal
