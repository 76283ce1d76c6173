// ClientPeer: for tests that link the static client (tensord_client_core), a Client that also
// shows its current Session (through its SessionHolder), to look at a session's parts: its
// mapping cache, its gRPC connection. It adds nothing else; every call is the Client's. The
// library never uses it (client.h names it a friend for these tests). Thread-safe as Client is.
#pragma once

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "client/session.h"
#include "client/session_holder.h"
#include "tensord/client.h"

namespace tensord::internal {

class ClientPeer final : public Client {
 public:
  // As Client::Connect.
  static Result<std::shared_ptr<ClientPeer>> Create(const ClientOptions& options) {
    Result<std::shared_ptr<SessionHolder>> holder = SessionHolder::Create(options);
    if (!holder.ok()) return holder.status();
    return std::shared_ptr<ClientPeer>(new ClientPeer(std::move(holder).value()));
  }

  // The current session, connecting one if needed (SessionHolder::CurrentSession).
  absl::StatusOr<std::shared_ptr<Session>> CurrentSession() { return holder_->CurrentSession(); }

 private:
  explicit ClientPeer(std::shared_ptr<SessionHolder> holder) : Client(std::move(holder)) {}
};

}  // namespace tensord::internal
