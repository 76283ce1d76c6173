#include "server/state/session_manager.h"

#include <chrono>

#include "common/status.h"
#include "server/runtime/random_token.h"

namespace tensord::server {

absl::StatusOr<std::string> NewSessionToken() { return NewRandomToken(16, "a session token"); }

absl::StatusOr<Session*> SessionManager::Open(const common::PeerCredentials& creds,
                                              std::string client_name) {
  absl::StatusOr<std::string> token = NewSessionToken();
  if (!token.ok()) return token.status();
  uint64_t id = ++last_id_;
  Session session;
  session.id = id;
  session.token = *token;
  session.creds = creds;
  session.client_name = std::move(client_name);
  session.opened_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  by_token_.emplace(*token, id);
  return &sessions_.emplace(id, std::move(session)).first->second;
}

Session* SessionManager::Find(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : &it->second;
}

Session* SessionManager::FindByToken(std::string_view token) {
  auto it = by_token_.find(common::AbslView(token));
  return it == by_token_.end() ? nullptr : Find(it->second);
}

std::optional<Session> SessionManager::Close(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return std::nullopt;
  Session session = std::move(it->second);
  sessions_.erase(it);
  by_token_.erase(session.token);
  return session;
}

}  // namespace tensord::server
