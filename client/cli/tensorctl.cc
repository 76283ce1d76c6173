// tensorctl: a command-line client of the tensord broker.
//
//   tensorctl [--socket PATH] [--json] status | ls [PREFIX] | stat NAME | put NAME FILE.npy
//             | get NAME [-o FILE.npy] [--wait SECONDS] | rm NAME | watch [PREFIX]
//
// Human tables by default, --json for scripts (one JSON document, or one JSON object per
// line for `watch`). Any error prints exactly one line on stderr, "tensorctl: <what>:
// <status message>", and exits non-zero: 2 for a usage error, 1 for anything else.
// `put` validates the whole .npy header against the file before it allocates anything, so
// a hostile file registers nothing; the data is read with pread straight into the
// broker's memory, and a Fortran-ordered array keeps its layout (Fortran strides).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/dlpack_convert.h"
#include "client/tensor_convert.h"
#include "common/human_bytes.h"
#include "common/names.h"
#include "common/npy.h"
#include "common/socket_paths.h"
#include "common/tensor_desc.h"
#include "common/unique_fd.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "tensord/client.h"
#include "tensord_build_info.h"  // generated: cmake/TensordBuildInfo.cmake

#ifndef TENSORD_VERSION
#define TENSORD_VERSION "0.0.0"
#endif

namespace tensord::cli {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

std::atomic<bool> interrupted{false};

void OnSigint(int) { interrupted.store(true); }

// For commands that run until Ctrl-C (watch, top): SIGINT and SIGTERM end them cleanly, and
// each line goes out as it is printed.
void EndOnSignal() {
  struct sigaction sa {};
  sa.sa_handler = &OnSigint;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
}

// A failure of one step: "<what>: <status message>".
struct Failure {
  std::string what;
  Status status;
};

int Fail(const std::string& what, const std::string& message, int code = kExitError) {
  std::string line = "tensorctl: " + what + ": " + message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  return code;
}

int Fail(const std::string& what, const Status& status) {
  return Fail(what, status.message().empty() ? std::string(StatusCodeName(status.code()))
                                             : status.message());
}

// --- formatting ---

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonInts(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::string ShapeText(const std::vector<int64_t>& v) {
  std::string out = "(";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() == 1) out += ",";
  return out + ")";
}

std::string DTypeText(DLDataType dtype) {
  auto proto = internal::FromDLDataType(dtype);
  if (!proto.ok()) return "code" + std::to_string(dtype.code) + "x" + std::to_string(dtype.bits);
  return common::DTypeName(*proto);
}

std::string BytesText(uint64_t n) { return common::HumanBytes(n); }

// Milliseconds since the epoch as local time, "2026-11-23 20:05:51.123 +0000".
std::string LocalTimeText(int64_t unix_ms) {
  // Floor division, so a time before 1970 keeps its milliseconds in [0, 999].
  int64_t seconds = unix_ms / 1000;
  int64_t ms = unix_ms % 1000;
  if (ms < 0) {
    ms += 1000;
    --seconds;
  }
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm local {};
  if (::localtime_r(&t, &local) == nullptr) return std::to_string(unix_ms) + " (unix ms)";
  char date[32];
  char zone[16];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &local);
  std::strftime(zone, sizeof(zone), "%z", &local);
  char text[64];
  std::snprintf(text, sizeof(text), "%s.%03d %s", date, static_cast<int>(ms), zone);
  return text;
}

std::string DeviceText(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda:" + std::to_string(d.device_id);
    case kDLCUDAHost: return "cuda_host";
    case kDLOneAPI: return "xpu:" + std::to_string(d.device_id);
    default: return "device" + std::to_string(d.device_type) + ":" + std::to_string(d.device_id);
  }
}

// Milliseconds as JSON seconds, as Python's dicts give times ("created", "uptime").
std::string SecondsJson(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(ms) / 1000.0);
  return text;
}

// The fields, names and units of the Python package's info dicts (py_convert.cc), so that a
// script reads tensorctl --json and a program reads client.stat() alike.
std::string InfoJson(const TensorInfo& t) {
  std::string tags = "{";
  bool first = true;
  for (const auto& [k, v] : t.tags) {
    tags += (first ? "" : ",") + JsonString(k) + ":" + JsonString(v);
    first = false;
  }
  tags += "}";
  return "{\"tensor_id\":" + std::to_string(t.tensor_id) + ",\"name\":" + JsonString(t.name) +
         ",\"generation\":" + std::to_string(t.generation) + ",\"dtype\":" +
         JsonString(DTypeText(t.dtype)) + ",\"shape\":" + JsonInts(t.shape) +
         ",\"strides\":" + JsonInts(t.strides) + ",\"byte_offset\":" +
         std::to_string(t.byte_offset) + ",\"device\":[" + std::to_string(t.device.device_type) + "," +
         std::to_string(t.device.device_id) + "]" +
         ",\"state\":" + JsonString(internal::TensorStateName(t.state)) + ",\"tags\":" + tags +
         ",\"created\":" + SecondsJson(t.created_unix_ms) + ",\"lease_count\":" +
         std::to_string(t.lease_count) + ",\"nbytes\":" + std::to_string(t.nbytes) +
         ",\"buffer_id\":" + std::to_string(t.buffer_id) + ",\"buffer_size\":" +
         std::to_string(t.buffer_size) + ",\"buffer_offset\":" + std::to_string(t.buffer_offset) +
         ",\"arena\":" + (t.arena ? "true" : "false") + ",\"recyclable\":" + (t.recyclable ? "true" : "false") +
         "}";
}

void PrintInfoHuman(const TensorInfo& t) {
  std::printf("name        %s\n", t.name.empty() ? "(unnamed)" : t.name.c_str());
  std::printf("tensor id   %" PRIu64 "\n", t.tensor_id);
  std::printf("generation  %" PRIu64 "\n", t.generation);
  std::printf("state       %s\n", internal::TensorStateName(t.state));
  std::printf("dtype       %s\n", DTypeText(t.dtype).c_str());
  std::printf("shape       %s\n", ShapeText(t.shape).c_str());
  std::printf("strides     %s\n", ShapeText(t.strides).c_str());
  std::printf("byte offset %" PRIu64 "\n", t.byte_offset);
  std::printf("device      %s\n", DeviceText(t.device).c_str());
  std::printf("bytes       %" PRIu64 " (%s)\n", t.nbytes, BytesText(t.nbytes).c_str());
  std::printf("buffer      %" PRIu64 " (%" PRIu64 " bytes)\n", t.buffer_id, t.buffer_size);
  std::printf("leases      %" PRIu32 "\n", t.lease_count);
  std::printf("created     %s\n", LocalTimeText(t.created_unix_ms).c_str());
  for (const auto& [k, v] : t.tags) std::printf("tag         %s=%s\n", k.c_str(), v.c_str());
}

// Prints rows with columns padded to their widest cell.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

// --- file I/O ---

Status ErrnoStatus(const std::string& what, int err) {
  StatusCode code = (err == ENOENT) ? StatusCode::kNotFound
                    : (err == EACCES || err == EPERM) ? StatusCode::kPermissionDenied
                    : (err == ENOSPC || err == ENOMEM) ? StatusCode::kResourceExhausted
                    : StatusCode::kUnknown;
  return Status(code, what + ": " + std::strerror(err));
}

Status PreadAll(int fd, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t got = ::pread(fd, dst, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoStatus("read " + path, errno);
    if (got == 0) return Status(StatusCode::kDataLoss, path + " is shorter than its header says");
    dst += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return Status();
}

Status WriteAll(int fd, const uint8_t* src, uint64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t put = ::write(fd, src, std::min<uint64_t>(n, 1u << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return ErrnoStatus("write " + path, errno);
    src += put;
    n -= static_cast<uint64_t>(put);
  }
  return Status();
}

std::vector<int64_t> FortranStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// Equal strides, ignoring dims of size <= 1 (their stride never matters).
bool SameLayout(const std::vector<int64_t>& shape, const std::vector<int64_t>& a,
                const std::vector<int64_t>& b) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] > 1 && a[i] != b[i]) return false;
  }
  return true;
}

// Writes the elements of a strided tensor in C order, a chunk at a time.
Status WriteCOrder(int fd, const TensorInfo& t, const uint8_t* base, uint64_t item,
                   const std::string& path) {
  const size_t nd = t.shape.size();
  std::vector<int64_t> index(nd, 0);
  std::vector<uint8_t> chunk;
  chunk.reserve(1 << 20);
  const uint64_t count = t.nbytes / item;
  for (uint64_t e = 0; e < count; ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < nd; ++d) off += index[d] * t.strides[d];
    const uint8_t* src = base + static_cast<uint64_t>(off) * item;
    chunk.insert(chunk.end(), src, src + item);
    if (chunk.size() >= (1 << 20)) {
      Status s = WriteAll(fd, chunk.data(), chunk.size(), path);
      if (!s.ok()) return s;
      chunk.clear();
    }
    for (size_t d = nd; d-- > 0;) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  return WriteAll(fd, chunk.data(), chunk.size(), path);
}

// --- commands ---

struct Globals {
  std::string socket;
  std::vector<uint32_t> trusted_daemon_uids;
  bool json = false;
};

Result<std::unique_ptr<Client>> ConnectFromFlags(const Globals& g) {
  ClientOptions options;
  options.socket_path = g.socket;
  options.trusted_daemon_uids = g.trusted_daemon_uids;
  options.client_name = "tensorctl";
  options.lease_cache = false;  // one-shot process: release at once
  return Client::Connect(options);
}

std::string BackendsJson(const std::vector<BackendInfo>& backends) {
  std::string out = "[";
  for (size_t i = 0; i < backends.size(); ++i) {
    const BackendInfo& b = backends[i];
    out += std::string(i == 0 ? "" : ",") + "{\"name\":" + JsonString(b.name) +
           ",\"built\":" + (b.built ? "true" : "false") +
           ",\"available\":" + (b.built && b.unavailable_reason.empty() ? "true" : "false") +
           ",\"unavailable_reason\":" + JsonString(b.unavailable_reason) + ",\"devices\":[";
    for (size_t k = 0; k < b.devices.size(); ++k) {
      const DeviceUsage& d = b.devices[k];
      out += std::string(k == 0 ? "" : ",") + "{\"device_type\":" + std::to_string(d.device.device_type) +
             ",\"device_id\":" + std::to_string(d.device.device_id) + ",\"uuid\":" + JsonString(d.uuid) +
             ",\"key\":" + JsonString(d.key) + ",\"name\":" + JsonString(d.name) +
             ",\"total_bytes\":" + std::to_string(d.total_bytes) +
             ",\"bytes_in_use\":" + std::to_string(d.bytes_in_use) +
             ",\"bytes_limit\":" + std::to_string(d.bytes_limit) +
             ",\"bytes_pooled\":" + std::to_string(d.bytes_pooled) + "}";
    }
    out += "]}";
  }
  return out + "]";
}

double Percent(uint64_t part, uint64_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// Per-session rates between two samples of the same sessions (top), by session id.
struct SessionRates {
  double leases_per_s = 0, publishes_per_s = 0;
};
using RateMap = std::map<uint64_t, SessionRates>;

std::string SessionsJson(const std::vector<SessionUsage>& sessions, const RateMap* rates) {
  std::string out = "[";
  for (size_t i = 0; i < sessions.size(); ++i) {
    const SessionUsage& u = sessions[i];
    char line[640];
    std::snprintf(line, sizeof(line),
                  "%s{\"id\":%" PRIu64 ",\"pid\":%u,\"uid\":%u,\"gid\":%u,\"client_name\":%s,\"opened\":%s"
                  ",\"leases\":%" PRIu64 ",\"bytes_leased\":%" PRIu64 ",\"tensors_produced\":%" PRIu64
                  ",\"bytes_produced\":%" PRIu64 ",\"leases_granted\":%" PRIu64 ",\"publishes\":%" PRIu64
                  ",\"waiting\":%" PRIu64,
                  i == 0 ? "" : ",", u.id, u.pid, u.uid, u.gid, JsonString(u.client_name).c_str(),
                  SecondsJson(u.opened_unix_ms).c_str(), u.leases, u.bytes_leased, u.tensors_produced,
                  u.bytes_produced, u.leases_granted, u.publishes, u.waiting);
    out += line;
    if (rates != nullptr) {
      auto it = rates->find(u.id);
      const SessionRates r = it == rates->end() ? SessionRates{} : it->second;
      std::snprintf(line, sizeof(line), ",\"leases_per_s\":%.3f,\"publishes_per_s\":%.3f", r.leases_per_s,
                    r.publishes_per_s);
      out += line;
    }
    out += "}";
  }
  return out + "]";
}

std::string HandOverPinsJson(const std::vector<HandOverPins>& pins) {
  std::string out = "[";
  for (const HandOverPins& p : pins) {
    char entry[256];
    std::snprintf(entry, sizeof(entry),
                  "{\"uid\":%u,\"hand_overs\":%" PRIu64 ",\"host_bytes\":%" PRIu64 ",\"device_bytes\":%" PRIu64 "}",
                  p.uid, p.hand_overs, p.host_bytes, p.device_bytes);
    if (out.size() > 1) out += ",";
    out += entry;
  }
  return out + "]";
}

std::string StatusJson(const BrokerStatus& s, const RateMap* rates) {
  char head[1024];
  std::snprintf(head, sizeof(head),
                "{\"version\":%s,\"pid\":%u,\"uid\":%u,\"uptime\":%s,\"host_bytes_in_use\":%" PRIu64
                ",\"host_bytes_limit\":%" PRIu64 ",\"tensors\":%" PRIu64 ",\"named_tensors\":%" PRIu64
                ",\"buffers\":%" PRIu64 ",\"leases\":%" PRIu64 ",\"sessions\":%" PRIu64
                ",\"socket\":%s,\"releases_not_found\":%" PRIu64 ",\"host_bytes_pooled\":%" PRIu64
                ",\"pooled_buffers\":%" PRIu64 ",\"hand_overs_pending\":%" PRIu64 ",\"leases_reclaimed\":%" PRIu64,
                JsonString(s.version).c_str(), s.pid, s.uid, SecondsJson(s.uptime_ms).c_str(), s.host_bytes_in_use,
                s.host_bytes_limit, s.tensors, s.named_tensors, s.buffers, s.leases, s.sessions,
                JsonString(s.socket).c_str(), s.releases_not_found, s.host_bytes_pooled, s.pooled_buffers,
                s.hand_overs_pending, s.leases_reclaimed);
  return std::string(head) + ",\"hand_over_pins\":" + HandOverPinsJson(s.hand_over_pins) +
         ",\"backends\":" + BackendsJson(s.backends) +
         ",\"session_usage\":" + SessionsJson(s.session_usage, rates) + "}";
}

// Memory a session keeps in the daemon: what it leases and what it made, each tensor once
// per role. The sort key of both views.
uint64_t BytesHeld(const SessionUsage& u) { return u.bytes_leased + u.bytes_produced; }

// The sessions table of `status` and `top`, the heaviest first; rates only in top.
void PrintSessions(const BrokerStatus& s, const RateMap* rates, size_t max_rows) {
  std::vector<const SessionUsage*> rows;
  for (const SessionUsage& u : s.session_usage) rows.push_back(&u);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const SessionUsage* a, const SessionUsage* b) { return BytesHeld(*a) > BytesHeld(*b); });
  if (rows.size() < s.sessions) {
    std::printf("(%zu of %" PRIu64 " sessions shown: only root and the daemon's uid see every uid's)\n", rows.size(),
                s.sessions);
  }
  std::printf("%8s %8s %6s %-16s %8s %10s %8s %10s %9s", "PID", "SESSION", "UID", "CLIENT", "LEASES", "LEASED",
              "MADE", "MADE BYTES", "AGE");
  if (rates != nullptr) std::printf(" %9s %9s", "LEASES/S", "PUBS/S");
  std::printf("\n");
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  for (size_t i = 0; i < rows.size() && i < max_rows; ++i) {
    const SessionUsage& u = *rows[i];
    std::string name = u.client_name.substr(0, 16);
    std::printf("%8u %8" PRIu64 " %6u %-16s %8" PRIu64 " %10s %8" PRIu64 " %10s %8.0fs", u.pid, u.id, u.uid,
                name.c_str(), u.leases, BytesText(u.bytes_leased).c_str(), u.tensors_produced,
                BytesText(u.bytes_produced).c_str(), static_cast<double>(now_ms - u.opened_unix_ms) / 1000.0);
    if (rates != nullptr) {
      auto it = rates->find(u.id);
      const SessionRates r = it == rates->end() ? SessionRates{} : it->second;
      std::printf(" %9.1f %9.1f", r.leases_per_s, r.publishes_per_s);
    }
    std::printf("\n");
  }
  if (rows.size() > max_rows) std::printf("... %zu more\n", rows.size() - max_rows);
}

int CmdStatus(Client& client, const Globals& g) {
  StatusOptions options;
  options.sessions = true;
  Result<BrokerStatus> st = client.GetStatus(options);
  if (!st.ok()) return Fail("status", st.status());
  const BrokerStatus& s = *st;
  if (g.json) {
    std::printf("%s\n", StatusJson(s, nullptr).c_str());
    return 0;
  }
  double pct = s.host_bytes_limit ? 100.0 * static_cast<double>(s.host_bytes_in_use) /
                                        static_cast<double>(s.host_bytes_limit)
                                  : 0.0;
  std::printf("broker       tensord %s, pid %u, uid %u, up %.1f s\n", s.version.c_str(), s.pid,
              s.uid, static_cast<double>(s.uptime_ms) / 1000.0);
  std::printf("socket       %s\n", s.socket.empty() ? client.socket_path().c_str() : s.socket.c_str());
  std::printf("host memory  %s in use of %s (%.1f%%); pooled for reuse: %s (%" PRIu64 " buffers on every device)\n",
              BytesText(s.host_bytes_in_use).c_str(), BytesText(s.host_bytes_limit).c_str(), pct,
              BytesText(s.host_bytes_pooled).c_str(), s.pooled_buffers);
  std::printf("tensors      %" PRIu64 " (%" PRIu64 " named), %" PRIu64 " buffers\n", s.tensors,
              s.named_tensors, s.buffers);
  std::printf("leases       %" PRIu64 " in %" PRIu64 " sessions (%" PRIu64
              " releases of unheld leases), %" PRIu64 " hand-overs pending, %" PRIu64
              " reclaimed from ended sessions\n",
              s.leases, s.sessions, s.releases_not_found, s.hand_overs_pending, s.leases_reclaimed);
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
  std::printf("\n");
  PrintSessions(s, nullptr, SIZE_MAX);
  return 0;
}

// A live view: every `interval` the broker's figures and its sessions, heaviest first,
// with their lease and publish rates since the last refresh; until Ctrl-C, or `iterations`.
int CmdTop(Client& client, const Globals& g, double interval, uint64_t iterations) {
  EndOnSignal();
  const bool screen = !g.json && ::isatty(STDOUT_FILENO) != 0;
  StatusOptions options;
  options.sessions = true;
  std::map<uint64_t, SessionUsage> previous;
  auto previous_at = std::chrono::steady_clock::now();
  for (uint64_t round = 0; !interrupted.load() && (iterations == 0 || round < iterations); ++round) {
    if (round > 0) {
      // Sleep in small steps so Ctrl-C ends it at once.
      const auto until = previous_at + std::chrono::duration<double>(interval);
      while (!interrupted.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (interrupted.load()) break;
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
    if (g.json) {
      std::printf("%s\n", StatusJson(*st, &rates).c_str());
      continue;
    }
    if (screen) std::printf("\033[H\033[2J");  // home, clear
    const BrokerStatus& s = *st;
    std::printf("tensord %s pid %u on %s, up %.0f s; refresh %.1f s (Ctrl-C ends)\n", s.version.c_str(), s.pid,
                s.socket.c_str(), static_cast<double>(s.uptime_ms) / 1000.0, interval);
    std::printf("host memory %s of %s, %s pooled; %" PRIu64 " tensors (%" PRIu64 " named); %" PRIu64
                " leases in %" PRIu64 " sessions; %" PRIu64 " leases reclaimed from ended sessions\n\n",
                BytesText(s.host_bytes_in_use).c_str(), BytesText(s.host_bytes_limit).c_str(),
                BytesText(s.host_bytes_pooled).c_str(), s.tensors, s.named_tensors, s.leases, s.sessions,
                s.leases_reclaimed);
    PrintSessions(s, round == 0 ? nullptr : &rates, screen ? 40 : SIZE_MAX);
    if (!screen) std::printf("\n");
  }
  return 0;
}

int CmdLs(Client& client, const Globals& g, const std::string& prefix) {
  Result<std::vector<TensorInfo>> list = client.List(prefix);
  if (!list.ok()) return Fail("ls " + (prefix.empty() ? std::string("''") : prefix), list.status());
  if (g.json) {
    std::string out = "[";
    for (size_t i = 0; i < list->size(); ++i) out += (i ? "," : "") + InfoJson((*list)[i]);
    std::printf("%s]\n", out.c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "GEN", "DTYPE", "SHAPE", "BYTES", "LEASES"}};
  for (const TensorInfo& t : *list) {
    rows.push_back({t.name, std::to_string(t.generation), DTypeText(t.dtype), ShapeText(t.shape),
                    BytesText(t.nbytes), std::to_string(t.lease_count)});
  }
  PrintTable(rows);
  return 0;
}

int CmdStat(Client& client, const Globals& g, const std::string& name) {
  Result<TensorStat> st = client.Stat(name);
  if (!st.ok()) return Fail("stat " + name, st.status());
  if (g.json) {
    std::string holders = "[";
    for (size_t i = 0; i < st->holders.size(); ++i) {
      const LeaseHolder& h = st->holders[i];
      holders += std::string(i ? "," : "") + "{\"session_id\":" + std::to_string(h.session_id) +
                 ",\"pid\":" + std::to_string(h.pid) + ",\"uid\":" + std::to_string(h.uid) +
                 ",\"gid\":" + std::to_string(h.gid) + ",\"leases\":" + std::to_string(h.leases) +
                 ",\"producer\":" + (h.producer ? "true" : "false") + "}";
    }
    // One object, as Python's stat() dict: the description's fields, then "holders".
    std::string info = InfoJson(st->info);
    info.pop_back();
    std::printf("%s,\"holders\":%s]}\n", info.c_str(), holders.c_str());
    return 0;
  }
  PrintInfoHuman(st->info);
  if (st->holders.empty()) return 0;
  std::printf("\n");
  std::vector<std::vector<std::string>> rows = {{"SESSION", "PID", "UID", "GID", "LEASES", "PRODUCER"}};
  for (const LeaseHolder& h : st->holders) {
    rows.push_back({std::to_string(h.session_id), h.pid ? std::to_string(h.pid) : "-",
                    std::to_string(h.uid), std::to_string(h.gid), std::to_string(h.leases),
                    h.producer ? "yes" : ""});
  }
  PrintTable(rows);
  return 0;
}

int CmdPut(Client& client, const Globals& g, const std::string& name, const std::string& path) {
  const std::string what = "put " + name;
  if (absl::Status valid = common::ValidateName(name); !valid.ok()) {
    return Fail(what, std::string(valid.message()));
  }
  common::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Fail(what, ErrnoStatus("open " + path, errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Fail(what, ErrnoStatus("stat " + path, errno));
  if (!S_ISREG(st.st_mode)) return Fail(what, path + " is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string prefix(std::min<uint64_t>(size, 1 << 20), '\0');
  Status read = PreadAll(fd.get(), reinterpret_cast<uint8_t*>(prefix.data()), prefix.size(), 0, path);
  if (!read.ok()) return Fail(what, read);
  // Everything about the file is checked here, before the broker sees anything.
  absl::StatusOr<common::NpyHeader> header = common::ParseNpyHeader(prefix, size);
  if (!header.ok()) return Fail(what, path + ": " + std::string(header.status().message()));

  TensorSpec spec;
  spec.dtype = internal::ToDLDataType(header->dtype);
  spec.shape = header->shape;
  if (header->fortran_order) spec.strides = FortranStrides(header->shape);
  Result<TensorRef> ref = client.Allocate(common::NamespaceOf(name), spec);
  if (!ref.ok()) return Fail(what, ref.status());
  if (header->data_bytes > 0) {
    auto* dst = static_cast<uint8_t*>(ref->mutable_data());
    Status filled = PreadAll(fd.get(), dst, header->data_bytes, header->data_offset, path);
    if (!filled.ok()) return Fail(what, filled);
  }
  Result<TensorInfo> info = client.Publish(*ref, name);
  if (!info.ok()) return Fail(what, info.status());
  if (g.json) {
    std::printf("%s\n", InfoJson(*info).c_str());
  } else {
    std::printf("%s: generation %" PRIu64 ", %s %s, %s\n", name.c_str(), info->generation,
                DTypeText(info->dtype).c_str(), ShapeText(info->shape).c_str(),
                BytesText(info->nbytes).c_str());
  }
  return 0;
}

Status WriteNpy(const TensorRef& ref, const std::string& path) {
  const TensorInfo& t = ref.info();
  absl::StatusOr<tensord::v1::DataType> dtype = internal::FromDLDataType(t.dtype);
  if (!dtype.ok()) return Status(StatusCode::kInvalidArgument, std::string(dtype.status().message()));
  const uint64_t item = common::ItemBytes(*dtype);
  const bool c_order = SameLayout(t.shape, t.strides, common::CompactStrides(t.shape));
  const bool f_order = !c_order && SameLayout(t.shape, t.strides, FortranStrides(t.shape));
  absl::StatusOr<std::string> header = common::FormatNpyHeader(*dtype, t.shape, f_order);
  if (!header.ok()) return Status(StatusCode::kInvalidArgument, std::string(header.status().message()));
  common::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus("open " + path, errno);
  Status s = WriteAll(fd.get(), reinterpret_cast<const uint8_t*>(header->data()), header->size(), path);
  if (!s.ok()) return s;
  const auto* data = static_cast<const uint8_t*>(ref.data());
  if (t.nbytes == 0) return Status();
  if (c_order || f_order) return WriteAll(fd.get(), data, t.nbytes, path);
  return WriteCOrder(fd.get(), t, data, item, path);
}

int CmdGet(Client& client, const Globals& g, const std::string& name, const std::string& out,
           std::optional<double> wait_seconds) {
  const std::string what = "get " + name;
  AcquireOptions options;
  options.readonly = true;
  if (wait_seconds.has_value()) {
    if (std::isnan(*wait_seconds) || *wait_seconds < 0) {
      return Fail(what, "--wait must be a non-negative number of seconds", kExitUsage);
    }
    if (std::isinf(*wait_seconds)) {
      options.wait = Wait::Forever();
    } else {
      options.wait = Wait::For(std::chrono::milliseconds(
          static_cast<int64_t>(std::min(*wait_seconds, 1e9) * 1000.0)));
    }
  }
  Result<TensorRef> ref = client.Acquire(name, options);
  if (!ref.ok()) return Fail(what, ref.status());
  if (!out.empty()) {
    Status written = WriteNpy(*ref, out);
    if (!written.ok()) return Fail(what, written);
  }
  if (g.json) {
    std::printf("%s\n", InfoJson(ref->info()).c_str());
  } else if (out.empty()) {
    PrintInfoHuman(ref->info());
  } else {
    std::printf("%s: generation %" PRIu64 ", %s %s -> %s\n", name.c_str(), ref->info().generation,
                DTypeText(ref->info().dtype).c_str(), ShapeText(ref->info().shape).c_str(),
                out.c_str());
  }
  return 0;
}

// `rm PREFIX/`: every name under the prefix, a page at a time. Each is deleted only at the
// generation listed, so a name published again meanwhile keeps its new tensor; one deleted
// by someone else meanwhile is counted as gone.
int CmdRmPrefix(Client& client, const Globals& g, const std::string& prefix) {
  uint64_t deleted = 0, kept = 0, gone = 0;
  ListPageOptions page;
  do {
    Result<TensorPage> listed = client.ListPage(prefix, page);
    if (!listed.ok()) return Fail("rm " + prefix, listed.status());
    for (const TensorInfo& info : listed->tensors) {
      Status s = client.Delete(info.name, info.generation);
      if (s.ok()) {
        ++deleted;
      } else if (s.code() == StatusCode::kAborted) {
        ++kept;
      } else if (s.code() == StatusCode::kNotFound) {
        ++gone;
      } else {
        return Fail("rm " + info.name + " (under " + prefix + ", after " + std::to_string(deleted) + " removed)", s);
      }
    }
    page.page_token = listed->next_page_token;
  } while (!page.page_token.empty());
  if (g.json) {
    std::printf("{\"deleted_prefix\":%s,\"deleted\":%" PRIu64 ",\"kept\":%" PRIu64 ",\"gone\":%" PRIu64 "}\n",
                JsonString(prefix).c_str(), deleted, kept, gone);
  } else {
    std::printf("removed %" PRIu64 " %s under %s", deleted, deleted == 1 ? "name" : "names", prefix.c_str());
    if (kept > 0) std::printf("; %" PRIu64 " published again meanwhile, kept", kept);
    if (gone > 0) std::printf("; %" PRIu64 " removed by someone else meanwhile", gone);
    std::printf("\n");
  }
  return 0;
}

int CmdRm(Client& client, const Globals& g, const std::string& name) {
  if (name.ends_with('/')) return CmdRmPrefix(client, g, name);
  Status s = client.Delete(name);
  if (!s.ok()) return Fail("rm " + name, s);
  if (g.json) std::printf("{\"deleted\":%s}\n", JsonString(name).c_str());
  return 0;
}

int CmdWatch(Client& client, const Globals& g, const std::string& prefix) {
  const std::string what = "watch " + (prefix.empty() ? std::string("''") : prefix);
  Result<std::unique_ptr<Watcher>> watcher = client.Watch(prefix, false);
  if (!watcher.ok()) return Fail(what, watcher.status());
  EndOnSignal();
  while (!interrupted.load()) {
    Result<std::optional<WatchEvent>> next = (*watcher)->Next(std::chrono::milliseconds(200));
    if (!next.ok()) return Fail(what, next.status());
    if (!next->has_value()) continue;
    const WatchEvent& e = **next;
    const char* kind = e.kind == WatchEvent::Kind::kBound     ? "bound"
                       : e.kind == WatchEvent::Kind::kUnbound ? "unbound"
                                                              : "reset";
    if (g.json) {
      std::printf("{\"kind\":\"%s\",\"name\":%s,\"generation\":%" PRIu64 ",\"tensor\":%s}\n", kind,
                  JsonString(e.name).c_str(), e.generation, e.tensor ? InfoJson(*e.tensor).c_str() : "null");
    } else if (e.kind == WatchEvent::Kind::kBound && e.tensor) {
      std::printf("bound    %s  gen %" PRIu64 "  %s %s  %s\n", e.name.c_str(), e.generation,
                  DTypeText(e.tensor->dtype).c_str(), ShapeText(e.tensor->shape).c_str(),
                  BytesText(e.tensor->nbytes).c_str());
    } else if (e.kind == WatchEvent::Kind::kReset) {
      std::printf("reset    (events were dropped; list again)\n");
    } else {
      std::printf("%-8s %s  gen %" PRIu64 "\n", kind, e.name.c_str(), e.generation);
    }
  }
  (*watcher)->Cancel();
  return 0;
}

// The daemon's grpc.health.v1 answer, asked without opening a session: for probes
// (Kubernetes' exec probe, scripts) that should neither count as clients nor be refused
// when the daemon is at its session cap.
int CmdHealth(const Globals& g, const std::string& service, double timeout_seconds) {
  const std::string socket = g.socket.empty() ? common::DefaultClientSocketPath() : g.socket;
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
  if (g.json) {
    std::printf("{\"socket\":%s,\"service\":%s,\"status\":%s}\n", JsonString(socket).c_str(),
                JsonString(service).c_str(), JsonString(state).c_str());
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

// Why no command ran (the first word CLI11 did not take, or nothing given), and the commands.
std::string NoCommandText(const CLI::App& app) {
  std::string commands;
  for (const CLI::App* command : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands += (commands.empty() ? "" : ", ") + command->get_name();
  }
  const std::vector<std::string> extra = app.remaining();
  std::string what = "no command given";
  if (!extra.empty()) {
    what = (extra.front().starts_with('-') ? "unknown option " : "unknown command ") +
           common::QuoteForError(extra.front());
  }
  return what + " (commands: " + commands + "; see tensorctl --help)";
}

int Run(int argc, char** argv) {
  CLI::App app{"tensorctl: inspect and use a tensord broker"};
  app.name("tensorctl");
  Globals g;
  app.add_option("--socket", g.socket, "broker socket (default: $TENSORD_SOCKET, the per-user "
                                       "socket, or /run/tensord/tensord.sock)");
  app.add_option("--trusted-daemon-uid", g.trusted_daemon_uids,
                 "a uid besides root and yours that the daemon may run as (repeatable; default: "
                 "$TENSORD_TRUSTED_DAEMON_UIDS)")
      ->check(CLI::Range(uint32_t{0}, uint32_t{UINT32_MAX - 1}));
  app.add_flag("--json", g.json, "machine-readable output");
  app.set_version_flag("--version", "tensorctl " TENSORD_VERSION_LINE,
                       "print the version, the commit built and the memory backends, and exit");
  app.require_subcommand(1, 1);
  app.fallthrough();  // --socket and --json also after the command

  auto* status = app.add_subcommand("status", "broker memory use, limits and counts");
  std::string ls_prefix;
  auto* ls = app.add_subcommand("ls", "list bound names");
  ls->add_option("PREFIX", ls_prefix, "only names under this prefix");
  std::string stat_name;
  auto* stat = app.add_subcommand("stat", "everything about one tensor, with its lease holders");
  stat->add_option("NAME", stat_name)->required();
  std::string put_name, put_file;
  auto* put = app.add_subcommand("put", "publish a .npy file under NAME");
  put->add_option("NAME", put_name)->required();
  put->add_option("FILE", put_file, ".npy file")->required();
  std::string get_name, get_out;
  std::optional<double> get_wait;
  auto* get = app.add_subcommand("get", "acquire NAME; write it as .npy with -o");
  get->add_option("NAME", get_name)->required();
  get->add_option("-o,--output", get_out, "write the tensor to this .npy file");
  get->add_option("--wait", get_wait, "wait up to SECONDS for the name to appear (inf: forever)");
  std::string rm_name;
  auto* rm = app.add_subcommand("rm", "unbind NAME, or every name under PREFIX/ (a trailing /)");
  rm->add_option("NAME", rm_name, "a name, or a prefix ending in / (every name under it)")->required();
  std::string watch_prefix;
  auto* watch = app.add_subcommand("watch", "print binding changes until Ctrl-C");
  watch->add_option("PREFIX", watch_prefix, "only names under this prefix");

  double top_interval = 1;
  uint64_t top_iterations = 0;
  auto* top = app.add_subcommand("top", "live view of the broker and its sessions by memory held, with rates");
  top->add_option("-d,--interval", top_interval, "seconds between refreshes (default 1)")->check(CLI::PositiveNumber);
  top->add_option("-n,--iterations", top_iterations, "stop after N refreshes (default: until Ctrl-C)");
  std::string health_service;
  double health_timeout = 5;
  auto* health = app.add_subcommand("health", "ask the daemon's gRPC health service (no session); exit 0 when SERVING");
  health->add_option("--service", health_service, "a service to ask about (default: the server as a whole)");
  health->add_option("--timeout", health_timeout, "seconds to wait for the answer (default 5)")
      ->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Without a command, CLI11 only says one is required; name what was given instead.
    if (app.get_subcommands().empty()) return Fail("usage", NoCommandText(app), kExitUsage);
    return Fail("usage", std::string(e.what()) + " (see tensorctl --help)", kExitUsage);
  }

  if (health->parsed()) return CmdHealth(g, health_service, health_timeout);
  Result<std::unique_ptr<Client>> client = ConnectFromFlags(g);
  if (!client.ok()) return Fail("connect", client.status());
  Client& c = **client;
  if (status->parsed()) return CmdStatus(c, g);
  if (ls->parsed()) return CmdLs(c, g, ls_prefix);
  if (stat->parsed()) return CmdStat(c, g, stat_name);
  if (put->parsed()) return CmdPut(c, g, put_name, put_file);
  if (get->parsed()) return CmdGet(c, g, get_name, get_out, get_wait);
  if (rm->parsed()) return CmdRm(c, g, rm_name);
  if (watch->parsed()) return CmdWatch(c, g, watch_prefix);
  if (top->parsed()) return CmdTop(c, g, top_interval, top_iterations);
  return Fail("usage", "no command given (see tensorctl --help)", kExitUsage);
}

}  // namespace
}  // namespace tensord::cli

int main(int argc, char** argv) {
  try {
    return tensord::cli::Run(argc, argv);
  } catch (const std::exception& e) {
    return tensord::cli::Fail("error", e.what());
  }
}
