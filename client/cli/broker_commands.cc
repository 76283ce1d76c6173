// status, top and health: the commands about the daemon as a whole.
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "client/cli/commands.h"
#include "client/cli/json_output.h"
#include "client/cli/text_output.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"

namespace tensord::cli {
namespace {

double Percent(uint64_t part, uint64_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// The lines of `status` above the sessions table.
void PrintStatusHuman(const BrokerStatus& s, const std::string& socket_asked) {
  std::printf("broker       tensord %s, pid %u, uid %u, up %.1f s\n", s.version.c_str(), s.pid,
              s.uid, static_cast<double>(s.uptime_ms) / 1000.0);
  std::printf("socket       %s\n", s.socket.empty() ? socket_asked.c_str() : s.socket.c_str());
  std::printf("host memory  %s in use of %s (%.1f%%); pooled for reuse: %s (%" PRIu64 " buffers on every device)\n",
              BytesText(s.host_bytes_in_use).c_str(), BytesText(s.host_bytes_limit).c_str(),
              Percent(s.host_bytes_in_use, s.host_bytes_limit), BytesText(s.host_bytes_pooled).c_str(),
              s.pooled_buffers);
  std::printf("tensors      %" PRIu64 " (%" PRIu64 " named), %" PRIu64 " buffers\n", s.tensors,
              s.named_tensors, s.buffers);
  std::printf("leases       %" PRIu64 " in %" PRIu64 " sessions (%" PRIu64
              " releases of unheld leases), %" PRIu64 " hand-overs pending, %" PRIu64
              " reclaimed from ended sessions\n",
              s.leases, s.sessions, s.releases_not_found, s.hand_overs_pending, s.leases_reclaimed);
  if (s.cluster) {
    const ClusterStatus& c = *s.cluster;
    std::string namespaces;
    for (const std::string& ns : c.namespaces) namespaces += (namespaces.empty() ? "" : ",") + ns;
    std::printf("cluster      node %s at %s, sharing %s; %s (etcd %s)\n", c.node.c_str(), c.listen.c_str(),
                namespaces.c_str(), c.joined ? "joined" : "NOT joined: its names are not in the directory",
                c.etcd_endpoint.c_str());
    std::printf("             %" PRIu64 " names recorded, %" PRIu64 " replicas; pulled %" PRIu64 " (%s, %" PRIu64
                " failed); served %" PRIu64 " reads (%s), %" PRIu64 " open; %" PRIu64 " device copies\n",
                c.names_recorded, c.replicas, c.pulls, BytesText(c.bytes_pulled).c_str(), c.pulls_failed,
                c.reads_served, BytesText(c.bytes_served).c_str(), c.reads_open, c.device_copies);
  }
  // Memory only pending hand-overs may be keeping, by the uid charged for it.
  for (const HandOverPins& p : s.hand_over_pins) {
    std::printf("pinned       uid %u: %s host, %s device memory held by %" PRIu64 " pending hand-overs\n", p.uid,
                BytesText(p.host_bytes).c_str(), BytesText(p.device_bytes).c_str(), p.hand_overs);
  }
  // Every other backend, and by device what the broker holds there (host memory is above).
  for (const BackendInfo& b : s.backends) {
    if (b.name == "host") continue;
    if (!b.built || !b.unavailable_reason.empty()) {
      std::printf("%-12s %s: %s\n", b.name.c_str(), b.built ? "unavailable" : "not built",
                  b.unavailable_reason.c_str());
      continue;
    }
    for (const DeviceUsage& d : b.devices) {
      const std::string device = b.name + ":" + std::to_string(d.device.device_id) + " " + d.name + " " + d.uuid;
      std::printf("%-12s %s: %s in use of %s (%.1f%%); pooled for reuse: %s\n", b.name.c_str(), device.c_str(),
                  BytesText(d.bytes_in_use).c_str(), BytesText(d.bytes_limit).c_str(),
                  Percent(d.bytes_in_use, d.bytes_limit), BytesText(d.bytes_pooled).c_str());
    }
  }
}

// One refresh of `top` as text: two lines about the broker, then its sessions.
void PrintTopHuman(const BrokerStatus& s, double interval, const RateMap* rates, bool screen) {
  if (screen) std::printf("\033[H\033[2J");  // home, clear
  std::printf("tensord %s pid %u on %s, up %.0f s; refresh %.1f s (Ctrl-C ends)\n", s.version.c_str(), s.pid,
              s.socket.c_str(), static_cast<double>(s.uptime_ms) / 1000.0, interval);
  std::printf("host memory %s of %s, %s pooled; %" PRIu64 " tensors (%" PRIu64 " named); %" PRIu64
              " leases in %" PRIu64 " sessions; %" PRIu64 " leases reclaimed from ended sessions\n\n",
              BytesText(s.host_bytes_in_use).c_str(), BytesText(s.host_bytes_limit).c_str(),
              BytesText(s.host_bytes_pooled).c_str(), s.tensors, s.named_tensors, s.leases, s.sessions,
              s.leases_reclaimed);
  // A terminal shows the heaviest 40; a pipe gets every session.
  PrintSessions(s, rates, screen ? 40 : SIZE_MAX);
  if (!screen) std::printf("\n");
}

}  // namespace

int CmdStatus(Client& client, const GlobalFlags& flags) {
  StatusOptions options;
  options.sessions = true;
  Result<BrokerStatus> st = client.GetStatus(options);
  if (!st.ok()) return Fail("status", st.status());
  if (flags.json) {
    PrintJson(StatusJson(*st, nullptr));
    return 0;
  }
  PrintStatusHuman(*st, client.socket_path());
  std::printf("\n");
  PrintSessions(*st, nullptr, SIZE_MAX);
  return 0;
}

int CmdQueues(Client& client, const GlobalFlags& flags) {
  StatusOptions options;
  options.queues = true;
  Result<BrokerStatus> st = client.GetStatus(options);
  if (!st.ok()) return Fail("queues", st.status());
  if (flags.json) {
    Json out = Json::array();
    for (const QueueStatus& q : st->queues) out.push_back(QueueJson(q));
    PrintJson(out);
    return 0;
  }
  if (st->queues.empty()) {
    std::printf("no bounded work queues\n");
    return 0;
  }
  std::printf("%-32s %6s %6s %10s %10s %8s\n", "QUEUE", "DEPTH", "IN", "PUBLISHED", "PRODUCERS", "TAKERS");
  for (const QueueStatus& q : st->queues) {
    std::printf("%-32s %6u %6u %10" PRIu64 " %10u %8u\n", q.prefix.c_str(), q.depth, q.slots_held, q.published,
                q.producers_waiting, q.takers_waiting);
  }
  std::printf("\nIN: tensors in the queue (being written, or published and not taken); PRODUCERS and TAKERS: "
              "waiting for room and for a tensor\n");
  return 0;
}

// A live view: every `interval` the broker's figures and its sessions, heaviest first,
// with their lease and publish rates since the last refresh.
int CmdTop(Client& client, const GlobalFlags& flags, double interval, uint64_t iterations) {
  EndOnSignal();
  const bool screen = !flags.json && ::isatty(STDOUT_FILENO) != 0;
  StatusOptions options;
  options.sessions = true;
  std::map<uint64_t, SessionUsage> previous;
  auto previous_at = std::chrono::steady_clock::now();
  for (uint64_t round = 0; !Interrupted() && (iterations == 0 || round < iterations); ++round) {
    if (round > 0) {
      // Sleep in small steps so Ctrl-C ends it at once.
      const auto until = previous_at + std::chrono::duration<double>(interval);
      while (!Interrupted() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (Interrupted()) break;
    }
    Result<BrokerStatus> st = client.GetStatus(options);
    if (!st.ok()) return Fail("top", st.status());
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - previous_at).count();
    RateMap rates;
    for (const SessionUsage& u : st->session_usage) {
      auto it = previous.find(u.id);
      if (it == previous.end() || round == 0 || seconds <= 0) continue;
      rates[u.id] = {static_cast<double>(u.leases_granted - it->second.leases_granted) / seconds,
                     static_cast<double>(u.publishes - it->second.publishes) / seconds};
    }
    previous.clear();
    for (const SessionUsage& u : st->session_usage) previous[u.id] = u;
    previous_at = now;
    if (flags.json) {
      PrintJson(StatusJson(*st, &rates));
    } else {
      PrintTopHuman(*st, interval, round == 0 ? nullptr : &rates, screen);
    }
  }
  return 0;
}

// Asked without opening a session: for probes (Kubernetes' exec probe, scripts) that should
// neither count as clients nor be refused when the daemon is at its session cap.
int CmdHealth(const GlobalFlags& flags, const std::string& service, double timeout_seconds) {
  const std::string socket = flags.socket.empty() ? DefaultClientSocketPath() : flags.socket;
  const std::string what = "health of " + socket;
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status rpc = grpc::health::v1::Health::NewStub(channel)->Check(&context, request, &response);
  if (!rpc.ok()) {
    return Fail(what, std::string(StatusCodeName(static_cast<StatusCode>(rpc.error_code()))) + ": " +
                          rpc.error_message());
  }
  const std::string state = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  if (flags.json) {
    Json out = Json::object();
    out["socket"] = socket;
    out["service"] = service;
    out["status"] = state;
    PrintJson(out);
  } else {
    std::printf("%s\n", state.c_str());
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    std::fprintf(stderr, "tensorctl: %s: %s%s\n", what.c_str(), state.c_str(),
                 service.empty() ? "" : (" (service " + service + ")").c_str());
    return kExitError;
  }
  return 0;
}

}  // namespace tensord::cli
