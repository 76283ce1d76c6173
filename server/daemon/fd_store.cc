#include "server/daemon/fd_store.h"

#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/state/registry_snapshot.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr char kRegistryA[] = "registry-a";
constexpr char kRegistryB[] = "registry-b";

}  // namespace

bool IsStoredStateName(const std::string& name) {
  return name == kRegistryA || name == kRegistryB || (name.size() > 1 && name[0] == 'b' && name.find('-') != std::string::npos &&
                                                      name.find_first_not_of("0123456789-", 1) == std::string::npos);
}

absl::StatusOr<std::optional<RecoveredState>> RecoverFromStore(
    std::map<std::string, std::vector<common::UniqueFd>>& passed) {
  std::optional<RecoveredState> best;
  std::string errors;
  for (const char* name : {kRegistryA, kRegistryB}) {
    auto it = passed.find(name);
    if (it == passed.end() || it->second.empty()) continue;
    absl::StatusOr<v1::RegistrySnapshot> read = ReadSnapshotMemfd(it->second.front().get());
    if (!read.ok()) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", name, ": ", read.status().message());
      continue;
    }
    // Two registries: a crash came between storing the new one and removing the old.
    const bool newer = !best || read->taken_unix_ms() > best->snapshot.taken_unix_ms() ||
                       (read->taken_unix_ms() == best->snapshot.taken_unix_ms() &&
                        read->last_generation() > best->snapshot.last_generation());
    if (newer) {
      best.emplace();
      best->snapshot = *std::move(read);
      best->registry_name = name;
    }
  }
  if (!best) {
    if (errors.empty()) return std::nullopt;
    return absl::FailedPreconditionError(absl::StrCat("the fd store's registry cannot be used: ", errors));
  }
  for (v1::SnapshotBuffer& buffer : *best->snapshot.mutable_buffers()) {
    std::vector<common::UniqueFd> fds;
    for (const std::string& fd_name : buffer.fd_names()) {
      auto it = passed.find(fd_name);
      if (it == passed.end() || it->second.empty()) break;
      fds.push_back(std::move(it->second.front()));
      it->second.erase(it->second.begin());
    }
    if (fds.size() != static_cast<size_t>(buffer.fd_names_size())) {
      // Fd indexes past the end: Restore refuses the buffer and says its fds did not come.
      buffer.set_first_fd(0xffffffffu);
      buffer.set_fd_count(static_cast<uint32_t>(buffer.fd_names_size()));
      continue;
    }
    buffer.set_first_fd(static_cast<uint32_t>(best->fds.size()));
    buffer.set_fd_count(static_cast<uint32_t>(fds.size()));
    for (common::UniqueFd& fd : fds) best->fds.push_back(std::move(fd));
  }
  return best;
}

void FdStore::Notify(const std::string& state, std::span<const int> fds) {
  int result = sd_pid_notify_with_fds(0, 0, state.c_str(), fds.data(), static_cast<unsigned>(fds.size()));
  if (result < 0) {
    spdlog::warn("fd store ({}): {}", state.substr(0, state.find('\n')), std::strerror(-result));
  } else if (result == 0) {
    spdlog::warn("fd store: NOTIFY_SOCKET is not set: tensors will not survive a restart");
  }
}

bool FdStore::Sync() {
  const uint64_t version = broker_->names_version();
  if (synced_once_ && version == synced_version_) return false;
  std::set<uint64_t> stored;
  for (const auto& [id, names] : stored_buffers_) stored.insert(id);
  Broker::Snapshot snapshot = broker_->SnapshotForStore(stored);
  // The new buffers' fds first, so the registry that names them is never ahead of them.
  std::set<uint64_t> needed;
  for (v1::SnapshotBuffer& buffer : *snapshot.registry.mutable_buffers()) {
    needed.insert(buffer.id());
    if (buffer.fd_count() == 0) continue;  // stored before
    std::vector<std::string> names;
    for (uint32_t i = 0; i < buffer.fd_count(); ++i) {
      const std::string name = StoredFdName(buffer.id(), i);
      const int fd = snapshot.fds[buffer.first_fd() + i].get();
      Notify(absl::StrCat("FDSTORE=1\nFDNAME=", name), std::span<const int>(&fd, 1));
      names.push_back(name);
    }
    stored_buffers_[buffer.id()] = std::move(names);
  }
  const std::string next = registry_name_ == kRegistryA ? kRegistryB : kRegistryA;
  absl::StatusOr<common::UniqueFd> memfd = WriteSnapshotMemfd(snapshot.registry);
  if (!memfd.ok()) {
    spdlog::error("fd store: {}; the stored registry is left as it was", memfd.status().ToString());
    return true;
  }
  const int registry_fd = memfd->get();
  Notify(absl::StrCat("FDSTORE=1\nFDNAME=", next), std::span<const int>(&registry_fd, 1));
  if (!registry_name_.empty()) Notify(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", registry_name_));
  registry_name_ = next;
  // Buffers no registry names any more.
  for (auto it = stored_buffers_.begin(); it != stored_buffers_.end();) {
    if (needed.contains(it->first)) {
      ++it;
      continue;
    }
    for (const std::string& name : it->second) Notify(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name));
    it = stored_buffers_.erase(it);
  }
  synced_version_ = version;
  synced_once_ = true;
  spdlog::debug("fd store: {} named tensors in {} buffers", snapshot.registry.tensors_size(), stored_buffers_.size());
  return true;
}

void FdStore::Start(const std::set<std::string>& forget) {
  for (const std::string& name : forget) Notify(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name));
  Sync();
  thread_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(kFdStoreSyncPeriod))) return;
      }
      Sync();
    }
  });
}

void FdStore::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace tensord::server
