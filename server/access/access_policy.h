// AccessPolicy: who may read and write which namespace, decided from the namespace ACLs
// (--acl) and the peer's kernel credentials, never from a field in a request.
//
// Root and the daemon's own uid may do anything. Anyone else may read a namespace whose
// ACL names their uid or gid for reading or writing, and write one whose ACL names them
// for writing; a namespace with no ACL (the unnamed one included) grants them nothing. A
// tensor with no namespace yet (allocated unnamed, not published) may be read by its
// producer's uid as well. Host bytes of buffers in a namespace an ACL names are the
// namespace's, not the producer's (UidHostBytes).
//
// Errors: PERMISSION_DENIED naming the uid, gid, the access and the namespace.
// Constant after construction, so thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/fd_channel.h"

namespace tensord::server {

// Who may read and write one namespace. Empty lists grant nothing; the daemon's own uid and
// root always have access.
struct NamespaceAcl {
  std::vector<uid_t> read_uids, write_uids;
  std::vector<gid_t> read_gids, write_gids;
};

class AccessPolicy {
 public:
  AccessPolicy(std::map<std::string, NamespaceAcl> acls, uid_t daemon_uid);

  // OK when `creds` may read (or, with `write`, write) namespace `ns`.
  absl::Status CheckAccess(const common::PeerCredentials& creds, std::string_view ns, bool write) const;
  bool MayRead(const common::PeerCredentials& creds, std::string_view ns) const;
  // Whether a tensor in `ns` made by `producer_uid` may be read with `creds`: by its
  // namespace's ACL, or, with no namespace yet (unpublished), by its producer's uid only.
  bool MayReadIn(const common::PeerCredentials& creds, std::string_view ns, uid_t producer_uid) const;
  // Host bytes of a dedicated buffer of `size` in `ns` that count against the producer's
  // per-uid quota: all of them outside every namespace an ACL names, none inside one.
  uint64_t UidHostBytes(std::string_view ns, uint64_t size) const;

 private:
  bool Trusted(const common::PeerCredentials& creds) const;

  const std::map<std::string, NamespaceAcl, std::less<>> acls_;
  const uid_t daemon_uid_;
};

}  // namespace tensord::server
