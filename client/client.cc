// The public API (tensord/client.h): thin wrappers over internal::ClientCore and
// internal::LeaseView. Every entry point catches std exceptions (Guard), so nothing throws
// across the API.
#include "tensord/client.h"

#include <utility>

#include "absl/synchronization/mutex.h"
#include "client/client_core.h"
#include "client/dlpack_context.h"
#include "client/dlpack_convert.h"
#include "client/lease_view.h"
#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "common/memory/backends.h"
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

Client::Client(std::shared_ptr<internal::ClientCore> core) : core_(std::move(core)) {}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  return Guard("connect", [&]() -> Result<std::unique_ptr<Client>> {
    Result<std::shared_ptr<internal::ClientCore>> core = internal::ClientCore::Create(options);
    if (!core.ok()) return core.status();
    return std::unique_ptr<Client>(new Client(std::move(core).value()));
  });
}

Result<TensorRef> Client::Allocate(std::string_view ns, const TensorSpec& spec) {
  return Guard("allocate", [&] { return core_->Allocate(ns, spec); });
}

Result<TensorRef> Client::Export(int memfd, uint64_t offset, std::string_view ns,
                                 const TensorSpec& spec) {
  return Guard("export", [&] { return core_->Export(memfd, offset, ns, spec); });
}

Result<TensorRef> Client::ExportDevice(const void* device_ptr, std::string_view ns, const TensorSpec& spec,
                                       std::shared_ptr<const void> source) {
  return Guard("export device memory",
               [&] { return core_->ExportDevice(device_ptr, ns, spec, std::move(source)); });
}

Result<TensorInfo> Client::Publish(const TensorRef& tensor, std::string_view name,
                                   const PublishOptions& options) {
  return Guard("publish", [&] { return core_->Publish(tensor, name, options); });
}

Status Client::PublishNoWait(const TensorRef& tensor, std::string_view name,
                             const PublishOptions& options) {
  return Guard("publish", [&] { return core_->PublishNoWait(tensor, name, options); });
}

Result<TensorRef> Client::Acquire(std::string_view name, const AcquireOptions& options) {
  return Guard("acquire", [&] { return core_->Acquire(std::string(name), options); });
}

Result<TensorRef> Client::Acquire(TensorId id, const AcquireOptions& options) {
  return Guard("acquire", [&] { return core_->Acquire(id.value, options); });
}

Result<HandOverToken> Client::HandOver(const TensorRef& tensor, std::chrono::milliseconds ttl) {
  return Guard("hand over", [&] { return core_->HandOver(tensor, ttl); });
}

Result<TensorRef> Client::Redeem(std::string_view token, const AcquireOptions& options) {
  return Guard("redeem", [&] { return core_->Redeem(token, options); });
}

Result<CancelledHandOvers> Client::CancelHandOvers(const std::vector<std::string>& tokens) {
  return Guard("cancel hand-overs", [&] { return core_->CancelHandOvers(tokens); });
}

Result<TensorRef> Client::Take(std::string_view name_or_prefix, Wait wait) {
  return Take(name_or_prefix, TakeOptions{.wait = wait});
}

Result<TensorRef> Client::Take(std::string_view name_or_prefix, const TakeOptions& options) {
  return Guard("take", [&] { return core_->Take(name_or_prefix, options); });
}

Result<std::vector<TensorRef>> Client::AllocateMany(std::string_view ns,
                                                    const std::vector<TensorSpec>& specs) {
  return Guard("allocate", [&] {
    std::vector<AllocateItem> items;
    items.reserve(specs.size());
    for (const TensorSpec& spec : specs) items.push_back(AllocateItem{std::string(ns), spec});
    return core_->AllocateMany(items);
  });
}

Result<std::vector<TensorRef>> Client::AllocateMany(const std::vector<AllocateItem>& items) {
  return Guard("allocate", [&] { return core_->AllocateMany(items); });
}

Result<std::vector<TensorInfo>> Client::PublishMany(const std::vector<PublishItem>& items) {
  return Guard("publish", [&] { return core_->PublishMany(items); });
}

Result<std::vector<TensorRef>> Client::TakeMany(std::string_view name_or_prefix, size_t max_count,
                                                Wait wait) {
  return TakeMany(name_or_prefix, max_count, TakeOptions{.wait = wait});
}

Result<std::vector<TensorRef>> Client::TakeMany(std::string_view name_or_prefix, size_t max_count,
                                                const TakeOptions& options) {
  return Guard("take", [&] { return core_->TakeMany(name_or_prefix, max_count, options); });
}

Result<std::vector<TensorRef>> Client::AcquireMany(const std::vector<std::string>& names,
                                                   const AcquireOptions& options) {
  return Guard("acquire", [&] { return core_->AcquireMany(names, options); });
}

Status Client::Delete(std::string_view name, uint64_t if_generation) {
  return Guard("delete", [&] { return core_->Delete(name, if_generation); });
}

Result<std::vector<TensorInfo>> Client::List(std::string_view prefix) {
  return Guard("list", [&] { return core_->List(prefix); });
}

Result<TensorPage> Client::ListPage(std::string_view prefix, const ListPageOptions& options) {
  return Guard("list", [&] { return core_->ListPage(prefix, options); });
}

Result<TensorStat> Client::Stat(std::string_view name) {
  return Guard("stat", [&] { return core_->Stat(std::string(name)); });
}

Result<TensorStat> Client::Stat(TensorId id) {
  return Guard("stat", [&] { return core_->Stat(id.value); });
}

Result<BrokerStatus> Client::GetStatus(const StatusOptions& options) {
  return Guard("status", [&] { return core_->GetStatus(options); });
}

Result<std::unique_ptr<Watcher>> Client::Watch(std::string_view prefix, bool initial) {
  return Guard("watch", [&] { return core_->Watch(prefix, initial); });
}

Status Client::Flush() {
  return Guard("flush", [&] { return core_->Flush(); });
}

uint64_t Client::session_id() const { return core_->session_id(); }

const std::string& Client::socket_path() const { return core_->socket_path(); }

std::string DefaultClientSocketPath() { return common::DefaultClientSocketPath(); }

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
