// The broker fuzzer's ops (fuzz_broker_harness.h): each builds a request from the input (or
// parses one from raw bytes), calls the broker's handler as a session, checks the answer and
// records in the model what it granted or released.
#include "tests/fuzz/fuzz_broker_harness.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/memory/host/memfd.h"
#include "common/names.h"
#include "common/unique_fd.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::server::broker_fuzz {
namespace {

// Release answers a plain response or a StatusOr, depending on the broker's version.
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}
template <typename T>
absl::Status StatusOf(const T&) {
  return absl::OkStatus();
}
template <typename T>
const T& ValueOf(const absl::StatusOr<T>& result) {
  return *result;
}
template <typename T>
const T& ValueOf(const T& result) {
  return result;
}

}  // namespace

void Harness::OpenSession(FuzzedDataProvider& in) {
  const Identity kIdentities[] = {{getuid(), getgid()}, {0, 0}, {kReaderUid, kReaderUid},
                                  {kWriterUid, kWriterUid}, {kStrangerUid, kTeamGid},
                                  {kStrangerUid, kStrangerUid}};
  Identity who = in.PickValueInArray(kIdentities);
  std::string client_name = in.ConsumeRandomLengthString(300);
  auto welcome = broker_->OpenSession({who.uid, who.gid, getpid()}, client_name);
  Check(welcome.status(), "OpenSession");
  if (!welcome.ok()) return;
  FUZZ_CHECK(welcome->session_token().size() == 32) << welcome->session_token().size();
  FUZZ_CHECK(!sessions_.contains(welcome->session_id()) && welcome->session_id() != auditor_);
  sessions_[welcome->session_id()] = who;
  {
    std::lock_guard<std::mutex> lock(tokens_mu_);
    tokens_.push_back(welcome->session_token());
  }
  // The token authenticates its own uid and gid only.
  absl::StatusOr<uint64_t> same = broker_->Authenticate(welcome->session_token(), {who.uid, who.gid, 1});
  FUZZ_CHECK(same.ok() && *same == welcome->session_id()) << same.status();
  absl::StatusOr<uint64_t> other =
      broker_->Authenticate(welcome->session_token(), {who.uid + 1, who.gid, 1});
  FUZZ_CHECK(other.status().code() == absl::StatusCode::kUnauthenticated) << other.status();
  Check(other.status(), "Authenticate");
  absl::StatusOr<uint64_t> forged = broker_->Authenticate(in.ConsumeRandomLengthString(40), {who.uid, who.gid, 1});
  Check(forged.status(), "Authenticate");
}

void Harness::CloseSession(FuzzedDataProvider& in) {
  uint64_t id = PickSession(in);
  if (id == auditor_) return;
  broker_->CloseSession(id);
  sessions_.erase(id);
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(leases_, [&](const auto& entry) { return entry.second.session == id; });
  std::erase_if(arenas_, [&](const auto& entry) { return entry.second.owner == id; });
}

void Harness::Allocate(uint64_t session, const v1::AllocateRequest& request) {
  std::promise<absl::StatusOr<v1::AllocateResponse>> promise;
  auto ran = std::make_shared<int>(0);
  broker_->Allocate(session, request, [&promise, ran](absl::StatusOr<v1::AllocateResponse> result) {
    FUZZ_CHECK(++*ran == 1) << "Allocate completed twice";
    promise.set_value(std::move(result));
  });
  absl::StatusOr<v1::AllocateResponse> result = promise.get_future().get();
  Check(result.status(), "Allocate");
  if (!result.ok()) return;
  const v1::TensorInfo& tensor = result->tensor();
  FUZZ_CHECK(tensor.state() == v1::TENSOR_STATE_CREATING && tensor.lease_count() == 1);
  FUZZ_CHECK(tensor.buffer().size() % kPage == 0);
  FUZZ_CHECK(tensor.desc().shape_size() == request.desc().shape_size());
  CheckTensorInfo(tensor);
  if (tensor.buffer().arena()) {
    FUZZ_CHECK(tensor.buffer().size() == kArenaBytes && tensor.buffer().offset() % kPage == 0 &&
               !request.isolated() && !request.ns().empty());
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = arenas_.try_emplace(tensor.buffer().buffer_id(), Arena{session, request.ns()});
    FUZZ_CHECK(it->second.owner == session && it->second.ns == request.ns())
        << "arena " << it->first << " serves session " << it->second.owner << " '" << it->second.ns
        << "', not session " << session << " '" << request.ns() << "'";
  }
  v1::AcquireResponse granted;
  granted.set_lease_id(result->lease_id());
  *granted.mutable_tensor() = tensor;
  AddLease(session, granted);
}

void Harness::AllocateOp(FuzzedDataProvider& in) {
  v1::AllocateRequest request;
  request.set_ns(Namespace(in));
  *request.mutable_desc() = Desc(in);
  request.set_isolated(in.ConsumeBool());
  Tags(in, request.mutable_tags());
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    // A bounded work queue's slot, never waited for (a wait would outlive the op).
    request.mutable_queue()->set_prefix(Prefix(in));
    request.mutable_queue()->set_depth(in.ConsumeIntegralInRange<uint32_t>(0, 3));
    if (in.ConsumeBool()) request.mutable_queue()->set_timeout_ms(0);
  }
  Allocate(PickSession(in), request);
}

void Harness::Export(uint64_t session, const v1::ExportRequest& request) {
  absl::StatusOr<v1::AllocateResponse> result = broker_->Export(session, request);
  Check(result.status(), "Export");
  if (!result.ok()) return;
  FUZZ_CHECK(result->tensor().state() == v1::TENSOR_STATE_CREATING);
  CheckTensorInfo(result->tensor());
  v1::AcquireResponse granted;
  granted.set_lease_id(result->lease_id());
  *granted.mutable_tensor() = result->tensor();
  AddLease(session, granted);
}

void Harness::StageAndExportOp(FuzzedDataProvider& in) {
  uint64_t session = PickSession(in);
  bool sealable = in.ConsumeIntegralInRange<int>(0, 5) != 0;
  common::UniqueFd fd(memfd_create("fuzz-export", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0)));
  FUZZ_CHECK(fd.valid()) << std::strerror(errno);
  uint64_t size = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 3 * kPage)
                                   : in.ConsumeIntegralInRange<uint64_t>(0, kQuota + kPage);
  FUZZ_CHECK(ftruncate(fd.get(), static_cast<off_t>(size)) == 0) << std::strerror(errno);
  if (sealable && in.ConsumeIntegralInRange<int>(0, 5) == 0) fcntl(fd.get(), F_ADD_SEALS, F_SEAL_GROW);
  absl::StatusOr<v1::Staged> staged = broker_->StageFd(session, std::move(fd));
  Check(staged.status(), "StageFd");
  if (staged.ok()) {
    FUZZ_CHECK(staged->size() == size);
    staged_.insert(staged->staged_fd_id());
  }
  if (in.ConsumeIntegralInRange<int>(0, 4) == 0) return;  // left staged
  v1::ExportRequest request;
  request.set_staged_fd_id(Pick(in, staged_));
  request.set_ns(Namespace(in));
  *request.mutable_desc() = Desc(in);
  request.set_offset(in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, kPage) : Edgy(in));
  Tags(in, request.mutable_tags());
  Export(session, request);
}

void Harness::FetchAndSealOp(FuzzedDataProvider& in) {
  uint64_t session = PickSession(in);
  v1::FetchFd request;
  int count = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? in.ConsumeIntegralInRange<int>(0, 300)
                                                        : in.ConsumeIntegralInRange<int>(1, 2);
  for (int i = 0; i < count; ++i) request.add_buffer_ids(Pick(in, buffers_));
  absl::StatusOr<std::vector<Broker::FetchedHandle>> fetched = broker_->FetchHandles(session, request);
  Check(fetched.status(), "FetchHandles");
  if (!fetched.ok()) return;
  // Host buffers have one fd each, so a reply within 253 fds holds every buffer asked for.
  FUZZ_CHECK(fetched->size() == static_cast<size_t>(count));
  bool seal = in.ConsumeIntegralInRange<int>(0, 4) != 0;
  for (size_t i = 0; i < fetched->size(); ++i) {
    const Broker::FetchedHandle& entry = (*fetched)[i];
    FUZZ_CHECK(entry.buffer_id == request.buffer_ids(static_cast<int>(i)) && entry.handle.fds.size() == 1 &&
               entry.handle.fds[0].valid() && entry.handle.data.empty() &&
               entry.device_type == v1::DEVICE_TYPE_CPU);
    // The client maps `size` bytes and refuses an fd that holds fewer.
    const int fd = entry.handle.fds[0].get();
    absl::StatusOr<uint64_t> size = common::FdSize(fd, "fetched fd");
    FUZZ_CHECK(size.ok() && *size >= entry.size)
        << "buffer " << entry.buffer_id << ": the fd holds " << *size << " bytes, the broker says "
        << entry.size;
    if (seal) (void)common::SealFutureWrite(fd, "fetched fd");
  }
}

void Harness::Publish(uint64_t session, const v1::PublishRequest& request) {
  absl::StatusOr<v1::PublishResponse> result = broker_->Publish(session, request);
  Check(result.status(), "Publish");
  if (!result.ok()) return;
  FUZZ_CHECK(result->tensor().state() == v1::TENSOR_STATE_SEALED);
  FUZZ_CHECK(result->tensor().name() == request.name());
  CheckTensorInfo(result->tensor());
}

void Harness::PublishOp(FuzzedDataProvider& in) {
  v1::PublishRequest request;
  request.set_tensor_id(Pick(in, tensors_));
  if (in.ConsumeIntegralInRange<int>(0, 4) != 0) request.set_name(Name(in));
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: request.set_if_absent(in.ConsumeBool()); break;
    case 1: request.set_if_generation(in.ConsumeIntegralInRange<uint64_t>(0, 8)); break;
    default: break;
  }
  // TTLs that never fire during one input: expiry would race with the checks.
  if (in.ConsumeBool()) request.set_ttl_ms(in.ConsumeBool() ? 3600 * 1000 : Edgy(in) | (uint64_t{1} << 40));
  request.set_unbind_on_exit(in.ConsumeIntegralInRange<int>(0, 3) == 0);
  Publish(PickSession(in), request);
}

void Harness::AcquireOp(FuzzedDataProvider& in, const v1::AcquireRequest* raw) {
  v1::AcquireRequest request;
  if (raw != nullptr) {
    request = *raw;
  } else {
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: request.set_tensor_id(Pick(in, tensors_)); break;
      case 1: break;  // no target
      default: request.set_name(Name(in)); break;
    }
    Wait(in, &request);
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) request.set_min_generation(in.ConsumeIntegralInRange<uint64_t>(0, 10));
  }
  uint64_t session = PickSession(in);
  StartWait(session, "Acquire", [&](auto done) { return broker_->Acquire(session, request, std::move(done)); });
}

void Harness::TakeOp(FuzzedDataProvider& in, const v1::TakeRequest* raw) {
  v1::TakeRequest request;
  if (raw != nullptr) {
    request = *raw;
  } else {
    request.set_name_or_prefix(in.ConsumeBool() ? Name(in) : Prefix(in));
    Wait(in, &request);
  }
  uint64_t session = PickSession(in);
  StartWait(session, "Take", [&](auto done) { return broker_->Take(session, request, std::move(done)); });
}

void Harness::Release(uint64_t session, const v1::ReleaseRequest& request) {
  auto result = broker_->Release(session, request);
  absl::Status status = StatusOf(result);
  Check(status, "Release");
  std::lock_guard<std::mutex> lock(mu_);
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument &&
               static_cast<size_t>(request.lease_ids_size()) > 65536)
        << status;
    return;  // nothing released
  }
  const v1::ReleaseResponse& response = ValueOf(result);
  std::vector<uint64_t> expected_not_found;
  uint32_t expected_released = 0;
  for (uint64_t id : request.lease_ids()) {
    auto it = leases_.find(id);
    if (it != leases_.end() && it->second.session == session && IsOpen(session)) {
      leases_.erase(it);
      ++expected_released;
    } else {
      expected_not_found.push_back(id);
    }
  }
  FUZZ_CHECK(response.released() == expected_released)
      << "released " << response.released() << ", the model expects " << expected_released;
  FUZZ_CHECK(std::vector<uint64_t>(response.not_found().begin(), response.not_found().end()) ==
             expected_not_found);
}

void Harness::ReleaseOp(FuzzedDataProvider& in) {
  v1::ReleaseRequest request;
  std::set<uint64_t> known = KnownLeases();
  int count = in.ConsumeIntegralInRange<int>(0, 63) == 0 ? 65537 : in.ConsumeIntegralInRange<int>(0, 6);
  for (int i = 0; i < count; ++i) request.add_lease_ids(i < 8 ? Pick(in, known) : uint64_t(i));
  Release(PickSession(in), request);
}

void Harness::DeleteOp(FuzzedDataProvider& in, const v1::DeleteRequest* raw) {
  v1::DeleteRequest request;
  if (raw != nullptr) {
    request = *raw;
  } else {
    request.set_name(Name(in));
    if (in.ConsumeBool()) request.set_if_generation(in.ConsumeIntegralInRange<uint64_t>(0, 10));
  }
  absl::StatusOr<v1::DeleteResponse> result = broker_->Delete(PickSession(in), request);
  Check(result.status(), "Delete");
}

void Harness::ListOp(FuzzedDataProvider& in, const v1::ListRequest* raw) {
  v1::ListRequest request;
  if (raw != nullptr) {
    request = *raw;
  } else {
    request.set_prefix(Prefix(in));
  }
  absl::StatusOr<v1::ListResponse> result = broker_->List(PickSession(in), request);
  Check(result.status(), "List");
  if (!result.ok()) return;
  for (const v1::TensorInfo& info : result->tensors()) {
    FUZZ_CHECK(common::NameHasPrefix(info.name(), request.prefix()))
        << info.name() << " listed under " << request.prefix();
  }
}

void Harness::StatOp(FuzzedDataProvider& in, const v1::StatRequest* raw) {
  v1::StatRequest request;
  if (raw != nullptr) {
    request = *raw;
  } else if (in.ConsumeBool()) {
    request.set_name(Name(in));
  } else if (in.ConsumeIntegralInRange<int>(0, 5) != 0) {
    request.set_tensor_id(Pick(in, tensors_));
  }
  absl::StatusOr<v1::StatResponse> result = broker_->Stat(PickSession(in), request);
  Check(result.status(), "Stat");
}

void Harness::WatchOp(FuzzedDataProvider& in, const v1::WatchRequest* raw) {
  if (raw == nullptr && !watchers_.empty() && in.ConsumeBool()) {
    uint64_t id = Pick(in, watchers_);
    broker_->RemoveWatcher(id);
    watchers_.erase(id);
    return;
  }
  v1::WatchRequest request;
  if (raw != nullptr) {
    request = *raw;
  } else {
    request.set_prefix(Prefix(in));
    request.set_initial(in.ConsumeBool());
  }
  auto sink = std::make_shared<FuzzWatchSink>(in.ConsumeIntegralInRange<int>(0, 3) != 0);
  absl::StatusOr<uint64_t> id = broker_->AddWatcher(PickSession(in), request, sink);
  Check(id.status(), "AddWatcher");
  if (id.ok()) watchers_.insert(*id);
}

void Harness::SinkOp(FuzzedDataProvider& in) {
  uint64_t session = PickSession(in);
  if (in.ConsumeBool()) {
    auto sink = std::make_shared<FuzzPushSink>(in.ConsumeBool());
    (void)broker_->AttachSink(session, sink);  // whether a reset is owed: not modelled
    push_sinks_.push_back(sink);
  } else if (!push_sinks_.empty()) {
    broker_->DetachSink(session, push_sinks_[in.ConsumeIntegralInRange<size_t>(0, push_sinks_.size() - 1)].get());
  }
}

void Harness::RawOp(FuzzedDataProvider& in) {
  int handler = in.ConsumeIntegralInRange<int>(0, 8);
  std::string bytes = in.ConsumeRandomLengthString(512);
  switch (handler) {
    case 0: {
      v1::AllocateRequest request;
      (void)request.ParseFromString(bytes);
      Allocate(PickSession(in), request);
      break;
    }
    case 1: {
      v1::ExportRequest request;
      (void)request.ParseFromString(bytes);
      Export(PickSession(in), request);
      break;
    }
    case 2: {
      v1::PublishRequest request;
      (void)request.ParseFromString(bytes);
      Publish(PickSession(in), request);
      break;
    }
    case 3: {
      v1::AcquireRequest request;
      (void)request.ParseFromString(bytes);
      AcquireOp(in, &request);
      break;
    }
    case 4: {
      v1::TakeRequest request;
      (void)request.ParseFromString(bytes);
      TakeOp(in, &request);
      break;
    }
    case 5: {
      v1::ReleaseRequest request;
      (void)request.ParseFromString(bytes);
      Release(PickSession(in), request);
      break;
    }
    case 6: {
      v1::DeleteRequest request;
      (void)request.ParseFromString(bytes);
      DeleteOp(in, &request);
      break;
    }
    case 7: {
      v1::ListRequest request;
      (void)request.ParseFromString(bytes);
      ListOp(in, &request);
      break;
    }
    default: {
      v1::StatRequest request;
      (void)request.ParseFromString(bytes);
      StatOp(in, &request);
      break;
    }
  }
}

}  // namespace tensord::server::broker_fuzz
