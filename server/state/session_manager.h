// SessionManager: the liveness units. A session is opened when a client says HELLO on the
// fd channel and closed when that connection closes; its token (128 bits from getrandom,
// hex) authenticates the client's gRPC calls. Not thread-safe: the Broker guards it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

// Defaults of the per-session caps (--max-sessions, --max-leases-per-session, --max-waits-per-session).
inline constexpr uint64_t kDefaultMaxSessions = 4096;
inline constexpr uint64_t kDefaultMaxLeasesPerSession = uint64_t{1} << 20;
inline constexpr uint64_t kDefaultMaxWaitsPerSession = 1024;

// Where the broker pushes binding changes for a session: its Session stream, when one is
// attached. Push never blocks; it answers false when the message was dropped because the
// client is not reading (the stream then owes the client a cache reset).
class PushSink {
 public:
  virtual ~PushSink() = default;
  virtual bool Push(const tensord::v1::SessionResponse& message) = 0;
  // The broker is stopping: finish the stream once what is queued is written.
  virtual void Close() = 0;
};

struct Session {
  uint64_t id = 0;
  std::string token;
  common::PeerCredentials creds;
  std::string client_name;
  int64_t opened_unix_ms = 0;
  absl::flat_hash_map<uint64_t, common::UniqueFd> staged_fds;
  uint64_t last_staged_id = 0;
  size_t waits = 0;  // pending acquires and takes
  // Arena buffers this session allocates small tensors from, by namespace.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> arenas;
  // Buffers this session exported whose memory only its process keeps alive
  // (BackendBuffer::OwnedByProducer): their tensors retire when it closes, and it is
  // pushed ExportReleased when the broker frees one.
  absl::flat_hash_set<uint64_t> producer_owned_buffers;
  // Tensors that carry this session's ready fence: cleared when it closes, since the
  // fence's event lives in the producer's process.
  absl::flat_hash_set<uint64_t> ready_fenced_tensors;
  // Tensors it published with unbind_on_exit that are still bound: unbound when it closes.
  absl::flat_hash_set<uint64_t> unbound_on_exit;
  std::shared_ptr<PushSink> sink;
  bool reset_pending = false;  // a push was dropped: send cache_reset when possible
  // Since it opened, for tensorctl top's rates (leases_granted: kept by LeaseTable).
  uint64_t leases_granted = 0;
  uint64_t publishes = 0;
};

class SessionManager {
 public:
  absl::StatusOr<Session*> Open(const common::PeerCredentials& creds, std::string client_name);
  Session* Find(uint64_t session_id);
  Session* FindByToken(std::string_view token);
  // Removes the session and hands it back so the caller can release what it held.
  std::optional<Session> Close(uint64_t session_id);
  size_t size() const { return sessions_.size(); }
  const absl::flat_hash_map<uint64_t, Session>& sessions() const { return sessions_; }

 private:
  uint64_t last_id_ = 0;
  absl::flat_hash_map<uint64_t, Session> sessions_;
  absl::flat_hash_map<std::string, uint64_t> by_token_;
};

// 128 random bits from getrandom(2), as 32 hex digits.
absl::StatusOr<std::string> NewSessionToken();

}  // namespace tensord::server
