// UniqueFd: sole owner of one file descriptor; closes it on destruction. Move-only.
// Not thread-safe: one owner at a time.
#pragma once

#include <unistd.h>

#include <utility>

namespace tensord::common {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }

  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }

  void reset(int fd = -1) {
    int old = std::exchange(fd_, fd);
    // close() is not retried on EINTR: on Linux the fd is gone either way.
    if (old >= 0) ::close(old);
  }

 private:
  int fd_ = -1;
};

}  // namespace tensord::common
