// EtcdWatch: every change under a key prefix, from a revision on, delivered in revision
// order to a callback on a thread of its own: how one node learns of names that other nodes
// bind and unbind, and of names that leave with a dead node's lease (each expired key is a
// delete event).
//
// A broken stream (etcd restarting, unreachable for a while) is resumed from the revision
// after the last one delivered, so no change is lost or delivered twice; with several etcd
// members, on the next one where its member stopped answering. A start revision
// that etcd has compacted away cannot be resumed: on_error then gets OUT_OF_RANGE, once, and
// the watch stops; its owner re-reads the prefix (GetPrefix) and watches from that read's
// revision plus one.
//
// Callbacks run on the watch's thread, one at a time, and must not destroy the watch. The
// destructor cancels the stream and joins the thread; no callback runs after it returns.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/cluster/etcd_client.h"

namespace tensord::server::cluster {

struct EtcdEvent {
  enum class Kind { kPut, kDelete };
  Kind kind = Kind::kPut;
  // For a delete: the key, and mod_revision the revision of the deletion.
  EtcdKeyValue kv;
  // The key as it was before the change, where etcd still had it (a delete's value).
  std::optional<EtcdKeyValue> prev;
};

class EtcdWatch {
 public:
  // events: the changes of one revision or more, in order.
  using EventsCallback = absl::AnyInvocable<void(std::vector<EtcdEvent> events)>;
  using ErrorCallback = absl::AnyInvocable<void(absl::Status) &&>;

  // start_revision 0: changes from now on.
  static std::unique_ptr<EtcdWatch> Start(EtcdClient& etcd, std::string prefix, int64_t start_revision,
                                          EventsCallback on_events, ErrorCallback on_error);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // How many times the stream was opened again after breaking.
  int64_t resumptions() const;

 private:
  EtcdWatch(EtcdClient& etcd, std::string prefix, int64_t start_revision, EventsCallback on_events,
            ErrorCallback on_error);
  void Run();
  // One stream, until it breaks (OK: resume), or an error ends the watch, or it is stopped.
  absl::Status Follow();

  EtcdClient& etcd_;
  const std::string prefix_;
  // The first revision not delivered yet (0: now).
  int64_t next_revision_;
  EventsCallback on_events_;
  ErrorCallback on_error_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t resumptions_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace tensord::server::cluster
