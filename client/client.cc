// The public API (tensord/client.h): TensorRef over internal::LeaseView, and Client's calls
// run on its current internal::Session through internal::SessionHolder. Every entry point
// catches std exceptions (Guard), so nothing throws across the API.
#include "tensord/client.h"

#include <cstdio>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "client/dlpack_context.h"
#include "client/dlpack_convert.h"
#include "client/lease_view.h"
#include "client/session_holder.h"
#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "common/memory/backends.h"
#include "common/protocol_limits.h"
#include "common/socket_paths.h"
#include "common/tensor_desc.h"

namespace tensord {

using internal::Guard;

// --- TensorRef ---

TensorRef::TensorRef(TensorRef&& other) noexcept : view_(std::exchange(other.view_, nullptr)) {}

TensorRef& TensorRef::operator=(TensorRef&& other) noexcept {
  if (this != &other) {
    Release();
    view_ = std::exchange(other.view_, nullptr);
  }
  return *this;
}

TensorRef::~TensorRef() { Release(); }

void TensorRef::Release() {
  if (internal::LeaseView* view = std::exchange(view_, nullptr)) view->Unref();
}

const TensorInfo& TensorRef::info() const {
  static const TensorInfo* empty = new TensorInfo();
  return view_ != nullptr ? view_->info() : *empty;
}

uint64_t TensorRef::lease_id() const { return view_ != nullptr ? view_->lease_id() : 0; }

const void* TensorRef::data() const { return view_ != nullptr ? view_->data() : nullptr; }

void* TensorRef::mutable_data() const {
  if (view_ == nullptr || view_->readonly()) return nullptr;
  return view_->data();
}

bool TensorRef::readonly() const { return view_ != nullptr && view_->readonly(); }

Status TensorRef::UseOnStream(uintptr_t stream) const {
  if (view_ == nullptr) return Status(StatusCode::kInvalidArgument, "use on a stream: an empty TensorRef");
  return Guard("use on a stream", [&] { return internal::FromAbsl(view_->UseOnStream(stream)); });
}

Status TensorRef::WaitReadyOnHost() const {
  if (view_ == nullptr) return Status(StatusCode::kInvalidArgument, "wait for the producer: an empty TensorRef");
  return Guard("wait for the producer", [&] { return internal::FromAbsl(view_->WaitReadyOnHost()); });
}

Status TensorRef::CopyFromDevice(const void* src, uint64_t bytes, uintptr_t stream) const {
  if (view_ == nullptr) return Status(StatusCode::kInvalidArgument, "copy from device: an empty TensorRef");
  return Guard("copy from device", [&] { return internal::FromAbsl(view_->CopyFromDevice(src, bytes, stream)); });
}

DLManagedTensor* TensorRef::ToDLPack() const {
  return view_ != nullptr ? internal::MakeDLPack(view_) : nullptr;
}

DLManagedTensorVersioned* TensorRef::ToDLPackVersioned() const {
  return view_ != nullptr ? internal::MakeDLPackVersioned(view_) : nullptr;
}

// --- Client ---
//
// Each call runs on the holder's current Session (SessionHolder::Call), inside Guard. What is
// checked before a session is asked for (an empty TensorRef, a batch too long) is checked
// here, so it fails the same with or without a broker.

namespace {

using internal::Session;
using internal::SessionHolder;

// One call of the API: `fn(Session&)` runs on the current session, its result comes back in
// the public types, and nothing it throws leaves the API.
template <typename Fn>
auto OnSession(SessionHolder& holder, std::string_view what, Fn&& fn) {
  return Guard(what, [&] { return holder.Call(std::forward<Fn>(fn)); });
}

Status EmptyTensorRef(std::string_view what) {
  return Status(StatusCode::kInvalidArgument, std::string(what) + ": an empty TensorRef");
}

}  // namespace

Client::Client(std::shared_ptr<internal::SessionHolder> holder) : holder_(std::move(holder)) {}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  return Guard("connect", [&]() -> Result<std::unique_ptr<Client>> {
    Result<std::shared_ptr<SessionHolder>> holder = SessionHolder::Create(options);
    if (!holder.ok()) return holder.status();
    return std::unique_ptr<Client>(new Client(std::move(holder).value()));
  });
}

Result<TensorRef> Client::Allocate(std::string_view ns, const TensorSpec& spec) {
  return OnSession(*holder_, "allocate", [&](Session& s) { return s.Allocate(ns, spec); });
}

Result<TensorRef> Client::AllocateInQueue(std::string_view prefix, const TensorSpec& spec,
                                          const QueueSlotOptions& options) {
  return OnSession(*holder_, "allocate", [&](Session& s) { return s.AllocateInQueue(prefix, spec, options); });
}

Result<TensorRef> Client::Export(int memfd, uint64_t offset, std::string_view ns,
                                 const TensorSpec& spec) {
  return OnSession(*holder_, "export", [&](Session& s) { return s.Export(memfd, offset, ns, spec); });
}

Result<TensorRef> Client::ExportDevice(const void* device_ptr, std::string_view ns, const TensorSpec& spec,
                                       std::shared_ptr<const void> source) {
  return OnSession(*holder_, "export device memory",
                   [&](Session& s) { return s.ExportDevice(device_ptr, ns, spec, std::move(source)); });
}

Result<TensorInfo> Client::Publish(const TensorRef& tensor, std::string_view name,
                                   const PublishOptions& options) {
  return Guard("publish", [&]() -> Result<TensorInfo> {
    if (!tensor) return EmptyTensorRef("publish");
    return holder_->Call([&](Session& s) { return s.Publish(*SessionHolder::ViewOf(tensor), name, options); });
  });
}

Status Client::PublishNoWait(const TensorRef& tensor, std::string_view name,
                             const PublishOptions& options) {
  return Guard("publish", [&]() -> Status {
    if (!tensor) return EmptyTensorRef("publish");
    return holder_->Call([&](Session& s) { return s.PublishNoWait(*SessionHolder::ViewOf(tensor), name, options); });
  });
}

Result<TensorRef> Client::Acquire(std::string_view name, const AcquireOptions& options) {
  return OnSession(*holder_, "acquire", [&](Session& s) { return s.Acquire(std::string(name), options); });
}

Result<TensorRef> Client::Acquire(TensorId id, const AcquireOptions& options) {
  return OnSession(*holder_, "acquire", [&](Session& s) { return s.Acquire(id.value, options); });
}

Result<HandOverToken> Client::HandOver(const TensorRef& tensor, std::chrono::milliseconds ttl) {
  return Guard("hand over", [&]() -> Result<HandOverToken> {
    if (!tensor) return EmptyTensorRef("hand over");
    return holder_->Call([&](Session& s) { return s.HandOver(*SessionHolder::ViewOf(tensor), ttl); });
  });
}

Result<TensorRef> Client::Redeem(std::string_view token, const AcquireOptions& options) {
  return OnSession(*holder_, "redeem", [&](Session& s) { return s.Redeem(token, options); });
}

Result<CancelledHandOvers> Client::CancelHandOvers(const std::vector<std::string>& tokens) {
  return Guard("cancel hand-overs", [&]() -> Result<CancelledHandOvers> {
    if (tokens.size() > common::kMaxCancelHandOversBatch) {
      return Status(StatusCode::kInvalidArgument,
                    "cancel hand-overs: " + std::to_string(tokens.size()) + " tokens; at most " +
                        std::to_string(common::kMaxCancelHandOversBatch) + " per call (none was cancelled)");
    }
    return holder_->Call([&](Session& s) { return s.CancelHandOvers(tokens); });
  });
}

Result<TensorRef> Client::Take(std::string_view name_or_prefix, Wait wait) {
  return Take(name_or_prefix, TakeOptions{.wait = wait});
}

Result<TensorRef> Client::Take(std::string_view name_or_prefix, const TakeOptions& options) {
  return OnSession(*holder_, "take", [&](Session& s) { return s.Take(name_or_prefix, options); });
}

Result<std::vector<TensorRef>> Client::AllocateMany(std::string_view ns,
                                                    const std::vector<TensorSpec>& specs) {
  return Guard("allocate", [&] {
    std::vector<AllocateItem> items;
    items.reserve(specs.size());
    for (const TensorSpec& spec : specs) items.push_back(AllocateItem{std::string(ns), spec});
    return holder_->Call([&](Session& s) { return s.AllocateMany(items); });
  });
}

Result<std::vector<TensorRef>> Client::AllocateMany(const std::vector<AllocateItem>& items) {
  return OnSession(*holder_, "allocate", [&](Session& s) { return s.AllocateMany(items); });
}

Result<std::vector<TensorInfo>> Client::PublishMany(const std::vector<PublishItem>& items) {
  return Guard("publish", [&]() -> Result<std::vector<TensorInfo>> {
    std::vector<Session::PublishTarget> targets;
    targets.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].tensor == nullptr || !*items[i].tensor) {
        return EmptyTensorRef("publish element " + std::to_string(i) + " of " + std::to_string(items.size()) +
                              " as '" + items[i].name + "'");
      }
      targets.push_back(Session::PublishTarget{SessionHolder::ViewOf(*items[i].tensor), items[i].name, items[i].options});
    }
    return holder_->Call([&](Session& s) { return s.PublishMany(targets); });
  });
}

Result<std::vector<TensorRef>> Client::TakeMany(std::string_view name_or_prefix, size_t max_count,
                                                Wait wait) {
  return TakeMany(name_or_prefix, max_count, TakeOptions{.wait = wait});
}

Result<std::vector<TensorRef>> Client::TakeMany(std::string_view name_or_prefix, size_t max_count,
                                                const TakeOptions& options) {
  return OnSession(*holder_, "take", [&](Session& s) { return s.TakeMany(name_or_prefix, max_count, options); });
}

Result<std::vector<TensorRef>> Client::AcquireMany(const std::vector<std::string>& names,
                                                   const AcquireOptions& options) {
  return OnSession(*holder_, "acquire", [&](Session& s) { return s.AcquireMany(names, options); });
}

Status Client::Delete(std::string_view name, uint64_t if_generation) {
  return OnSession(*holder_, "delete", [&](Session& s) { return s.Delete(name, if_generation); });
}

Result<std::vector<TensorInfo>> Client::List(std::string_view prefix) {
  return Guard("list", [&]() -> Result<std::vector<TensorInfo>> {
    std::vector<TensorInfo> out;
    ListPageOptions options;
    // Page by page, each on the session current then.
    do {
      Result<TensorPage> page = holder_->Call([&](Session& s) { return s.ListPage(prefix, options); });
      if (!page.ok()) return page.status();
      if (out.empty()) {
        out = std::move(page->tensors);
      } else {
        out.insert(out.end(), std::make_move_iterator(page->tensors.begin()),
                   std::make_move_iterator(page->tensors.end()));
      }
      options.page_token = std::move(page->next_page_token);
    } while (!options.page_token.empty());
    return out;
  });
}

Result<TensorPage> Client::ListPage(std::string_view prefix, const ListPageOptions& options) {
  return OnSession(*holder_, "list", [&](Session& s) { return s.ListPage(prefix, options); });
}

Result<TensorStat> Client::Stat(std::string_view name) {
  return OnSession(*holder_, "stat", [&](Session& s) { return s.Stat(std::string(name)); });
}

Result<TensorStat> Client::Stat(TensorId id) {
  return OnSession(*holder_, "stat", [&](Session& s) { return s.Stat(id.value); });
}

Result<BrokerStatus> Client::GetStatus(const StatusOptions& options) {
  return OnSession(*holder_, "status", [&](Session& s) { return s.GetStatus(options); });
}

Result<std::unique_ptr<Watcher>> Client::Watch(std::string_view prefix, bool initial) {
  return OnSession(*holder_, "watch", [&](Session& s) { return s.Watch(prefix, initial); });
}

Status Client::Flush() {
  return OnSession(*holder_, "flush", [&](Session& s) { return s.Flush(); });
}

uint64_t Client::session_id() const { return holder_->session_id(); }

const std::string& Client::socket_path() const { return holder_->socket_path(); }

std::string DefaultClientSocketPath() { return common::DefaultClientSocketPath(); }

std::string QueueItemName(std::string_view prefix, const TensorRef& tensor) {
  char id[24];
  std::snprintf(id, sizeof(id), "%020llu", static_cast<unsigned long long>(tensor.info().tensor_id));
  return std::string(prefix) + id;
}

// The names are the wire's (common/tensor_desc.h), so tensord has one table of them.
Result<std::string> DTypeName(DLDataType dtype) {
  return Guard("dtype name", [&]() -> Result<std::string> {
    absl::StatusOr<v1::DataType> wire = internal::FromDLDataType(dtype);
    if (!wire.ok()) return internal::FromAbsl(wire.status());
    return common::DTypeName(*wire);
  });
}

Result<DLDataType> ParseDTypeName(std::string_view name) {
  return Guard("dtype name", [&]() -> Result<DLDataType> {
    absl::StatusOr<v1::DataType> wire = common::ParseDTypeName(name);
    if (!wire.ok()) return internal::FromAbsl(wire.status());
    return internal::ToDLDataType(*wire);
  });
}

const char* TensorStateName(TensorState state) { return internal::TensorStateName(state); }

void DisableLockOrderChecks() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

Status UseLevelZeroContext(void* ze_driver, void* ze_context) {
  return internal::FromAbsl(common::UseLevelZeroContext(ze_driver, ze_context));
}

}  // namespace tensord
