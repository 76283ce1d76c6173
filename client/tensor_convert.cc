#include "client/tensor_convert.h"

#include "common/memory/backends.h"
#include "common/memory/device_names.h"

#include <algorithm>
#include <string>

#include "common/status.h"

namespace tensord::internal {

TensorState ToPublicState(tensord::v1::TensorState state) {
  switch (state) {
    case tensord::v1::TENSOR_STATE_SEALED: return TensorState::kSealed;
    case tensord::v1::TENSOR_STATE_RETIRED: return TensorState::kRetired;
    default: return TensorState::kCreating;
  }
}

const char* TensorStateName(TensorState state) {
  switch (state) {
    case TensorState::kCreating: return "creating";
    case TensorState::kSealed: return "sealed";
    case TensorState::kRetired: return "retired";
  }
  return "unknown";
}

TensorInfo ToPublicInfo(const tensord::v1::TensorInfo& proto, const common::TensorLayout& layout) {
  TensorInfo info;
  info.tensor_id = proto.tensor_id();
  info.name = proto.name();
  info.generation = proto.generation();
  info.dtype = ToDLDataType(proto.desc().dtype());
  info.shape.assign(proto.desc().shape().begin(), proto.desc().shape().end());
  info.strides = layout.strides;
  info.byte_offset = proto.desc().byte_offset();
  info.device = ToDLDevice(proto.desc().device());
  info.state = ToPublicState(proto.state());
  info.tags = std::map<std::string, std::string>(proto.tags().begin(), proto.tags().end());
  info.created_unix_ms = proto.created_unix_ms();
  info.lease_count = proto.lease_count();
  info.nbytes = layout.nbytes;
  info.buffer_id = proto.buffer().buffer_id();
  info.buffer_size = proto.buffer().size();
  info.buffer_offset = proto.buffer().offset();
  info.arena = proto.buffer().arena();
  info.recyclable = proto.buffer().recyclable();
  return info;
}

absl::StatusOr<ValidatedTensor> ValidateTensorInfo(const tensord::v1::TensorInfo& proto,
                                                   std::string_view what) {
  absl::StatusOr<common::TensorLayout> layout = common::ValidateDesc(proto.desc());
  if (!layout.ok()) {
    return absl::DataLossError(std::string(what) + ": the broker sent an invalid description: " +
                               std::string(layout.status().message()));
  }
  // 0 is tolerated as "not filled in"; any other disagreement is the broker's bug.
  if (proto.nbytes() != 0 && proto.nbytes() != layout->nbytes) {
    return absl::DataLossError(std::string(what) + ": the broker says " +
                               std::to_string(proto.nbytes()) + " bytes but the description has " +
                               std::to_string(layout->nbytes));
  }
  if (layout->nbytes == 0) {
    // Zero-byte tensors have no buffer; nothing is mapped, so nothing else to check.
    if (proto.buffer().buffer_id() != 0) {
      return absl::DataLossError(std::string(what) + ": a zero-byte tensor with buffer " +
                                 std::to_string(proto.buffer().buffer_id()));
    }
  } else {
    if (proto.buffer().buffer_id() == 0) {
      return absl::DataLossError(std::string(what) + ": tensor of " +
                                 std::to_string(layout->nbytes) + " bytes has no buffer");
    }
    absl::Status fits = common::ValidateFitsBuffer(*layout, proto.buffer(), what);
    if (!fits.ok()) {
      return absl::DataLossError(std::string(what) + ": the broker sent a tensor outside its " +
                                 "buffer: " + std::string(fits.message()));
    }
  }
  ValidatedTensor out;
  out.info = ToPublicInfo(proto, *layout);
  out.buffer_offset = proto.buffer().offset();
  out.layout = *std::move(layout);
  return out;
}

absl::StatusOr<tensord::v1::TensorDesc> SpecToDesc(const TensorSpec& spec) {
  tensord::v1::TensorDesc desc;
  TENSORD_ASSIGN_OR_RETURN(*desc.mutable_dtype(), FromDLDataType(spec.dtype));
  TENSORD_ASSIGN_OR_RETURN(*desc.mutable_device(), FromDLDevice(spec.device));
  // Our ordinal means nothing to the broker or other processes: a GPU goes by its UUID.
  TENSORD_RETURN_IF_ERROR(common::ProcessImporters().NameDevice(*desc.mutable_device()));
  for (int64_t d : spec.shape) desc.add_shape(d);
  for (int64_t s : spec.strides) desc.add_strides(s);
  TENSORD_RETURN_IF_ERROR(common::ValidateDesc(desc).status());
  return desc;
}

LeaseHolder ToPublicHolder(const tensord::v1::LeaseHolder& holder) {
  LeaseHolder out;
  out.session_id = holder.session_id();
  out.pid = holder.pid();
  out.uid = holder.uid();
  out.gid = holder.gid();
  out.leases = holder.leases();
  out.producer = holder.producer();
  return out;
}

BrokerStatus ToPublicStatus(const tensord::v1::StatusResponse& status) {
  BrokerStatus out;
  out.version = status.version();
  out.pid = status.pid();
  out.uid = status.uid();
  out.uptime_ms = status.uptime_ms();
  out.host_bytes_in_use = status.host_bytes_in_use();
  out.host_bytes_limit = status.host_bytes_limit();
  out.tensors = status.tensors();
  out.named_tensors = status.named_tensors();
  out.buffers = status.buffers();
  out.leases = status.leases();
  out.sessions = status.sessions();
  out.socket = status.socket();
  out.releases_not_found = status.releases_not_found();
  out.host_bytes_pooled = status.host_bytes_pooled();
  out.pooled_buffers = status.pooled_buffers();
  out.hand_overs_pending = status.hand_overs_pending();
  out.leases_reclaimed = status.leases_reclaimed();
  for (const tensord::v1::SessionUsage& usage : status.session_usage()) {
    SessionUsage session;
    session.id = usage.id();
    session.pid = usage.pid();
    session.uid = usage.uid();
    session.gid = usage.gid();
    session.client_name = usage.client_name();
    session.opened_unix_ms = usage.opened_unix_ms();
    session.leases = usage.leases();
    session.bytes_leased = usage.bytes_leased();
    session.tensors_produced = usage.tensors_produced();
    session.bytes_produced = usage.bytes_produced();
    session.leases_granted = usage.leases_granted();
    session.publishes = usage.publishes();
    session.waiting = usage.waiting();
    out.session_usage.push_back(std::move(session));
  }
  std::sort(out.session_usage.begin(), out.session_usage.end(),
            [](const SessionUsage& a, const SessionUsage& b) { return a.id < b.id; });
  for (const tensord::v1::HandOverUsage& usage : status.hand_over_usage()) {
    out.hand_over_pins.push_back(
        HandOverPins{usage.uid(), usage.hand_overs(), usage.host_bytes(), usage.device_bytes()});
  }
  std::sort(out.hand_over_pins.begin(), out.hand_over_pins.end(),
            [](const HandOverPins& a, const HandOverPins& b) { return a.uid < b.uid; });
  if (status.has_cluster()) {
    const tensord::v1::ClusterStatus& c = status.cluster();
    out.cluster = ClusterStatus{.node = c.node(),
                                .listen = c.listen(),
                                .namespaces = {c.namespaces().begin(), c.namespaces().end()},
                                .etcd_endpoint = c.etcd_endpoint(),
                                .joined = c.joined(),
                                .names_recorded = c.names_recorded(),
                                .replicas = c.replicas(),
                                .pulls = c.pulls(),
                                .bytes_pulled = c.bytes_pulled(),
                                .pulls_failed = c.pulls_failed(),
                                .reads_open = c.reads_open(),
                                .reads_served = c.reads_served(),
                                .bytes_served = c.bytes_served(),
                                .device_copies = c.device_copies()};
  }
  for (const tensord::v1::QueueStatus& queue : status.queues()) {
    out.queues.push_back(QueueStatus{queue.prefix(), queue.depth(), queue.slots_held(), queue.published(),
                                     queue.producers_waiting(), queue.takers_waiting()});
  }
  std::sort(out.queues.begin(), out.queues.end(),
            [](const QueueStatus& a, const QueueStatus& b) { return a.prefix < b.prefix; });
  for (const tensord::v1::BackendStatus& backend : status.backends()) {
    BackendInfo info;
    info.name = backend.name();
    info.built = backend.built();
    info.unavailable_reason = backend.unavailable_reason();
    for (const tensord::v1::DeviceUsage& usage : backend.devices()) {
      DeviceUsage device;
      device.device = ToDLDevice(usage.device());
      device.uuid = usage.device().uuid().empty()
                        ? std::string()
                        : common::FormatDeviceUuid(usage.device().type(), usage.device().uuid());
      device.key = common::DeviceKey(usage.device());
      device.name = usage.name();
      device.total_bytes = usage.total_bytes();
      device.bytes_in_use = usage.bytes_in_use();
      device.bytes_limit = usage.bytes_limit();
      device.bytes_pooled = usage.bytes_pooled();
      info.devices.push_back(std::move(device));
    }
    out.backends.push_back(std::move(info));
  }
  return out;
}

}  // namespace tensord::internal
