// Internals of libtensord_fake_ze.so, a SOFTWARE Level Zero driver for tests only (see
// README.md): the handle objects, the process-wide state and the helpers the API files
// share. Nothing here is exported; the library exports only the DDI table getters the
// loader asks for and the tensord_fake_ze_* test queries.
#pragma once

#include <level_zero/ze_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fake_ze {

// The IPC handle layouts (little-endian; the rest of the 64 bytes is zero).
//   memory:     [0,8) fd  [8,16) allocation size  [16,20) "FZEM"  [20,24) device index
//               [24,32) offset of the pointer in its allocation: always 0 (the spec wants
//               the allocation's base)
//   event pool: [0,8) fd  [8,12) event count  [12,16) "FZEP"
// The fd is the exporting driver's own memfd; the receiver writes the number it got over
// SCM_RIGHTS into [0,8) before opening.
inline constexpr char kMemMagic[4] = {'F', 'Z', 'E', 'M'};
inline constexpr char kPoolMagic[4] = {'F', 'Z', 'E', 'P'};

// zeCommandListAppendMemoryFill's limit (ze_command_queue_group_properties_t).
inline constexpr size_t kMaxFillPatternSize = 16;

// How often host waits and queued event waits look at an event's state.
inline constexpr auto kPollInterval = std::chrono::microseconds(50);

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Owns an mmap'ed range.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t length) : addr_(addr), length_(length) {}
  Mapping(Mapping&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), length_(std::exchange(other.length_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      Reset();
      addr_ = std::exchange(other.addr_, nullptr);
      length_ = std::exchange(other.length_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { Reset(); }

  explicit operator bool() const { return addr_ != nullptr; }
  void* addr() const { return addr_; }
  size_t length() const { return length_; }
  void Reset() {
    if (addr_ != nullptr) ::munmap(addr_, length_);
    addr_ = nullptr;
    length_ = 0;
  }

 private:
  void* addr_ = nullptr;
  size_t length_ = 0;
};

size_t PageSize();
size_t RoundUp(size_t value, size_t multiple);
// A memfd (MFD_CLOEXEC) of `length` bytes; an invalid fd on failure.
UniqueFd NewMemfd(const char* name, size_t length);
// Maps `length` bytes read-write at an address aligned to `alignment` (0: a page): the
// memfd `fd` shared, or anonymous private memory when fd < 0. Empty on failure.
Mapping MapAligned(int fd, size_t length, size_t alignment);
// Whether `fd` is an open memfd of at least `length` bytes (IPC handles must name one).
bool IsMemfdOfAtLeast(int fd, size_t length);

// Little-endian fields of IPC handle bytes.
uint64_t LoadU64(const char* bytes);
uint32_t LoadU32(const char* bytes);
void StoreU64(char* bytes, uint64_t value);
void StoreU32(char* bytes, uint32_t value);

// A range of memory the driver handed out: an allocation or an opened IPC handle.
enum class RegionKind { kDevice, kHost, kIpcOpen };
struct Region {
  RegionKind kind = RegionKind::kDevice;
  ze_context_handle_t context = nullptr;
  ze_device_handle_t device = nullptr;  // nullptr for host allocations
  uint64_t id = 0;
  size_t size = 0;  // as asked for; the mapping may be longer (whole pages)
  UniqueFd fd;      // device allocations: the memfd their IPC handles name
  Mapping mapping;
  char* base() const { return static_cast<char*>(mapping.addr()); }
};

// The states of an event pool's events, one uint32_t each (0 unsignalled, else
// signalled), in a memfd for IPC pools so that other processes map the same words.
struct EventStates {
  UniqueFd fd;
  Mapping mapping;
  uint32_t count = 0;
  std::atomic_ref<uint32_t> At(uint32_t index) const {
    return std::atomic_ref<uint32_t>(static_cast<uint32_t*>(mapping.addr())[index]);
  }
};
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free,
              "event states are shared between processes: they must be lock-free");

// One event's state; keeps the pool's memory mapped while queued work refers to it.
struct EventRef {
  std::shared_ptr<EventStates> states;
  uint32_t index = 0;
  bool Signalled() const { return states->At(index).load(std::memory_order_acquire) != 0; }
  void Set(uint32_t value) const { states->At(index).store(value, std::memory_order_release); }
};

// One appended command: wait for `waits`, run `work`, signal `signal`. `keep` holds the
// memory it touches mapped until it has run, even if freed meanwhile.
struct Op {
  std::vector<EventRef> waits;
  std::function<void()> work;
  std::vector<EventRef> signals;
  std::vector<std::shared_ptr<Region>> keep;
};

// The "engine" of an immediate command list or a command queue: a thread running the
// operations in order, as they arrive. The destructor drains them (waits included) first.
class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void Push(std::vector<Op> ops);
  // Whether all pushed work has run, waiting up to `timeout_ns` (UINT64_MAX: forever).
  bool WaitIdle(uint64_t timeout_ns);

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<Op> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

// Owns the live objects of one kind; handles are their addresses.
template <class T>
class Registry {
 public:
  T* Add(std::unique_ptr<T> object) {
    T* raw = object.get();
    objects_.emplace(raw, std::move(object));
    return raw;
  }
  bool Has(const T* object) const { return object != nullptr && objects_.count(object) != 0; }
  std::unique_ptr<T> Take(const T* object) {
    auto it = objects_.find(object);
    if (it == objects_.end()) return nullptr;
    std::unique_ptr<T> owned = std::move(it->second);
    objects_.erase(it);
    return owned;
  }
  size_t size() const { return objects_.size(); }
  template <class Pred>
  size_t CountIf(Pred pred) const {
    size_t n = 0;
    for (const auto& entry : objects_) n += pred(*entry.second) ? 1 : 0;
    return n;
  }

 private:
  std::unordered_map<const T*, std::unique_ptr<T>> objects_;
};

}  // namespace fake_ze

// The handle types ze_api.h declares opaque.
struct _ze_driver_handle_t {};

struct _ze_device_handle_t {
  uint32_t index = 0;
  uint64_t total_memory = 0;
  uint64_t used_memory = 0;  // by this process's device allocations
};

struct _ze_context_handle_t {};

struct _ze_event_pool_handle_t {
  ze_context_handle_t context = nullptr;
  ze_event_pool_flags_t flags = 0;
  bool imported = false;  // opened from an IPC handle
  std::shared_ptr<fake_ze::EventStates> states;
  std::vector<bool> index_used;  // by a live event of this pool object
  uint32_t live_events = 0;
};

struct _ze_event_handle_t {
  ze_event_pool_handle_t pool = nullptr;
  fake_ze::EventRef ref;
};

struct _ze_command_list_handle_t {
  ze_context_handle_t context = nullptr;
  ze_device_handle_t device = nullptr;
  bool immediate = false;
  bool synchronous = false;                 // immediate, ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS
  bool closed = false;                      // regular lists
  std::vector<fake_ze::Op> ops;             // regular lists: recorded
  std::unique_ptr<fake_ze::Worker> worker;  // immediate lists: running
};

struct _ze_command_queue_handle_t {
  ze_context_handle_t context = nullptr;
  ze_device_handle_t device = nullptr;
  bool synchronous = false;
  std::unique_ptr<fake_ze::Worker> worker;
};

namespace fake_ze {

// Everything the driver knows in this process, under one mutex. Never destroyed: a
// worker stalled on an event that is never signalled must not hang exit (the library is
// linked -z nodelete for the same reason).
struct State {
  static State& Get();

  std::mutex mu;
  bool initialized = false;
  _ze_driver_handle_t driver;
  std::vector<std::unique_ptr<_ze_device_handle_t>> devices;
  Registry<_ze_context_handle_t> contexts;
  Registry<_ze_event_pool_handle_t> pools;
  Registry<_ze_event_handle_t> events;
  Registry<_ze_command_list_handle_t> lists;
  Registry<_ze_command_queue_handle_t> queues;
  std::map<uintptr_t, std::shared_ptr<Region>> regions;  // by base address
  uint64_t next_id = 1;
  int64_t ipc_opens_total = 0;
  std::map<std::string, ze_result_t> fail_next;

  bool LiveDevice(ze_device_handle_t device) const;
  // The region holding [ptr, ptr + 1), or nullptr.
  std::shared_ptr<Region> Find(const void* ptr) const;
};

// Called first by every API under State::mu: UNINITIALIZED before zeInit, else a failure
// injected with tensord_fake_ze_fail_next for `api`, else SUCCESS.
ze_result_t Enter(State& state, const char* api);

// Keeps the caller's stype and pNext and zeroes the rest of an output structure.
template <class Props>
void ClearOutput(Props* props) {
  const ze_structure_type_t stype = props->stype;
  void* next = props->pNext;
  *props = Props{};
  props->stype = stype;
  props->pNext = next;
}

// Checks the version the loader asks a table for and zeroes the table.
template <class Table>
ze_result_t StartTable(ze_api_version_t version, Table* table) {
  if (table == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ZE_MAJOR_VERSION(version) != ZE_MAJOR_VERSION(ZE_API_VERSION_CURRENT)) {
    return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
  }
  *table = Table{};
  return ZE_RESULT_SUCCESS;
}

}  // namespace fake_ze

// Handle checks shared by the API files (`state` in scope).
#define FAKE_ZE_CHECK_CONTEXT(h)                                  \
  if ((h) == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; \
  if (!state.contexts.Has(h)) return ZE_RESULT_ERROR_INVALID_ARGUMENT
#define FAKE_ZE_CHECK_DEVICE(h)                                   \
  if ((h) == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; \
  if (!state.LiveDevice(h)) return ZE_RESULT_ERROR_INVALID_ARGUMENT

// Opens an API function: takes the state lock (`lock`, `state` in scope) and answers
// Enter's result if it is not SUCCESS.
#define FAKE_ZE_ENTER()                                                                      \
  ::fake_ze::State& state = ::fake_ze::State::Get();                                         \
  std::unique_lock<std::mutex> lock(state.mu);                                               \
  if (ze_result_t entered = ::fake_ze::Enter(state, __func__); entered != ZE_RESULT_SUCCESS) \
  return entered
