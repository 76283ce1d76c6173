#include "client/lease_cache.h"

#include "common/check.h"

namespace tensord::internal {
namespace {
constexpr ViewKind kAllKinds[] = {ViewKind::kPrivate, ViewKind::kReadOnly, ViewKind::kProducer,
                                   ViewKind::kPinned};
}  // namespace

bool LeaseCache::Claim(LeaseView* view) {
  LeaseView::CacheState& cache = CacheOf(view);
  if (cache.idle) {
    idle_.erase(view);
    cache.idle = false;
    view->ReviveFromIdle();
    return true;
  }
  view->Revive();
  return true;
}

void LeaseCache::Unindex(LeaseView* view) {
  auto held = held_.find(HeldKey(view->tensor_id(), view->kind()));
  if (held != held_.end() && held->second == view) held_.erase(held);
  const std::string& name = CacheOf(view).name;
  if (!name.empty()) {
    auto named = by_name_.find(NameKey(name, view->kind()));
    if (named != by_name_.end() && named->second == view) by_name_.erase(named);
  }
  idle_.erase(view);
}

void LeaseCache::MakeUncacheable(LeaseView* view, std::vector<LeaseView*>* out) {
  LeaseView::CacheState& cache = CacheOf(view);
  if (cache.idle) {
    Unindex(view);
    cache.idle = false;
    cache.name.clear();
    out->push_back(view);
    return;
  }
  if (!cache.name.empty()) {
    auto named = by_name_.find(NameKey(cache.name, view->kind()));
    if (named != by_name_.end() && named->second == view) by_name_.erase(named);
    cache.name.clear();
  }
}

LeaseView* LeaseCache::FindByName(std::string_view name, ViewKind kind, uint64_t min_generation) {
  if (!cache_enabled_) return nullptr;
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(NameKey(std::string(name), kind));
  if (it == by_name_.end()) return nullptr;
  LeaseView* view = it->second;
  if (view->retired() || view->info().generation < min_generation) return nullptr;
  return Claim(view) ? view : nullptr;
}

LeaseView* LeaseCache::FindByTensor(uint64_t tensor_id, ViewKind kind,
                                    std::string_view acquired_name) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(HeldKey(tensor_id, kind));
  if (it == held_.end()) return nullptr;
  LeaseView* view = it->second;
  if (!Claim(view)) return nullptr;
  // Held by id so far and now acquired by name: it may serve that name from now on.
  LeaseView::CacheState& cache = CacheOf(view);
  if (cache_enabled_ && !acquired_name.empty() && cache.name.empty() && !view->retired() &&
      kind != ViewKind::kProducer) {
    NameKey key(std::string(acquired_name), kind);
    if (by_name_.find(key) == by_name_.end()) {
      cache.name = key.first;
      by_name_[key] = view;
    }
  }
  return view;
}

LeaseCache::InsertResult LeaseCache::Insert(LeaseView* view) {
  InsertResult result;
  absl::MutexLock lock(&mu_);
  HeldKey key(view->tensor_id(), view->kind());
  auto it = held_.find(key);
  if (it != held_.end() && it->second != view && Claim(it->second)) {
    result.view = it->second;
    return result;
  }
  held_[key] = view;  // replaces a view at refcount zero, on its way out
  LeaseView::CacheState& cache = CacheOf(view);
  if (!cache.name.empty()) {
    if (!cache_enabled_) {
      cache.name.clear();
    } else {
      NameKey name_key(cache.name, view->kind());
      auto named = by_name_.find(name_key);
      if (named != by_name_.end() && named->second != view) {
        LeaseView* old = named->second;
        LeaseView::CacheState& old_cache = CacheOf(old);
        by_name_.erase(named);
        // The name's binding moved on: the old view no longer serves it.
        old_cache.name.clear();
        if (old_cache.idle) {
          old_cache.idle = false;
          idle_.erase(old);
          auto old_held = held_.find(HeldKey(old->tensor_id(), old->kind()));
          if (old_held != held_.end() && old_held->second == old) held_.erase(old_held);
          result.to_release.push_back(old);
        }
      }
      by_name_[name_key] = view;
    }
  }
  result.view = view;
  result.inserted = true;
  return result;
}

LeaseCache::Disposition LeaseCache::Dispose(LeaseView* view, Clock::time_point now,
                                            bool closing) {
  absl::MutexLock lock(&mu_);
  if (!view->SettleQueued()) return Disposition::kRevived;
  LeaseView::CacheState& cache = CacheOf(view);
  TENSORD_CHECK(!cache.idle);
  bool cacheable = !closing && cache_enabled_ && !view->retired() && !cache.name.empty() &&
                   view->kind() != ViewKind::kProducer;
  if (cacheable) {
    auto named = by_name_.find(NameKey(cache.name, view->kind()));
    cacheable = named != by_name_.end() && named->second == view;
  }
  if (!cacheable) {
    Unindex(view);
    return Disposition::kRelease;
  }
  cache.idle = true;
  cache.idle_deadline = now + linger_;
  idle_.insert(view);
  return Disposition::kCached;
}

std::vector<LeaseView*> LeaseCache::OnRetired(uint64_t tensor_id) {
  std::vector<LeaseView*> out;
  absl::MutexLock lock(&mu_);
  for (ViewKind kind : kAllKinds) {
    auto it = held_.find(HeldKey(tensor_id, kind));
    if (it == held_.end()) continue;
    LeaseView* view = it->second;
    view->MarkRetired();
    MakeUncacheable(view, &out);
  }
  return out;
}

std::vector<LeaseView*> LeaseCache::DropAllCached() {
  std::vector<LeaseView*> out;
  absl::MutexLock lock(&mu_);
  std::vector<LeaseView*> named;
  for (auto& [key, view] : by_name_) named.push_back(view);
  for (LeaseView* view : named) MakeUncacheable(view, &out);
  std::vector<LeaseView*> left(idle_.begin(), idle_.end());  // none expected; be thorough
  for (LeaseView* view : left) MakeUncacheable(view, &out);
  return out;
}

std::vector<LeaseView*> LeaseCache::DropName(std::string_view name) {
  std::vector<LeaseView*> out;
  absl::MutexLock lock(&mu_);
  for (ViewKind kind : kAllKinds) {
    auto it = by_name_.find(NameKey(std::string(name), kind));
    if (it != by_name_.end()) MakeUncacheable(it->second, &out);
  }
  return out;
}

std::vector<LeaseView*> LeaseCache::TakeExpired(Clock::time_point now, Clock::time_point* next) {
  std::vector<LeaseView*> out;
  *next = Clock::time_point::max();
  absl::MutexLock lock(&mu_);
  std::vector<LeaseView*> expired;
  for (LeaseView* view : idle_) {
    const Clock::time_point deadline = CacheOf(view).idle_deadline;
    if (deadline <= now) {
      expired.push_back(view);
    } else if (deadline < *next) {
      *next = deadline;
    }
  }
  for (LeaseView* view : expired) MakeUncacheable(view, &out);
  return out;
}

std::vector<LeaseView*> LeaseCache::TakeAllIdle() {
  std::vector<LeaseView*> out;
  absl::MutexLock lock(&mu_);
  std::vector<LeaseView*> idle(idle_.begin(), idle_.end());
  for (LeaseView* view : idle) MakeUncacheable(view, &out);
  return out;
}

size_t LeaseCache::idle_count() {
  absl::MutexLock lock(&mu_);
  return idle_.size();
}

size_t LeaseCache::held_count() {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

}  // namespace tensord::internal
