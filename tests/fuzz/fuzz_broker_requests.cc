// The Broker's request handlers (server/broker/broker.h), in-process, driven by a sequence of
// operations decoded from the input: each op picks a handler by a byte and builds its
// request from the following bytes (extreme integers, long and odd names, known and random
// ids, several identities), or parses the request from raw bytes. A fresh Broker serves
// each input, so a crash replays from its input alone.
//
// The harness keeps a model of what must be true and checks it after every op:
//   - every status is canonical, in the set broker.h documents, and never holds a token;
//   - leases: GetStatus's count, each tensor's lease_count and its holders match the
//     leases the model saw granted (by Allocate, Export, Acquire, Take and completed
//     waits) minus those released or dropped with their session, and Release reports
//     exactly which of its ids it released;
//   - List and Stat agree (same tensor and generation per name), listed tensors are
//     sealed, validly named and described, and fit their buffers;
//   - tensors live exactly while bound or leased, and host bytes in use equal the sizes
//     of the live tensors' buffers, never above the quota;
//   - at the end every session closes, nothing stays leased, and every Allocate, Acquire
//     and Take completion ran exactly once.
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/memory/host/host_backend.h"
#include "common/memory/host/memfd.h"
#include "common/names.h"
#include "common/tensor_desc.h"
#include "google/protobuf/stubs/logging.h"
#include "server/broker/broker.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;

constexpr uint64_t kQuota = 1 << 20;
constexpr uint64_t kPage = 4096;
constexpr uint64_t kArenaBytes = 64 << 10;
constexpr int kMaxOps = 48;
constexpr uid_t kReaderUid = 4242;   // may read namespace "shared"
constexpr uid_t kWriterUid = 4243;   // may write namespace "shared"
constexpr gid_t kTeamGid = 5000;     // may read and write namespace "team"
constexpr uid_t kStrangerUid = 9999;

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

// Caps the broker may have (fields added over time): small, so the fuzzer reaches them.
template <typename Options>
void SetSmallCaps(Options& options) {
  if constexpr (requires { options.max_sessions; }) options.max_sessions = 8;
  if constexpr (requires { options.max_leases_per_session; }) options.max_leases_per_session = 24;
  if constexpr (requires { options.max_waits_per_session; }) options.max_waits_per_session = 6;
}

class FuzzWatchSink final : public WatchSink {
 public:
  explicit FuzzWatchSink(bool accept) : accept_(accept) {}
  bool Push(const v1::WatchEvent& event) override {
    FUZZ_CHECK(event.kind() == v1::WatchEvent::KIND_BOUND ||
               event.kind() == v1::WatchEvent::KIND_UNBOUND ||
               event.kind() == v1::WatchEvent::KIND_RESET)
        << event.kind();
    if (event.kind() != v1::WatchEvent::KIND_RESET) {
      FUZZ_CHECK(common::ValidateName(event.name()).ok()) << event.name();
    }
    if (event.kind() == v1::WatchEvent::KIND_BOUND) {
      FUZZ_CHECK(event.tensor().name() == event.name() && event.generation() > 0);
    }
    return accept_;
  }
  void Close() override {}

 private:
  const bool accept_;
};

class FuzzPushSink final : public PushSink {
 public:
  explicit FuzzPushSink(bool accept) : accept_(accept) {}
  bool Push(const v1::SessionResponse&) override { return accept_; }
  void Close() override {}

 private:
  const bool accept_;
};

struct Identity {
  uid_t uid;
  gid_t gid;
};

class Harness {
 public:
  Harness() {
    BrokerOptions options;
    options.max_host_bytes = kQuota;
    // Small arenas, so allocations fill them, make more and hit the quota.
    options.arena_bytes = kArenaBytes;
    options.arena_max_tensor_bytes = kArenaBytes / 4;
    options.daemon_uid = getuid();
    options.acls["shared"].read_uids = {kReaderUid};
    options.acls["shared"].write_uids = {kWriterUid};
    options.acls["team"].read_gids = {kTeamGid};
    options.acls["team"].write_gids = {kTeamGid};
    SetSmallCaps(options);
    broker_ = std::make_unique<Broker>(std::move(options), server::HostOnlyBackends());
    // The auditor reads everything (the daemon's own uid) and is never closed by an op.
    auto welcome = broker_->OpenSession({getuid(), getgid(), getpid()}, "auditor");
    FUZZ_CHECK(welcome.ok()) << welcome.status();
    auditor_ = welcome->session_id();
    {
      std::lock_guard<std::mutex> lock(tokens_mu_);
      tokens_.push_back(welcome->session_token());
    }
  }

  void Run(FuzzedDataProvider& in) {
    for (int op = 0; op < kMaxOps && in.remaining_bytes() > 0; ++op) {
      Step(in);
      CheckConsistency();
    }
    Finish();
  }

 private:
  // --- values -------------------------------------------------------------------------

  std::string Name(FuzzedDataProvider& in) {
    static const char* const kNames[] = {"ns/a", "ns/b", "ns/a/b", "shared/x", "shared/y/z",
                                         "team/q", "other/w", "ns", "a"};
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0: return in.ConsumeRandomLengthString(64);
      case 1: return "ns/" + std::string(in.ConsumeIntegralInRange<size_t>(250, 520), 'n');
      case 2: {
        static constexpr std::string_view kOdd[] = {
            "", "/", "ns/", "/ns", "ns//a", "ns/./a", "ns/../a", ".", "..", "ns/a\n",
            std::string_view("ns/\0a", 5), "ns/\xff", "ns a"};
        return std::string(in.PickValueInArray(kOdd));
      }
      default: return in.PickValueInArray(kNames);
    }
  }

  std::string Prefix(FuzzedDataProvider& in) {
    static const char* const kPrefixes[] = {"", "ns/", "ns", "shared/", "team/", "ns/a", "zz/",
                                            "ns/a/", "/", "ns//"};
    return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeRandomLengthString(40)
                                                     : in.PickValueInArray(kPrefixes);
  }

  std::string Namespace(FuzzedDataProvider& in) {
    static const char* const kNs[] = {"", "ns", "shared", "team", "other", "ns/a", "..", "n s"};
    return in.ConsumeIntegralInRange<int>(0, 9) == 0 ? in.ConsumeRandomLengthString(300)
                                                     : in.PickValueInArray(kNs);
  }

  uint64_t Edgy(FuzzedDataProvider& in) {
    static constexpr uint64_t kEdges[] = {0, 1, 2, std::numeric_limits<uint64_t>::max(),
                                          std::numeric_limits<uint64_t>::max() - 1,
                                          uint64_t{1} << 63, uint64_t{1} << 32};
    return in.ConsumeBool() ? in.PickValueInArray(kEdges) : in.ConsumeIntegral<uint64_t>();
  }

  // A known id of the kind (most of the time) or anything.
  uint64_t Pick(FuzzedDataProvider& in, const std::set<uint64_t>& known) {
    if (known.empty() || in.ConsumeIntegralInRange<int>(0, 5) == 0) {
      return in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 40) : Edgy(in);
    }
    auto it = known.begin();
    std::advance(it, in.ConsumeIntegralInRange<size_t>(0, known.size() - 1));
    return *it;
  }

  std::set<uint64_t> OpenSessionIds() const {
    std::set<uint64_t> ids;
    for (const auto& [id, session] : sessions_) ids.insert(id);
    return ids;
  }

  std::set<uint64_t> KnownLeases() {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<uint64_t> ids;
    for (const auto& [lease, owner] : leases_) ids.insert(lease);
    return ids;
  }

  v1::TensorDesc Desc(FuzzedDataProvider& in) {
    v1::TensorDesc desc;
    bool plain = in.ConsumeIntegralInRange<int>(0, 4) != 0;
    desc.mutable_dtype()->set_code(plain ? v1::DTYPE_CODE_FLOAT
                                         : static_cast<v1::DTypeCode>(in.ConsumeIntegralInRange<int>(0, 8)));
    static constexpr uint32_t kBits[] = {8, 16, 32, 64, 128, 0, 7};
    desc.mutable_dtype()->set_bits(plain ? 32 : in.PickValueInArray(kBits));
    desc.mutable_dtype()->set_lanes(plain || in.ConsumeBool() ? 1 : in.ConsumeIntegral<uint32_t>());
    int ndim = in.ConsumeIntegralInRange<int>(0, plain ? 3 : 34);
    for (int i = 0; i < ndim; ++i) {
      desc.add_shape(in.ConsumeIntegralInRange<int>(0, 7) == 0
                         ? static_cast<int64_t>(Edgy(in))
                         : in.ConsumeIntegralInRange<int64_t>(0, 300));
    }
    if (!plain && in.ConsumeBool()) {
      for (int i = 0; i < ndim; ++i) desc.add_strides(static_cast<int64_t>(Edgy(in) % 4096));
    }
    if (!plain && in.ConsumeBool()) desc.set_byte_offset(Edgy(in) % (2 * kQuota));
    bool cpu = plain || in.ConsumeBool();
    desc.mutable_device()->set_type(cpu ? v1::DEVICE_TYPE_CPU
                                        : static_cast<v1::DeviceType>(in.ConsumeIntegralInRange<int>(0, 15)));
    if (!cpu) desc.mutable_device()->set_index(in.ConsumeIntegral<int32_t>());
    return desc;
  }

  void Tags(FuzzedDataProvider& in, google::protobuf::Map<std::string, std::string>* tags) {
    int count = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? 65 : in.ConsumeIntegralInRange<int>(0, 2);
    for (int i = 0; i < count; ++i) {
      std::string key = in.ConsumeBool() ? "k" + std::to_string(i)
                                         : std::string(in.ConsumeIntegralInRange<size_t>(0, 300), 'k');
      (*tags)[key] = std::string(in.ConsumeIntegralInRange<size_t>(0, 5000), 'v');
    }
  }

  // Waits: none (fail at once), a short or long timeout, or forever.
  template <typename Request>
  void Wait(FuzzedDataProvider& in, Request* request) {
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: break;
      case 1: request->set_timeout_ms(in.ConsumeIntegralInRange<uint64_t>(0, 3)); break;
      case 2: request->set_timeout_ms(60000); break;
      case 3: request->set_forever(in.ConsumeBool()); break;
      default: request->set_timeout_ms(Edgy(in)); break;
    }
  }

  // --- checks -------------------------------------------------------------------------

  void Check(const absl::Status& status, const char* op) {
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

  void CheckTensorInfo(const v1::TensorInfo& info) {
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

  void AddLease(uint64_t session, const v1::AcquireResponse& granted) {
    std::lock_guard<std::mutex> lock(mu_);
    bool inserted = leases_.emplace(granted.lease_id(), Lease{session, granted.tensor().tensor_id()}).second;
    FUZZ_CHECK(inserted) << "lease id " << granted.lease_id() << " granted twice";
    tensors_.insert(granted.tensor().tensor_id());
    if (granted.tensor().buffer().buffer_id() != 0) buffers_.insert(granted.tensor().buffer().buffer_id());
  }

  void CheckConsistency() {
    std::lock_guard<std::mutex> lock(mu_);
    v1::StatusResponse status = broker_->GetStatus();
    FUZZ_CHECK(status.leases() == leases_.size())
        << "the broker counts " << status.leases() << " leases, the model " << leases_.size();
    FUZZ_CHECK(status.sessions() == sessions_.size() + 1) << status.sessions();
    FUZZ_CHECK(status.host_bytes_in_use() <= kQuota) << status.host_bytes_in_use();

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

  // --- ops ------------------------------------------------------------------------------

  uint64_t PickSession(FuzzedDataProvider& in) { return Pick(in, OpenSessionIds()); }
  // The auditor is open too: a random id may name it.
  bool IsOpen(uint64_t session) const { return session == auditor_ || sessions_.contains(session); }

  void OpenSession(FuzzedDataProvider& in) {
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

  void CloseSession(FuzzedDataProvider& in) {
    uint64_t id = PickSession(in);
    if (id == auditor_) return;
    broker_->CloseSession(id);
    sessions_.erase(id);
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(leases_, [&](const auto& entry) { return entry.second.session == id; });
    std::erase_if(arenas_, [&](const auto& entry) { return entry.second.owner == id; });
  }

  void Allocate(uint64_t session, const v1::AllocateRequest& request) {
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

  void AllocateOp(FuzzedDataProvider& in) {
    v1::AllocateRequest request;
    request.set_ns(Namespace(in));
    *request.mutable_desc() = Desc(in);
    request.set_isolated(in.ConsumeBool());
    Tags(in, request.mutable_tags());
    Allocate(PickSession(in), request);
  }

  void Export(uint64_t session, const v1::ExportRequest& request) {
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

  // A producer's memfd staged on the fd channel, then exported.
  void StageAndExportOp(FuzzedDataProvider& in) {
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

  // What a producer does before publishing: fetch the handle and seal its memfd against writes.
  void FetchAndSealOp(FuzzedDataProvider& in) {
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

  void Publish(uint64_t session, const v1::PublishRequest& request) {
    absl::StatusOr<v1::PublishResponse> result = broker_->Publish(session, request);
    Check(result.status(), "Publish");
    if (!result.ok()) return;
    FUZZ_CHECK(result->tensor().state() == v1::TENSOR_STATE_SEALED);
    FUZZ_CHECK(result->tensor().name() == request.name());
    CheckTensorInfo(result->tensor());
  }

  void PublishOp(FuzzedDataProvider& in) {
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
    Publish(PickSession(in), request);
  }

  // Acquire and Take complete now or later (a publish, a timeout, a cancel, the session
  // closing); a granted lease enters the model when the completion runs.
  template <typename Call>
  void StartWait(uint64_t session, const char* op, Call call) {
    auto ran = std::make_shared<int>(0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++waits_started_;
    }
    uint64_t wait_id = call([this, session, op, ran](absl::StatusOr<v1::AcquireResponse> result) {
      FUZZ_CHECK(++*ran == 1) << op << " completed twice";
      Check(result.status(), op);
      if (result.ok()) {
        CheckTensorInfo(result->tensor());
        AddLease(session, *result);
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++waits_completed_;
    });
    if (wait_id != 0) waits_.insert(wait_id);
  }

  void AcquireOp(FuzzedDataProvider& in, const v1::AcquireRequest* raw) {
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

  void TakeOp(FuzzedDataProvider& in, const v1::TakeRequest* raw) {
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

  void Release(uint64_t session, const v1::ReleaseRequest& request) {
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

  void ReleaseOp(FuzzedDataProvider& in) {
    v1::ReleaseRequest request;
    std::set<uint64_t> known = KnownLeases();
    int count = in.ConsumeIntegralInRange<int>(0, 63) == 0 ? 65537 : in.ConsumeIntegralInRange<int>(0, 6);
    for (int i = 0; i < count; ++i) request.add_lease_ids(i < 8 ? Pick(in, known) : uint64_t(i));
    Release(PickSession(in), request);
  }

  void DeleteOp(FuzzedDataProvider& in, const v1::DeleteRequest* raw) {
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

  void ListOp(FuzzedDataProvider& in, const v1::ListRequest* raw) {
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

  void StatOp(FuzzedDataProvider& in, const v1::StatRequest* raw) {
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

  void WatchOp(FuzzedDataProvider& in, const v1::WatchRequest* raw) {
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

  void SinkOp(FuzzedDataProvider& in) {
    uint64_t session = PickSession(in);
    if (in.ConsumeBool()) {
      auto sink = std::make_shared<FuzzPushSink>(in.ConsumeBool());
      (void)broker_->AttachSink(session, sink);  // whether a reset is owed: not modelled
      push_sinks_.push_back(sink);
    } else if (!push_sinks_.empty()) {
      broker_->DetachSink(session, push_sinks_[in.ConsumeIntegralInRange<size_t>(0, push_sinks_.size() - 1)].get());
    }
  }

  // A request parsed from raw bytes, for the handler the next byte picks.
  void RawOp(FuzzedDataProvider& in) {
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

  void Step(FuzzedDataProvider& in) {
    int op = in.ConsumeIntegralInRange<int>(0, 16);
    if (trace_) std::fprintf(stderr, "op %d\n", op);
    switch (op) {
      case 0: OpenSession(in); break;
      case 1: CloseSession(in); break;
      case 2: case 3: AllocateOp(in); break;
      case 4: StageAndExportOp(in); break;
      case 5: FetchAndSealOp(in); break;
      case 6: case 7: PublishOp(in); break;
      case 8: AcquireOp(in, nullptr); break;
      case 9: TakeOp(in, nullptr); break;
      case 10: ReleaseOp(in); break;
      case 11: DeleteOp(in, nullptr); break;
      case 12: ListOp(in, nullptr); StatOp(in, nullptr); break;
      case 13: WatchOp(in, nullptr); break;
      case 14: broker_->CancelWait(Pick(in, waits_)); break;
      case 15: SinkOp(in); break;
      default: RawOp(in); break;
    }
  }

  void Finish() {
    for (uint64_t id : OpenSessionIds()) broker_->CloseSession(id);
    broker_->CloseSession(auditor_);
    sessions_.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      leases_.clear();
    }
    v1::StatusResponse status = broker_->GetStatus();
    FUZZ_CHECK(status.leases() == 0 && status.sessions() == 0)
        << status.leases() << " leases and " << status.sessions() << " sessions after closing all";
    FUZZ_CHECK(status.tensors() == status.named_tensors())
        << status.tensors() << " tensors, " << status.named_tensors() << " bound, none leased";
    broker_.reset();  // joins the executor and the timers: every completion has run
    FUZZ_CHECK(waits_completed_ == waits_started_)
        << waits_started_ << " acquires and takes, " << waits_completed_ << " completed";
  }

  struct Lease {
    uint64_t session;
    uint64_t tensor;
  };

  // TENSORD_FUZZ_TRACE=1: print each op and status, to read what a saved input does.
  const bool trace_ = std::getenv("TENSORD_FUZZ_TRACE") != nullptr;
  std::unique_ptr<Broker> broker_;
  uint64_t auditor_ = 0;
  std::map<uint64_t, Identity> sessions_;  // open sessions ops may use, besides the auditor
  std::mutex tokens_mu_;
  std::vector<std::string> tokens_;  // guarded by tokens_mu_
  std::set<uint64_t> tensors_, buffers_, staged_, waits_, watchers_;
  std::vector<std::shared_ptr<FuzzPushSink>> push_sinks_;

  // Completions run on the broker's threads too.
  std::mutex mu_;
  std::map<uint64_t, Lease> leases_;  // lease id -> holder and tensor
  struct Arena {
    uint64_t owner;
    std::string ns;
  };
  std::map<uint64_t, Arena> arenas_;  // arena buffers of open sessions: they live even when empty
  uint64_t waits_started_ = 0;
  uint64_t waits_completed_ = 0;
};

}  // namespace
}  // namespace tensord::server

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  // Hostile bytes make protobuf log every invalid UTF-8 string it refuses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  tensord::server::Harness harness;
  harness.Run(in);
  return 0;
}
