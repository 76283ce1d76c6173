#include "server/state/watcher_set.h"

#include <utility>

#include "common/names.h"

namespace tensord::server {

uint64_t WatcherSet::Add(Watcher watcher) {
  uint64_t id = ++last_id_;
  watchers_.emplace(id, std::move(watcher));
  return id;
}

std::optional<Watcher> WatcherSet::Remove(uint64_t watcher_id) {
  auto it = watchers_.find(watcher_id);
  if (it == watchers_.end()) return std::nullopt;
  Watcher watcher = std::move(it->second);
  watchers_.erase(it);
  return watcher;
}

Watcher* WatcherSet::Find(uint64_t watcher_id) {
  auto it = watchers_.find(watcher_id);
  return it == watchers_.end() ? nullptr : &it->second;
}

std::vector<Watcher> WatcherSet::RemoveSession(uint64_t session_id) {
  std::vector<Watcher> removed;
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (it->second.session_id != session_id) {
      ++it;
      continue;
    }
    removed.push_back(std::move(it->second));
    it = watchers_.erase(it);
  }
  return removed;
}

std::vector<Watcher> WatcherSet::RemoveAll() {
  std::vector<Watcher> removed;
  removed.reserve(watchers_.size());
  for (auto& [id, watcher] : watchers_) removed.push_back(std::move(watcher));
  watchers_.clear();
  return removed;
}

std::vector<std::shared_ptr<WatchSink>> WatcherSet::SinksFor(const tensord::v1::WatchEvent& event,
                                                             const AccessPolicy& access) const {
  std::vector<std::shared_ptr<WatchSink>> sinks;
  for (const auto& [id, watcher] : watchers_) {
    if (!common::NameHasPrefix(event.name(), watcher.prefix)) continue;
    if (!access.MayRead(watcher.creds, common::NamespaceOf(event.name()))) continue;
    if (watcher.initial_pending && event.name() > watcher.initial_sent_through) continue;
    sinks.push_back(watcher.sink);
  }
  return sinks;
}

bool WatcherSet::Watches(const std::string& name, uint64_t except_session, const AccessPolicy& access) const {
  for (const auto& [id, watcher] : watchers_) {
    if (watcher.session_id == except_session || !common::NameHasPrefix(name, watcher.prefix)) continue;
    if (access.MayRead(watcher.creds, common::NamespaceOf(name))) return true;
  }
  return false;
}

}  // namespace tensord::server
