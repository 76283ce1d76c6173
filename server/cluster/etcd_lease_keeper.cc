#include "server/cluster/etcd_lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace tensord::server::cluster {

absl::StatusOr<std::unique_ptr<EtcdLeaseKeeper>> EtcdLeaseKeeper::Start(EtcdClient& etcd, absl::Duration ttl,
                                                                        LostCallback on_lost) {
  absl::StatusOr<EtcdLeaseGrant> grant = etcd.GrantLease(ttl);
  if (!grant.ok()) return grant.status();
  std::unique_ptr<EtcdLeaseKeeper> keeper(new EtcdLeaseKeeper(etcd, *grant, std::move(on_lost)));
  keeper->thread_ = std::thread([raw = keeper.get()] { raw->Run(); });
  return keeper;
}

EtcdLeaseKeeper::EtcdLeaseKeeper(EtcdClient& etcd, EtcdLeaseGrant grant, LostCallback on_lost)
    : etcd_(etcd), grant_(grant), on_lost_(std::move(on_lost)) {}

EtcdLeaseKeeper::~EtcdLeaseKeeper() {
  bool lost;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (call_ != nullptr) call_->TryCancel();
    lost = lost_;
  }
  thread_.join();
  if (!lost) {
    if (absl::Status revoked = etcd_.RevokeLease(grant_.id); !revoked.ok()) {
      spdlog::warn("etcd lease {:x} not revoked ({}); it expires within {}", grant_.id, std::string(revoked.message()),
                   absl::FormatDuration(grant_.ttl));
    }
  }
}

int64_t EtcdLeaseKeeper::renewals() const {
  absl::MutexLock lock(&mu_);
  return renewals_;
}

absl::StatusOr<int64_t> EtcdLeaseKeeper::KeepAliveOnce(absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    call_ = &context;
  }
  const std::shared_ptr<grpc::Channel> channel = etcd_.channel();
  auto stub = etcdserverpb::Lease::NewStub(channel);
  auto stream = stub->LeaseKeepAlive(&context);
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(grant_.id);
  etcdserverpb::LeaseKeepAliveResponse response;
  const bool answered = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  if (answered) context.TryCancel();  // the stream has done its one exchange
  grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    call_ = nullptr;
  }
  if (answered) return response.ttl();
  if (status.ok() || EtcdClient::NoAnswer(status)) etcd_.Unanswered(channel.get());
  return absl::UnavailableError(absl::StrCat(etcd_.description(), ": keep-alive of lease ", absl::Hex(grant_.id), ": ",
                                             status.ok() ? "the stream ended without an answer" : status.error_message()));
}

void EtcdLeaseKeeper::Run() {
  // etcd's own clients renew at a third of the TTL: two may fail before the lease does.
  const absl::Duration interval = std::max(grant_.ttl / 3, absl::Milliseconds(100));
  absl::Time last_renewed = absl::Now();
  absl::Status lost;
  while (true) {
    const absl::Time expires = last_renewed + grant_.ttl;
    // A member that does not answer gets a third of the TTL, so that the next member (with
    // several) still has time to renew the lease.
    const absl::Time deadline =
        std::min({expires, absl::Now() + etcd_.options().call_timeout, absl::Now() + interval});
    absl::StatusOr<int64_t> ttl = KeepAliveOnce(deadline);
    if (ttl.ok() && *ttl > 0) {
      last_renewed = absl::Now();
      absl::MutexLock lock(&mu_);
      ++renewals_;
    } else if (ttl.ok()) {
      lost = absl::NotFoundError(absl::StrCat(etcd_.description(), ": lease ", absl::Hex(grant_.id),
                                              " expired or was revoked; its keys are gone"));
      break;
    } else if (absl::Now() >= expires) {
      lost = absl::UnavailableError(absl::StrCat("no keep-alive of lease ", absl::Hex(grant_.id), " reached etcd for ",
                                                 absl::FormatDuration(grant_.ttl), ", so it has expired (",
                                                 ttl.status().message(), ")"));
      break;
    }
    // After a failure, try again soon (but not in a loop): the lease has until `expires`.
    const absl::Duration pause =
        ttl.ok() ? interval : std::min(absl::Milliseconds(250), std::max(absl::ZeroDuration(), expires - absl::Now()));
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), pause)) return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    lost_ = true;
  }
  spdlog::warn("{}", std::string(lost.message()));
  std::move(on_lost_)(std::move(lost));
}

}  // namespace tensord::server::cluster
