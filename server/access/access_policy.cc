#include "server/access/access_policy.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace tensord::server {

namespace {

bool Contains(const std::vector<uint32_t>& ids, uint32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

AccessPolicy::AccessPolicy(std::map<std::string, NamespaceAcl> acls, uid_t daemon_uid)
    : acls_(std::make_move_iterator(acls.begin()), std::make_move_iterator(acls.end())),
      daemon_uid_(daemon_uid) {}

bool AccessPolicy::Trusted(const common::PeerCredentials& creds) const {
  return creds.uid == 0 || creds.uid == daemon_uid_;
}

bool AccessPolicy::MayRead(const common::PeerCredentials& creds, std::string_view ns) const {
  if (Trusted(creds)) return true;
  auto it = acls_.find(ns);
  if (it == acls_.end()) return false;
  return Contains(it->second.read_uids, creds.uid) || Contains(it->second.read_gids, creds.gid) ||
         Contains(it->second.write_uids, creds.uid) || Contains(it->second.write_gids, creds.gid);
}

bool AccessPolicy::MayReadIn(const common::PeerCredentials& creds, std::string_view ns, uid_t producer_uid) const {
  if (!ns.empty()) return MayRead(creds, ns);
  return creds.uid == producer_uid || MayRead(creds, "");
}

uint64_t AccessPolicy::UidHostBytes(std::string_view ns, uint64_t size) const {
  return acls_.contains(ns) ? 0 : size;
}

absl::Status AccessPolicy::CheckAccess(const common::PeerCredentials& creds, std::string_view ns,
                                       bool write) const {
  if (Trusted(creds)) return absl::OkStatus();
  auto it = acls_.find(ns);
  bool allowed = false;
  if (it != acls_.end()) {
    const NamespaceAcl& acl = it->second;
    allowed = write ? (Contains(acl.write_uids, creds.uid) || Contains(acl.write_gids, creds.gid))
                    : MayRead(creds, ns);
  }
  if (allowed) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("uid ", creds.uid, " (gid ", creds.gid,
                                                  ") may not ", write ? "write" : "read",
                                                  " namespace ", common::QuoteForError(ns)));
}

}  // namespace tensord::server
