// The broker fuzzer's checks (fuzz_broker_harness.h): every status is canonical, documented
// and free of tokens; every registered tensor is valid; and after every op the broker agrees
// with the model (leases, holders, live tensors and buffers, arena slots, bytes in use).
#include "tests/fuzz/fuzz_broker_harness.h"

#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "common/names.h"
#include "common/tensor_desc.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::server::broker_fuzz {
namespace {

// A status of the broker's own handlers: canonical and documented in broker.h.
bool Documented(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:  // the broker is shutting down
      return true;
    default:
      return false;
  }
}

}  // namespace

void Harness::Check(const absl::Status& status, const char* op) {
  if (trace_) std::fprintf(stderr, "  %s: %s\n", op, status.ToString().c_str());
  FUZZ_CHECK(fuzz::IsCanonical(status)) << op << ": " << status;
  FUZZ_CHECK(Documented(status.code())) << op << ": undocumented code: " << status;
  FUZZ_CHECK(fuzz::IsReadableMessage(status.message(), 2048)) << op << ": " << status;
  // Waits complete on the broker's threads while this thread opens sessions.
  std::lock_guard<std::mutex> lock(tokens_mu_);
  for (const std::string& token : tokens_) {
    FUZZ_CHECK(status.message().find(token) == absl::string_view::npos)
        << op << ": the message holds a session token";
  }
}

void Harness::CheckTensorInfo(const v1::TensorInfo& info) {
  absl::StatusOr<common::TensorLayout> layout = common::ValidateDesc(info.desc());
  FUZZ_CHECK(layout.ok()) << "a registered tensor has an invalid description: " << layout.status();
  FUZZ_CHECK(info.nbytes() == layout->nbytes);
  if (info.buffer().buffer_id() != 0) {
    absl::Status fits = common::ValidateFitsBuffer(*layout, info.buffer(), "registered tensor");
    FUZZ_CHECK(fits.ok()) << fits;
  } else {
    FUZZ_CHECK(layout->extent == 0) << "a tensor with bytes has no buffer";
  }
}

void Harness::AddLease(uint64_t session, const v1::AcquireResponse& granted) {
  std::lock_guard<std::mutex> lock(mu_);
  bool inserted = leases_.emplace(granted.lease_id(), Lease{session, granted.tensor().tensor_id()}).second;
  FUZZ_CHECK(inserted) << "lease id " << granted.lease_id() << " granted twice";
  tensors_.insert(granted.tensor().tensor_id());
  if (granted.tensor().buffer().buffer_id() != 0) buffers_.insert(granted.tensor().buffer().buffer_id());
}

void Harness::CheckConsistency() {
  std::lock_guard<std::mutex> lock(mu_);
  v1::StatusResponse status = broker_->GetStatus();
  FUZZ_CHECK(status.leases() == leases_.size())
      << "the broker counts " << status.leases() << " leases, the model " << leases_.size();
  FUZZ_CHECK(status.sessions() == sessions_.size() + 1) << status.sessions();
  FUZZ_CHECK(status.host_bytes_in_use() <= kQuota) << status.host_bytes_in_use();
  FUZZ_CHECK(broker_->QueueSlotsMatchTensorsForTest()) << "a queue counts other slots than its tensors hold";

  v1::ListRequest everything;
  absl::StatusOr<v1::ListResponse> list = broker_->List(auditor_, everything);
  FUZZ_CHECK(list.ok()) << list.status();
  FUZZ_CHECK(static_cast<uint64_t>(list->tensors_size()) == status.named_tensors());

  std::map<uint64_t, uint64_t> buffer_sizes;  // live buffer id -> size
  std::set<uint64_t> live;
  std::string previous;
  for (const v1::TensorInfo& info : list->tensors()) {
    FUZZ_CHECK(common::ValidateName(info.name()).ok()) << info.name();
    FUZZ_CHECK(previous.empty() || previous < info.name()) << "List is not sorted";
    previous = info.name();
    FUZZ_CHECK(info.state() == v1::TENSOR_STATE_SEALED) << info.name() << " " << info.state();
    v1::StatRequest stat_request;
    stat_request.set_name(info.name());
    absl::StatusOr<v1::StatResponse> stat = broker_->Stat(auditor_, stat_request);
    FUZZ_CHECK(stat.ok()) << "List shows " << info.name() << ", Stat says " << stat.status();
    FUZZ_CHECK(stat->tensor().tensor_id() == info.tensor_id() &&
               stat->tensor().generation() == info.generation());
    CheckTensorInfo(info);
    live.insert(info.tensor_id());
    if (info.buffer().buffer_id() != 0) buffer_sizes[info.buffer().buffer_id()] = info.buffer().size();
  }

  // Every leased tensor is alive, with exactly the model's leases and holders.
  std::map<uint64_t, std::map<uint64_t, uint32_t>> holders;  // tensor -> session -> leases
  for (const auto& [lease, owner] : leases_) ++holders[owner.tensor][owner.session];
  for (const auto& [tensor, by_session] : holders) {
    v1::StatRequest stat_request;
    stat_request.set_tensor_id(tensor);
    absl::StatusOr<v1::StatResponse> stat = broker_->Stat(auditor_, stat_request);
    FUZZ_CHECK(stat.ok()) << "leased tensor " << tensor << ": " << stat.status();
    uint32_t total = 0;
    for (const auto& [session, count] : by_session) total += count;
    FUZZ_CHECK(stat->tensor().lease_count() == total)
        << "tensor " << tensor << " counts " << stat->tensor().lease_count() << " leases, the model " << total;
    FUZZ_CHECK(static_cast<size_t>(stat->holders_size()) == by_session.size());
    for (const v1::LeaseHolder& holder : stat->holders()) {
      auto it = by_session.find(holder.session_id());
      FUZZ_CHECK(it != by_session.end() && it->second == holder.leases())
          << "tensor " << tensor << " holder " << holder.session_id();
    }
    CheckTensorInfo(stat->tensor());
    live.insert(tensor);
    if (stat->tensor().buffer().buffer_id() != 0) {
      buffer_sizes[stat->tensor().buffer().buffer_id()] = stat->tensor().buffer().size();
    }
  }
  // An open session's arenas are its pool: they live even when empty.
  for (const auto& [id, arena] : arenas_) buffer_sizes[id] = kArenaBytes;
  // No two live tensors share a byte of an arena.
  std::map<uint64_t, std::map<uint64_t, uint64_t>> slots;  // arena -> offset -> extent
  for (uint64_t tensor : live) {
    v1::StatRequest stat_request;
    stat_request.set_tensor_id(tensor);
    absl::StatusOr<v1::StatResponse> stat = broker_->Stat(auditor_, stat_request);
    FUZZ_CHECK(stat.ok()) << stat.status();
    const v1::BufferRef& ref = stat->tensor().buffer();
    if (!ref.arena()) continue;
    auto [it, inserted] = slots[ref.buffer_id()].emplace(ref.offset(), ref.extent());
    FUZZ_CHECK(inserted) << "two tensors at offset " << ref.offset() << " of arena " << ref.buffer_id();
    if (auto next = std::next(it); next != slots[ref.buffer_id()].end()) {
      FUZZ_CHECK(ref.offset() + ref.extent() <= next->first) << "overlapping slots in arena " << ref.buffer_id();
    }
    if (it != slots[ref.buffer_id()].begin()) {
      auto prev = std::prev(it);
      FUZZ_CHECK(prev->first + prev->second <= ref.offset()) << "overlapping slots in arena " << ref.buffer_id();
    }
  }
  // Nothing else lives: a tensor neither bound nor leased is gone, its bytes returned.
  FUZZ_CHECK(status.tensors() == live.size())
      << status.tensors() << " tensors, " << live.size() << " bound or leased";
  FUZZ_CHECK(status.buffers() == buffer_sizes.size());
  // The quota counts each live buffer's size (page-rounded by Allocate, the memfd's own
  // for an export).
  uint64_t bytes = 0;
  for (const auto& [id, size] : buffer_sizes) bytes += size;
  FUZZ_CHECK(status.host_bytes_in_use() == bytes)
      << status.host_bytes_in_use() << " bytes in use, live buffers hold " << bytes;
}

}  // namespace tensord::server::broker_fuzz
