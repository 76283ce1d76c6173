// The Broker's limit checks: what a request costs against the caps (leases and waits per
// session) and the per-uid charges of UidQuota. Who may read and write what is AccessPolicy's.
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "server/broker/broker.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

// The daemon memory a tensor's metadata takes, charged to its producer's uid.
uint64_t TensorMetadataBytes(const v1::TensorDesc& desc, std::string_view ns, std::string_view name,
                             const std::map<std::string, std::string>& tags) {
  uint64_t bytes = kTensorEntryBytes + desc.ByteSizeLong() + ns.size() + name.size();
  for (const auto& [key, value] : tags) bytes += kTagEntryBytes + key.size() + value.size();
  return bytes;
}

}  // namespace

absl::Status Broker::ChargeTensorLocked(Tensor& tensor, uint64_t host_bytes, std::string_view what) {
  const uid_t uid = tensor.producer_uid;
  const uint64_t metadata = TensorMetadataBytes(tensor.desc, tensor.ns, tensor.name, tensor.tags);
  TENSORD_RETURN_IF_ERROR(uid_quota_.Reserve(uid, UidResource::kTensors, 1, what));
  if (absl::Status status = uid_quota_.Reserve(uid, UidResource::kMetadataBytes, metadata, what); !status.ok()) {
    uid_quota_.Release(uid, UidResource::kTensors, 1);
    return status;
  }
  if (absl::Status status = uid_quota_.Reserve(uid, UidResource::kHostBytes, host_bytes, what); !status.ok()) {
    uid_quota_.Release(uid, UidResource::kMetadataBytes, metadata);
    uid_quota_.Release(uid, UidResource::kTensors, 1);
    return status;
  }
  tensor.uid_metadata_bytes = metadata;
  tensor.uid_host_bytes = host_bytes;
  return absl::OkStatus();
}

void Broker::UnchargeTensorLocked(const Tensor& tensor) {
  uid_quota_.Release(tensor.producer_uid, UidResource::kTensors, 1);
  uid_quota_.Release(tensor.producer_uid, UidResource::kMetadataBytes, tensor.uid_metadata_bytes);
  uid_quota_.Release(tensor.producer_uid, UidResource::kHostBytes, tensor.uid_host_bytes);
}

absl::Status Broker::CheckLeaseCapLocked(const Session& session) const {
  if (leases_.CountOf(session.id) >= options_.max_leases_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", session.id, " holds ", leases_.CountOf(session.id), " leases, the limit (--max-leases-per-session ",
        options_.max_leases_per_session, "): release some first"));
  }
  // A lease is kept in the daemon too; LeaseTable::Grant charges it.
  return uid_quota_.CheckRoom(session.creds.uid, UidResource::kMetadataBytes, kLeaseEntryBytes,
                              "holding one more lease");
}

absl::Status Broker::CheckWaitCapLocked(const Session& session) const {
  if (session.waits < options_.max_waits_per_session) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "session ", session.id, " has ", session.waits, " acquires and takes waiting, the limit "
      "(--max-waits-per-session ", options_.max_waits_per_session, "): cancel some or wait less"));
}

absl::Status Broker::RechargeMetadataLocked(Tensor& tensor, const v1::TensorDesc& desc, std::string_view ns,
                                            std::string_view name, const std::map<std::string, std::string>& tags) {
  const uint64_t metadata = TensorMetadataBytes(desc, ns, name, tags);
  if (metadata > tensor.uid_metadata_bytes) {
    TENSORD_RETURN_IF_ERROR(uid_quota_.Reserve(tensor.producer_uid, UidResource::kMetadataBytes,
                                               metadata - tensor.uid_metadata_bytes,
                                               absl::StrCat("publishing tensor ", tensor.id)));
  } else {
    uid_quota_.Release(tensor.producer_uid, UidResource::kMetadataBytes, tensor.uid_metadata_bytes - metadata);
  }
  tensor.uid_metadata_bytes = metadata;
  return absl::OkStatus();
}

}  // namespace tensord::server
