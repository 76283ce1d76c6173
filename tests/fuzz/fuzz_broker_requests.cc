// The Broker's request handlers (server/broker/broker.h), in-process, driven by a sequence of
// operations decoded from the input: each op picks a handler by a byte and builds its
// request from the following bytes (extreme integers, long and odd names, known and random
// ids, several identities), or parses the request from raw bytes. A fresh Broker serves
// each input, so a crash replays from its input alone.
//
// The harness (fuzz_broker_harness.h) keeps a model of what must be true and checks it
// after every op:
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
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <utility>

#include "google/protobuf/stubs/logging.h"
#include "server/memory/backend_registry.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_broker_harness.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::server::broker_fuzz {
namespace {

// Caps the broker may have (fields added over time): small, so the fuzzer reaches them.
template <typename Options>
void SetSmallCaps(Options& options) {
  if constexpr (requires { options.max_sessions; }) options.max_sessions = 8;
  if constexpr (requires { options.max_leases_per_session; }) options.max_leases_per_session = 24;
  if constexpr (requires { options.max_waits_per_session; }) options.max_waits_per_session = 6;
}

}  // namespace

Harness::Harness() {
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

void Harness::Run(FuzzedDataProvider& in) {
  for (int op = 0; op < kMaxOps && in.remaining_bytes() > 0; ++op) {
    Step(in);
    CheckConsistency();
  }
  Finish();
}

void Harness::Step(FuzzedDataProvider& in) {
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

void Harness::Finish() {
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

}  // namespace tensord::server::broker_fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  // Hostile bytes make protobuf log every invalid UTF-8 string it refuses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  tensord::server::broker_fuzz::Harness harness;
  harness.Run(in);
  return 0;
}
