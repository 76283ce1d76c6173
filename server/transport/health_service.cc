#include "server/transport/health_service.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.pb.h"
#include "server/transport/grpc_status.h"
#include "server/transport/wire_messages.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";
constexpr char kWatchMethod[] = "/grpc.health.v1.Health/Watch";

class HealthCheck final : public UnaryServerCall {
 public:
  explicit HealthCheck(const HealthService* service) : service_(service) {}

 private:
  void OnRequest(const grpc::ByteBuffer& bytes) override {
    HealthCheckRequest request;
    if (absl::Status parsed = ParseRequest(bytes, &request); !parsed.ok()) return Respond(ToGrpcStatus(parsed));
    HealthCheckResponse response;
    response.set_status(static_cast<HealthCheckResponse::ServingStatus>(service_->StatusOf(request.service())));
    if (response.status() == HealthCheckResponse::SERVICE_UNKNOWN) {
      return Respond(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                  absl::StrCat("tensord serves no service named '", request.service(), "'")));
    }
    grpc::ByteBuffer reply;
    if (absl::Status serialized = SerializeResponse(response, &reply); !serialized.ok()) {
      return Respond(ToGrpcStatus(serialized));
    }
    Respond(reply);
  }

  const HealthService* const service_;
};

}  // namespace

// One Watch call: writes the status whenever it differs from the last one written, one
// write at a time, and finishes once told to end and everything is written.
class HealthWatch final : public SingleRequestCall {
 public:
  explicit HealthWatch(HealthService* service) : service_(service) {}

  const std::string& service_name() const { return service_name_; }

  // The status changed (`end`: and the stream should end after saying so).
  void Update(int status, bool end) {
    absl::MutexLock lock(&mu_);
    wanted_ = status;
    ending_ = ending_ || end;
    Pump();
  }

 private:
  void OnRequest(const grpc::ByteBuffer& bytes) override {
    HealthCheckRequest request;
    if (absl::Status parsed = ParseRequest(bytes, &request); !parsed.ok()) return Finish(ToGrpcStatus(parsed));
    service_name_ = request.service();
    registered_ = service_->AddWatcher(this);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      ending_ = true;
      final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
      wanted_ = written_;
    }
    Pump();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    ending_ = true;
    final_status_ = grpc::Status::CANCELLED;
    wanted_ = written_;
    Pump();
  }

  void OnDone() override {
    if (registered_) service_->RemoveWatcher(this);
  }

  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (wanted_ != written_) {
      HealthCheckResponse response;
      response.set_status(static_cast<HealthCheckResponse::ServingStatus>(wanted_));
      if (absl::Status serialized = SerializeResponse(response, &reply_); !serialized.ok()) {
        spdlog::error("health watch: {}", serialized.ToString());
        written_ = wanted_;
      } else {
        written_ = wanted_;
        writing_ = true;
        StartWrite(&reply_);
        return;
      }
    }
    if (ending_) {
      finished_ = true;
      Finish(final_status_);
    }
  }

  HealthService* const service_;
  std::string service_name_;  // set before the watch is registered, never after
  bool registered_ = false;   // polling thread only

  absl::Mutex mu_;
  grpc::ByteBuffer reply_ ABSL_GUARDED_BY(mu_);
  int wanted_ ABSL_GUARDED_BY(mu_) = -1;
  int written_ ABSL_GUARDED_BY(mu_) = -1;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

void HealthService::Register(AsyncServer* server) {
  server->Handle(kCheckMethod, [this](const grpc::GenericServerContext&) { return std::make_unique<HealthCheck>(this); });
  server->Handle(kWatchMethod, [this](const grpc::GenericServerContext&) { return std::make_unique<HealthWatch>(this); });
}

int HealthService::StatusOf(const std::string& service) const {
  absl::MutexLock lock(&mu_);
  return StatusLocked(service);
}

int HealthService::StatusLocked(const std::string& service) const {
  if (!service.empty() && std::find(services_.begin(), services_.end(), service) == services_.end()) {
    return HealthCheckResponse::SERVICE_UNKNOWN;
  }
  return serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthService::SetNotServing() {
  absl::MutexLock lock(&mu_);
  serving_ = false;
  for (HealthWatch* watch : watchers_) watch->Update(StatusLocked(watch->service_name()), /*end=*/true);
}

bool HealthService::AddWatcher(HealthWatch* watch) {
  // The first status is sent under the lock, so it cannot overtake SetNotServing's.
  absl::MutexLock lock(&mu_);
  watch->Update(StatusLocked(watch->service_name()), /*end=*/!serving_);
  if (!serving_) return false;
  watchers_.insert(watch);
  return true;
}

void HealthService::RemoveWatcher(HealthWatch* watch) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watch);
}

}  // namespace tensord::server
