// WatcherSet: the open Watch streams, each a prefix and the credentials of the session that
// opened it, and which of them an event about a name goes to.
//
// It owns the watchers (and through them a reference to each sink); ids are never reused
// within a broker instance. An event goes to every watcher whose prefix holds the event's
// name and whose credentials may read the name's namespace (AccessPolicy). What a watcher
// was charged to its uid (metadata_bytes) is recorded here but charged and given back by
// the Broker, which also caps how many watchers there are.
// Not thread-safe: the Broker guards it with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd_channel.h"
#include "server/access/access_policy.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

// Where a Watch stream's events go. Push never blocks; false means the event was dropped
// (the watcher then gets a RESET event once it catches up).
class WatchSink {
 public:
  virtual ~WatchSink() = default;
  virtual bool Push(const tensord::v1::WatchEvent& event) = 0;
  // The broker is stopping: end the stream.
  virtual void Close() = 0;
};

struct Watcher {
  uint64_t session_id = 0;
  std::string prefix;
  common::PeerCredentials creds;
  std::shared_ptr<WatchSink> sink;
  uint64_t metadata_bytes = 0;  // charged to creds.uid
  // The current bindings under `prefix` are being sent (WatchRequest.initial), a page at a
  // time in name order; `initial_sent_through` is the last name sent ("": none yet). An
  // event about a later name is not sent meanwhile: that name's initial event, read when
  // its page is, shows it.
  bool initial_pending = false;
  std::string initial_sent_through = {};
};

class WatcherSet {
 public:
  // Returns the new watcher's id.
  uint64_t Add(Watcher watcher);
  // The removed watcher, or nullopt when there is none with that id.
  std::optional<Watcher> Remove(uint64_t watcher_id);
  // Null when there is none with that id.
  Watcher* Find(uint64_t watcher_id);
  // Removes and returns the watchers `session_id` opened (its session closed).
  std::vector<Watcher> RemoveSession(uint64_t session_id);
  // Removes and returns every watcher (the broker is stopping).
  std::vector<Watcher> RemoveAll();

  // The sinks `event` goes to, in the order the watchers were added (a watcher whose initial
  // bindings have not reached the event's name yet is left out).
  std::vector<std::shared_ptr<WatchSink>> SinksFor(const tensord::v1::WatchEvent& event,
                                                   const AccessPolicy& access) const;

  // Whether a watcher of a session other than `except_session` watches `name` (may read it).
  bool Watches(const std::string& name, uint64_t except_session, const AccessPolicy& access) const;

  size_t size() const { return watchers_.size(); }
  bool empty() const { return watchers_.empty(); }

 private:
  uint64_t last_id_ = 0;
  std::map<uint64_t, Watcher> watchers_;  // by id
};

}  // namespace tensord::server
