// StatusSupplements: the parts of a Status answer (and so of the metrics) that layers above
// the broker fill in: the cluster's section, where the daemon is a node of one. The broker
// knows nothing of them; the transport and the metrics endpoint add them to what the broker
// answers.
//
// Set() and Clear() may run while status calls do: Clear() waits for a fill in progress,
// so the part that filled may go once it returns. A fill runs on the caller's thread (the
// RPC server's, the metrics endpoint's) and must not block for long.
#pragma once

#include <mutex>

#include "absl/functional/any_invocable.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

class StatusSupplements {
 public:
  using Fill = absl::AnyInvocable<void(tensord::v1::StatusResponse&)>;

  void Set(Fill fill) {
    std::lock_guard lock(mu_);
    fill_ = std::move(fill);
  }
  void Clear() { Set(nullptr); }
  // Adds the supplements to an answer of Broker::GetStatus.
  void FillIn(tensord::v1::StatusResponse& status) {
    std::lock_guard lock(mu_);
    if (fill_) fill_(status);
  }

 private:
  std::mutex mu_;
  Fill fill_;
};

}  // namespace tensord::server
