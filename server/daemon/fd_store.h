// FdStore: the daemon's named tensors kept in systemd's file-descriptor store
// (sd_pid_notify_with_fds(3), "FDSTORE=1"), so that a daemon systemd restarts, after a crash
// included, comes back with them. Needs FileDescriptorStoreMax= in the unit
// (deploy/systemd/tensord.service) and fd_store = "on" (the setting).
//
// Every kSyncPeriod, when the bound names have changed, it stores the memfds of buffers not
// stored yet (FDNAME=b<buffer id>-<n>), then a new registry snapshot (registry_snapshot.h)
// under the registry name not in use (registry-a, registry-b), then removes the other
// registry and the fds of buffers the new snapshot no longer needs (FDSTOREREMOVE=1). A
// crash loses at most the changes of the last period; at any moment the store holds a
// whole snapshot and every fd it names.
//
// At start, RecoverFromStore turns what systemd passed back (LISTEN_FDS with their names)
// into a snapshot and its fds for Broker::Restore; the daemon then removes every name it was
// passed (ForgetPassed) and the next sync stores what it restored under its own ids.
// Thread-safe: Start and Stop from one thread.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "server/broker/broker.h"

namespace tensord::server {

inline constexpr std::chrono::milliseconds kFdStoreSyncPeriod{500};

bool IsStoredStateName(const std::string& name);  // a registry or buffer name of ours

struct RecoveredState {
  tensord::v1::RegistrySnapshot snapshot;  // first_fd / fd_count index `fds`
  std::vector<common::UniqueFd> fds;
  std::string registry_name;  // which stored registry it came from
};

// The newest trustworthy registry among the passed fds (by name), with the fds its buffers
// name put in order. nullopt when no registry was passed; an error naming each registry and
// why when none can be read. A buffer whose fd is missing keeps fd indexes that Restore
// refuses, saying so.
absl::StatusOr<std::optional<RecoveredState>> RecoverFromStore(
    std::map<std::string, std::vector<common::UniqueFd>>& passed);

class FdStore {
 public:
  explicit FdStore(Broker* broker) : broker_(broker) {}
  ~FdStore() { Stop(); }
  FdStore(const FdStore&) = delete;
  FdStore& operator=(const FdStore&) = delete;

  // Removes `names` from the store (what systemd passed back, once restored), then syncs
  // every kFdStoreSyncPeriod on a thread of its own.
  void Start(const std::set<std::string>& forget);
  void Stop();
  // One sync now (also what the thread does). Returns whether anything was sent.
  bool Sync();

 private:
  void Notify(const std::string& state, std::span<const int> fds = {});

  Broker* const broker_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  // Only Sync touches these (the thread, or the caller before Start).
  uint64_t synced_version_ = 0;
  bool synced_once_ = false;
  std::map<uint64_t, std::vector<std::string>> stored_buffers_;  // buffer id -> fd names
  std::string registry_name_;                                    // the registry stored now
};

}  // namespace tensord::server
