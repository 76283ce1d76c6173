// The fake_ze tests' way to the Level Zero API and the helpers both sides share
// (fake_ze_loader_api.h).
#include "tests/fake_ze/fake_ze_loader_api.h"

#include <dlfcn.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <utility>

namespace tensord::fake_ze_test {

const Ze* LoadZe() {
  static const Ze* const ze = []() -> const Ze* {
    void* loader = ::dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
    if (loader == nullptr) {
      std::fprintf(stderr, "dlopen(libze_loader.so.1): %s\n", ::dlerror());
      return nullptr;
    }
    auto table = std::make_unique<Ze>();
#define FAKE_ZE_RESOLVE(name)                                                \
  table->name = reinterpret_cast<decltype(&::name)>(::dlsym(loader, #name)); \
  if (table->name == nullptr) {                                              \
    std::fprintf(stderr, "libze_loader.so.1 lacks %s\n", #name);             \
    return nullptr;                                                          \
  }
    FAKE_ZE_LOADER_API(FAKE_ZE_RESOLVE)
#undef FAKE_ZE_RESOLVE
    return table.release();  // for the life of the process, as the loader
  }();
  return ze;
}

void* FakeSymbol(const char* name) {
  void* lib = ::dlopen(std::getenv("ZE_ENABLE_ALT_DRIVERS"), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* symbol = ::dlsym(lib, name);
  ::dlclose(lib);  // the loader keeps it loaded
  return symbol;
}

int64_t Live(const char* kind) {
  auto fn = reinterpret_cast<int64_t (*)(const char*)>(FakeSymbol("tensord_fake_ze_live_objects"));
  return fn != nullptr ? fn(kind) : -2;
}

bool FailNext(const char* api, ze_result_t result) {
  auto fn =
      reinterpret_cast<void (*)(const char*, int32_t)>(FakeSymbol("tensord_fake_ze_fail_next"));
  if (fn == nullptr) return false;
  fn(api, static_cast<int32_t>(result));
  return true;
}

std::string Str(ze_result_t result) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", static_cast<unsigned>(result));
  return text;
}

std::string Hex(const uint8_t* bytes, size_t n) {
  std::string out;
  char two[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(two, sizeof(two), "%02x", bytes[i]);
    out += two;
  }
  return out;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + seed);
  return bytes;
}

uint64_t LoadU64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

void StoreU64(char* bytes, uint64_t value) {
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
}

void StoreU32(char* bytes, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
}

// What an fd is: "/memfd:..." for the fake's memory.
std::string FdTarget(int fd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  char target[256];
  const ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  return n < 0 ? std::string() : std::string(target, static_cast<size_t>(n));
}

// Receives one message and the fd it carries, if any; false after 30 s of silence.
bool RecvMsg(int sock, std::string* payload, UniqueFd* fd) {
  pollfd ready{sock, POLLIN, 0};
  if (::poll(&ready, 1, 30'000) != 1) return false;
  std::string buffer(256 << 10, '\0');
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return false;
  buffer.resize(static_cast<size_t>(n));
  *payload = std::move(buffer);
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(cmsg), sizeof(int));
      UniqueFd owned(received);
      if (fd != nullptr) *fd = std::move(owned);
    }
  }
  return true;
}

std::map<std::string, std::string> ParseReport(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

}  // namespace tensord::fake_ze_test
