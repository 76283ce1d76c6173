#include "server/cluster/etcd_watch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace tensord::server::cluster {
namespace {

EtcdEvent FromProto(const mvccpb::Event& event) {
  return EtcdEvent{.kind = event.type() == mvccpb::Event::DELETE ? EtcdEvent::Kind::kDelete : EtcdEvent::Kind::kPut,
                   .kv = ToEtcdKeyValue(event.kv()),
                   .prev = event.has_prev_kv() ? std::optional<EtcdKeyValue>(ToEtcdKeyValue(event.prev_kv()))
                                               : std::nullopt};
}

// Between attempts to open a broken stream again.
constexpr absl::Duration kRetryPause = absl::Milliseconds(250);

}  // namespace

std::unique_ptr<EtcdWatch> EtcdWatch::Start(EtcdClient& etcd, std::string prefix, int64_t start_revision,
                                            EventsCallback on_events, ErrorCallback on_error) {
  std::unique_ptr<EtcdWatch> watch(
      new EtcdWatch(etcd, std::move(prefix), start_revision, std::move(on_events), std::move(on_error)));
  watch->thread_ = std::thread([raw = watch.get()] { raw->Run(); });
  return watch;
}

EtcdWatch::EtcdWatch(EtcdClient& etcd, std::string prefix, int64_t start_revision, EventsCallback on_events,
                     ErrorCallback on_error)
    : etcd_(etcd),
      prefix_(std::move(prefix)),
      next_revision_(start_revision),
      on_events_(std::move(on_events)),
      on_error_(std::move(on_error)) {}

EtcdWatch::~EtcdWatch() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (stream_ != nullptr) stream_->TryCancel();
  }
  thread_.join();
}

int64_t EtcdWatch::resumptions() const {
  absl::MutexLock lock(&mu_);
  return resumptions_;
}

absl::Status EtcdWatch::Follow() {
  grpc::ClientContext context;
  // A member cut off from the rest of etcd's cluster ends the watch ("no leader") instead
  // of keeping it open with no events (etcd's require-leader rule).
  context.AddMetadata("hasleader", "true");
  // With one endpoint, an etcd that is down is waited for, not failed at once (Stop cancels
  // the wait); with several, the stream fails and opens again on the next member.
  context.set_wait_for_ready(etcd_.options().endpoints.size() == 1);
  const std::shared_ptr<grpc::Channel> channel = etcd_.channel();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    stream_ = &context;
  }
  auto stub = etcdserverpb::Watch::NewStub(channel);
  auto stream = stub->Watch(&context);
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(prefix_);
  create->set_range_end(PrefixRangeEnd(prefix_));
  create->set_start_revision(next_revision_);
  create->set_prev_kv(true);
  absl::Status ended = absl::OkStatus();
  if (stream->Write(request)) {
    etcdserverpb::WatchResponse response;
    while (stream->Read(&response)) {
      if (response.compact_revision() > 0) {
        ended = absl::OutOfRangeError(absl::StrCat(
            etcd_.description(), ": watch of '", prefix_, "' from revision ", next_revision_,
            ": etcd has compacted its history up to revision ", response.compact_revision(),
            "; read the prefix again and watch from there"));
        break;
      }
      if (response.created() && next_revision_ == 0) {
        // Watching from "now": pin "now", so a resumed stream starts where this one did.
        next_revision_ = response.header().revision() + 1;
      }
      if (response.canceled()) {  // opened again after a pause
        spdlog::warn("{}: etcd cancelled the watch of '{}': {}", etcd_.description(), prefix_,
                     response.cancel_reason().empty() ? "no reason given" : response.cancel_reason());
        break;
      }
      if (response.events_size() == 0) continue;
      std::vector<EtcdEvent> events;
      events.reserve(response.events_size());
      for (const mvccpb::Event& event : response.events()) events.push_back(FromProto(event));
      next_revision_ = events.back().kv.mod_revision + 1;
      on_events_(std::move(events));
    }
  }
  context.TryCancel();
  grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }
  if (!ended.ok()) return ended;
  if (EtcdClient::NoAnswer(status)) etcd_.Unanswered(channel.get());
  spdlog::debug("{}: watch of '{}' broke ({}); resuming at revision {}", etcd_.description(), prefix_,
                status.error_message(), next_revision_);
  return absl::OkStatus();
}

void EtcdWatch::Run() {
  while (true) {
    absl::Status ended = Follow();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (ended.ok()) {
        ++resumptions_;
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), kRetryPause)) return;
        continue;
      }
    }
    spdlog::warn("{}", std::string(ended.message()));
    std::move(on_error_)(std::move(ended));
    return;
  }
}

}  // namespace tensord::server::cluster
