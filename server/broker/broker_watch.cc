// The Broker's watchers: Watch streams of binding changes under a prefix, their initial
// bindings sent a page at a time, and their removal.
#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "server/broker/broker.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr size_t kMaxWatchers = 4096;
// One page of a watcher's initial bindings (SendInitialBindings).
constexpr size_t kInitialBindingsPageEvents = 256;
constexpr size_t kInitialBindingsPageBytes = 256 * 1024;

}  // namespace

absl::StatusOr<uint64_t> Broker::AddWatcher(uint64_t session_id, const v1::WatchRequest& request,
                                            std::shared_ptr<WatchSink> sink) {
  TENSORD_RETURN_IF_ERROR(common::ValidatePrefix(request.prefix()));
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
    // Shutdown closed every watcher it knew of; a later one would keep the server waiting.
    if (shutting_down_) return absl::UnavailableError("tensord is shutting down");
    if (watchers_.size() >= kMaxWatchers) {
      return absl::ResourceExhaustedError(absl::StrCat("tensord already has ", watchers_.size(),
                                                       " watchers, the limit: close some first"));
    }
    const uid_t uid = session->creds.uid;
    const uint64_t metadata = kWatcherEntryBytes + request.prefix().size();
    TENSORD_RETURN_IF_ERROR(uid_quota_.Reserve(uid, UidResource::kWatchers, 1, "watching"));
    if (absl::Status charged = uid_quota_.Reserve(uid, UidResource::kMetadataBytes, metadata, "watching");
        !charged.ok()) {
      uid_quota_.Release(uid, UidResource::kWatchers, 1);
      return charged;
    }
    Watcher watcher{session_id, request.prefix(), session->creds, sink, metadata};
    watcher.initial_pending = request.initial();
    id = watchers_.Add(std::move(watcher));
  }
  return id;
}

bool Broker::SendInitialBindings(uint64_t watcher_id) {
  absl::MutexLock lock(&mu_);
  Watcher* watcher = watchers_.Find(watcher_id);
  if (watcher == nullptr || !watcher->initial_pending) return false;
  const std::string& prefix = watcher->prefix;
  const auto& names = registry_.names();
  auto it = watcher->initial_sent_through.empty() ? names.lower_bound(prefix)
                                                  : names.upper_bound(watcher->initial_sent_through);
  size_t events = 0;
  size_t bytes = 0;
  for (; it != names.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    if (events >= kInitialBindingsPageEvents || bytes >= kInitialBindingsPageBytes) return true;
    if (!common::NameHasPrefix(it->first, prefix)) continue;
    if (!access_.MayRead(watcher->creds, common::NamespaceOf(it->first))) continue;
    Tensor* tensor = registry_.Find(it->second);
    if (tensor == nullptr) continue;
    v1::WatchEvent event;
    event.set_kind(v1::WatchEvent::KIND_BOUND);
    event.set_name(it->first);
    event.set_generation(tensor->generation);
    *event.mutable_tensor() = registry_.Describe(*tensor);
    ++events;
    bytes += event.ByteSizeLong();
    watcher->sink->Push(event);
    watcher->initial_sent_through = it->first;
  }
  watcher->initial_pending = false;
  return false;
}

void Broker::ReleaseWatcherLocked(const Watcher& watcher) {
  uid_quota_.Release(watcher.creds.uid, UidResource::kWatchers, 1);
  uid_quota_.Release(watcher.creds.uid, UidResource::kMetadataBytes, watcher.metadata_bytes);
}

void Broker::RemoveWatcher(uint64_t watcher_id) {
  std::optional<Watcher> watcher;  // its sink is released outside the lock
  absl::MutexLock lock(&mu_);
  watcher = watchers_.Remove(watcher_id);
  if (watcher) ReleaseWatcherLocked(*watcher);
}

}  // namespace tensord::server
