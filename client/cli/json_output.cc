#include "client/cli/json_output.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "client/cli/text_output.h"

namespace tensord::cli {
namespace {

// A value exactly as "%.3f" gives it, which is what tensorctl's JSON always held (times to
// the millisecond, rates): rounded here, whatever digits the JSON writer prints.
double ThreeDecimals(double value) {
  char text[512];  // the longest finite double printed with %.3f is about 315 characters
  std::snprintf(text, sizeof text, "%.3f", value);
  return std::strtod(text, nullptr);
}

// Milliseconds as seconds, as Python's dicts give times ("created", "uptime", "opened").
double Seconds(int64_t ms) { return ThreeDecimals(static_cast<double>(ms) / 1000.0); }

Json HolderJson(const LeaseHolder& h) {
  Json out = Json::object();
  out["session_id"] = h.session_id;
  out["pid"] = h.pid;
  out["uid"] = h.uid;
  out["gid"] = h.gid;
  out["leases"] = h.leases;
  out["producer"] = h.producer;
  return out;
}

Json HandOverPinsJson(const HandOverPins& p) {
  Json out = Json::object();
  out["uid"] = p.uid;
  out["hand_overs"] = p.hand_overs;
  out["host_bytes"] = p.host_bytes;
  out["device_bytes"] = p.device_bytes;
  return out;
}

}  // namespace

Json QueueJson(const QueueStatus& q) {
  Json out = Json::object();
  out["prefix"] = q.prefix;
  out["depth"] = q.depth;
  out["slots_held"] = q.slots_held;
  out["published"] = q.published;
  out["producers_waiting"] = q.producers_waiting;
  out["takers_waiting"] = q.takers_waiting;
  return out;
}

namespace {

Json DeviceUsageJson(const DeviceUsage& d) {
  Json out = Json::object();
  out["device_type"] = d.device.device_type;
  out["device_id"] = d.device.device_id;
  out["uuid"] = d.uuid;
  out["key"] = d.key;
  out["name"] = d.name;
  out["total_bytes"] = d.total_bytes;
  out["bytes_in_use"] = d.bytes_in_use;
  out["bytes_limit"] = d.bytes_limit;
  out["bytes_pooled"] = d.bytes_pooled;
  return out;
}

Json BackendJson(const BackendInfo& b) {
  Json out = Json::object();
  out["name"] = b.name;
  out["built"] = b.built;
  out["available"] = b.built && b.unavailable_reason.empty();
  out["unavailable_reason"] = b.unavailable_reason;
  Json devices = Json::array();
  for (const DeviceUsage& d : b.devices) devices.push_back(DeviceUsageJson(d));
  out["devices"] = std::move(devices);
  return out;
}

Json SessionJson(const SessionUsage& u, const RateMap* rates) {
  Json out = Json::object();
  out["id"] = u.id;
  out["pid"] = u.pid;
  out["uid"] = u.uid;
  out["gid"] = u.gid;
  out["client_name"] = u.client_name;
  out["opened"] = Seconds(u.opened_unix_ms);
  out["leases"] = u.leases;
  out["bytes_leased"] = u.bytes_leased;
  out["tensors_produced"] = u.tensors_produced;
  out["bytes_produced"] = u.bytes_produced;
  out["leases_granted"] = u.leases_granted;
  out["publishes"] = u.publishes;
  out["waiting"] = u.waiting;
  if (rates != nullptr) {
    auto it = rates->find(u.id);
    const SessionRates r = it == rates->end() ? SessionRates{} : it->second;
    out["leases_per_s"] = ThreeDecimals(r.leases_per_s);
    out["publishes_per_s"] = ThreeDecimals(r.publishes_per_s);
  }
  return out;
}

}  // namespace

Json InfoJson(const TensorInfo& t) {
  Json out = Json::object();
  out["tensor_id"] = t.tensor_id;
  out["name"] = t.name;
  out["generation"] = t.generation;
  out["dtype"] = DTypeText(t.dtype);
  out["shape"] = Json(t.shape);
  out["strides"] = Json(t.strides);
  out["byte_offset"] = t.byte_offset;
  out["device"] = Json::array({t.device.device_type, t.device.device_id});
  out["state"] = TensorStateName(t.state);
  Json tags = Json::object();
  for (const auto& [key, value] : t.tags) tags[key] = value;
  out["tags"] = std::move(tags);
  out["created"] = Seconds(t.created_unix_ms);
  out["lease_count"] = t.lease_count;
  out["nbytes"] = t.nbytes;
  out["buffer_id"] = t.buffer_id;
  out["buffer_size"] = t.buffer_size;
  out["buffer_offset"] = t.buffer_offset;
  out["arena"] = t.arena;
  out["recyclable"] = t.recyclable;
  return out;
}

Json StatJson(const TensorStat& stat) {
  Json out = InfoJson(stat.info);
  Json holders = Json::array();
  for (const LeaseHolder& h : stat.holders) holders.push_back(HolderJson(h));
  out["holders"] = std::move(holders);
  return out;
}

Json StatusJson(const BrokerStatus& s, const RateMap* rates) {
  Json out = Json::object();
  out["version"] = s.version;
  out["pid"] = s.pid;
  out["uid"] = s.uid;
  out["uptime"] = Seconds(s.uptime_ms);
  out["host_bytes_in_use"] = s.host_bytes_in_use;
  out["host_bytes_limit"] = s.host_bytes_limit;
  out["tensors"] = s.tensors;
  out["named_tensors"] = s.named_tensors;
  out["buffers"] = s.buffers;
  out["leases"] = s.leases;
  out["sessions"] = s.sessions;
  out["socket"] = s.socket;
  out["releases_not_found"] = s.releases_not_found;
  out["host_bytes_pooled"] = s.host_bytes_pooled;
  out["pooled_buffers"] = s.pooled_buffers;
  out["hand_overs_pending"] = s.hand_overs_pending;
  out["leases_reclaimed"] = s.leases_reclaimed;
  Json pins = Json::array();
  for (const HandOverPins& p : s.hand_over_pins) pins.push_back(HandOverPinsJson(p));
  out["hand_over_pins"] = std::move(pins);
  Json backends = Json::array();
  for (const BackendInfo& b : s.backends) backends.push_back(BackendJson(b));
  out["backends"] = std::move(backends);
  Json sessions = Json::array();
  for (const SessionUsage& u : s.session_usage) sessions.push_back(SessionJson(u, rates));
  out["session_usage"] = std::move(sessions);
  if (s.cluster) {
    const ClusterStatus& c = *s.cluster;
    out["cluster"] = Json{{"node", c.node},
                          {"listen", c.listen},
                          {"namespaces", c.namespaces},
                          {"etcd_endpoint", c.etcd_endpoint},
                          {"joined", c.joined},
                          {"names_recorded", c.names_recorded},
                          {"replicas", c.replicas},
                          {"pulls", c.pulls},
                          {"bytes_pulled", c.bytes_pulled},
                          {"pulls_failed", c.pulls_failed},
                          {"reads_open", c.reads_open},
                          {"reads_served", c.reads_served},
                          {"bytes_served", c.bytes_served},
                          {"device_copies", c.device_copies}};
  }
  return out;
}

Json WatchEventJson(const WatchEvent& e) {
  Json out = Json::object();
  out["kind"] = WatchKindText(e.kind);
  out["name"] = e.name;
  out["generation"] = e.generation;
  out["tensor"] = e.tensor ? InfoJson(*e.tensor) : Json(nullptr);
  return out;
}

void PrintJson(const Json& document) {
  const std::string text = document.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace tensord::cli
