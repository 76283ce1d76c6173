#include "client/cli/text_output.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <ctime>

#include "common/human_bytes.h"

namespace tensord::cli {
namespace {

// Memory a session keeps in the daemon: what it leases and what it made, each tensor once
// per role. The sort key of the sessions table.
uint64_t BytesHeld(const SessionUsage& u) { return u.bytes_leased + u.bytes_produced; }

}  // namespace

std::string ShapeText(const std::vector<int64_t>& dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  if (dims.size() == 1) out += ",";
  return out + ")";
}

std::string DTypeText(DLDataType dtype) {
  Result<std::string> name = DTypeName(dtype);
  if (!name.ok()) return "code" + std::to_string(dtype.code) + "x" + std::to_string(dtype.bits);
  return *name;
}

std::string BytesText(uint64_t bytes) { return common::HumanBytes(bytes); }

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

const char* WatchKindText(WatchEvent::Kind kind) {
  switch (kind) {
    case WatchEvent::Kind::kBound: return "bound";
    case WatchEvent::Kind::kUnbound: return "unbound";
    case WatchEvent::Kind::kReset: return "reset";
  }
  return "reset";
}

void PrintInfoHuman(const TensorInfo& t) {
  std::printf("name        %s\n", t.name.empty() ? "(unnamed)" : t.name.c_str());
  std::printf("tensor id   %" PRIu64 "\n", t.tensor_id);
  std::printf("generation  %" PRIu64 "\n", t.generation);
  std::printf("state       %s\n", TensorStateName(t.state));
  std::printf("dtype       %s\n", DTypeText(t.dtype).c_str());
  std::printf("shape       %s\n", ShapeText(t.shape).c_str());
  std::printf("strides     %s\n", ShapeText(t.strides).c_str());
  std::printf("byte offset %" PRIu64 "\n", t.byte_offset);
  std::printf("device      %s\n", DeviceName(t.device).c_str());
  std::printf("bytes       %" PRIu64 " (%s)\n", t.nbytes, BytesText(t.nbytes).c_str());
  std::printf("buffer      %" PRIu64 " (%" PRIu64 " bytes)\n", t.buffer_id, t.buffer_size);
  std::printf("leases      %" PRIu32 "\n", t.lease_count);
  std::printf("created     %s\n", LocalTimeText(t.created_unix_ms).c_str());
  for (const auto& [k, v] : t.tags) std::printf("tag         %s=%s\n", k.c_str(), v.c_str());
}

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

}  // namespace tensord::cli
