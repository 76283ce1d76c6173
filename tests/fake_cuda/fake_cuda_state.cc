// libtensord_fake_cuda.so: the process-wide state and the helpers its entry point files
// share (fake_cuda_state.h).
#include "tests/fake_cuda/fake_cuda_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace fake_cuda {
namespace {

constexpr char kMemfdPrefix[] = "tensord-fake-cuda:";

}  // namespace

State& S() {
  static State* state = new State();
  return *state;
}

CUresult Injected(const char* name) {
  ++S().calls[name];
  auto it = S().fail_next.find(name);
  if (it == S().fail_next.end()) return CUDA_SUCCESS;
  CUresult r = it->second;
  S().fail_next.erase(it);
  return r;
}

int PhysicalOfMemfd(int fd) {
  char link[64];
  char target[256];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return -1;
  target[n] = '\0';
  const char* at = std::strstr(target, kMemfdPrefix);
  if (at == nullptr) return -1;
  return std::atoi(at + sizeof(kMemfdPrefix) - 1);
}

int NewMemfd(int physical, size_t size) {
  std::string name = kMemfdPrefix + std::to_string(physical);
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace fake_cuda
