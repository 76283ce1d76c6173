// The broker fuzzer's harness (fuzz_broker_requests.cc says what it checks): a fresh Broker
// in-process, driven by ops decoded from the input, with a model of what must be true that
// is checked after every op. Its parts: the values ops build requests from
// (fuzz_broker_values.cc), the checks (fuzz_broker_checks.cc), the ops (fuzz_broker_ops.cc)
// and the run (fuzz_broker_requests.cc).
//
// Thread-safety: ops run on the fuzzer's thread; Acquire and Take completions run on the
// broker's threads too, so what they touch (the leases, the wait counts, the tokens) is
// under mu_ or tokens_mu_.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>
#include <sys/types.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/names.h"
#include "server/broker/broker.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::server::broker_fuzz {

namespace v1 = tensord::v1;

inline constexpr uint64_t kQuota = 1 << 20;
inline constexpr uint64_t kPage = 4096;
inline constexpr uint64_t kArenaBytes = 64 << 10;
inline constexpr int kMaxOps = 48;
inline constexpr uid_t kReaderUid = 4242;   // may read namespace "shared"
inline constexpr uid_t kWriterUid = 4243;   // may write namespace "shared"
inline constexpr gid_t kTeamGid = 5000;     // may read and write namespace "team"
inline constexpr uid_t kStrangerUid = 9999;

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
  // A fresh Broker (a small quota, small arenas and caps, ACLs on namespaces "shared" and
  // "team") and its auditor session, which reads everything and no op closes.
  Harness();

  // Runs the ops the input encodes (at most kMaxOps), checking the model after each, then
  // closes everything and checks what is left.
  void Run(FuzzedDataProvider& in);

 private:
  // --- values -------------------------------------------------------------------------

  std::string Name(FuzzedDataProvider& in);
  std::string Prefix(FuzzedDataProvider& in);
  std::string Namespace(FuzzedDataProvider& in);
  uint64_t Edgy(FuzzedDataProvider& in);

  // A known id of the kind (most of the time) or anything.
  uint64_t Pick(FuzzedDataProvider& in, const std::set<uint64_t>& known);

  std::set<uint64_t> OpenSessionIds() const;
  std::set<uint64_t> KnownLeases();
  v1::TensorDesc Desc(FuzzedDataProvider& in);
  void Tags(FuzzedDataProvider& in, google::protobuf::Map<std::string, std::string>* tags);

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

  void Check(const absl::Status& status, const char* op);
  void CheckTensorInfo(const v1::TensorInfo& info);
  void AddLease(uint64_t session, const v1::AcquireResponse& granted);
  void CheckConsistency();

  // --- ops ------------------------------------------------------------------------------

  uint64_t PickSession(FuzzedDataProvider& in) { return Pick(in, OpenSessionIds()); }
  // The auditor is open too: a random id may name it.
  bool IsOpen(uint64_t session) const { return session == auditor_ || sessions_.contains(session); }

  void OpenSession(FuzzedDataProvider& in);
  void CloseSession(FuzzedDataProvider& in);
  void Allocate(uint64_t session, const v1::AllocateRequest& request);
  void AllocateOp(FuzzedDataProvider& in);
  void Export(uint64_t session, const v1::ExportRequest& request);

  // A producer's memfd staged on the fd channel, then exported.
  void StageAndExportOp(FuzzedDataProvider& in);

  // What a producer does before publishing: fetch the handle and seal its memfd against writes.
  void FetchAndSealOp(FuzzedDataProvider& in);

  void Publish(uint64_t session, const v1::PublishRequest& request);
  void PublishOp(FuzzedDataProvider& in);
  void AcquireOp(FuzzedDataProvider& in, const v1::AcquireRequest* raw);
  void TakeOp(FuzzedDataProvider& in, const v1::TakeRequest* raw);
  void Release(uint64_t session, const v1::ReleaseRequest& request);
  void ReleaseOp(FuzzedDataProvider& in);
  void DeleteOp(FuzzedDataProvider& in, const v1::DeleteRequest* raw);
  void ListOp(FuzzedDataProvider& in, const v1::ListRequest* raw);
  void StatOp(FuzzedDataProvider& in, const v1::StatRequest* raw);
  void WatchOp(FuzzedDataProvider& in, const v1::WatchRequest* raw);
  void SinkOp(FuzzedDataProvider& in);

  // A request parsed from raw bytes, for the handler the next byte picks.
  void RawOp(FuzzedDataProvider& in);

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

  // One op, picked by the next byte.
  void Step(FuzzedDataProvider& in);

  // Closes every session and checks that nothing is left leased and every wait completed.
  void Finish();

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

}  // namespace tensord::server::broker_fuzz
