// ls, stat, put, get, rm and watch: the commands about names and the tensors bound to them.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/commands.h"
#include "client/cli/json_output.h"
#include "client/cli/npy_file.h"
#include "client/cli/text_output.h"
#include "common/names.h"

namespace tensord::cli {
namespace {

// How `ls ''` and `watch ''` name the empty prefix in a failure.
std::string PrefixText(const std::string& prefix) { return prefix.empty() ? std::string("''") : prefix; }

// `rm PREFIX/`: every name under the prefix, a page at a time. Each is deleted only at the
// generation listed, so a name published again meanwhile keeps its new tensor; one deleted
// by someone else meanwhile is counted as gone.
int CmdRmPrefix(Client& client, const GlobalFlags& flags, const std::string& prefix) {
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
  if (flags.json) {
    Json out = Json::object();
    out["deleted_prefix"] = prefix;
    out["deleted"] = deleted;
    out["kept"] = kept;
    out["gone"] = gone;
    PrintJson(out);
  } else {
    std::printf("removed %" PRIu64 " %s under %s", deleted, deleted == 1 ? "name" : "names", prefix.c_str());
    if (kept > 0) std::printf("; %" PRIu64 " published again meanwhile, kept", kept);
    if (gone > 0) std::printf("; %" PRIu64 " removed by someone else meanwhile", gone);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int CmdLs(Client& client, const GlobalFlags& flags, const std::string& prefix) {
  Result<std::vector<TensorInfo>> list = client.List(prefix);
  if (!list.ok()) return Fail("ls " + PrefixText(prefix), list.status());
  if (flags.json) {
    Json out = Json::array();
    for (const TensorInfo& t : *list) out.push_back(InfoJson(t));
    PrintJson(out);
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

int CmdStat(Client& client, const GlobalFlags& flags, const std::string& name) {
  Result<TensorStat> st = client.Stat(name);
  if (!st.ok()) return Fail("stat " + name, st.status());
  if (flags.json) {
    PrintJson(StatJson(*st));
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

int CmdPut(Client& client, const GlobalFlags& flags, const std::string& name, const std::string& path) {
  const std::string what = "put " + name;
  if (absl::Status valid = common::ValidateName(name); !valid.ok()) {
    return Fail(what, std::string(valid.message()));
  }
  // Everything about the file is checked here, before the broker sees anything.
  Result<NpyFile> file = NpyFile::Open(path);
  if (!file.ok()) return Fail(what, file.status());
  Result<TensorRef> ref = client.Allocate(common::NamespaceOf(name), file->spec());
  if (!ref.ok()) return Fail(what, ref.status());
  if (file->data_bytes() > 0) {
    Status filled = file->ReadDataInto(ref->mutable_data());
    if (!filled.ok()) return Fail(what, filled);
  }
  Result<TensorInfo> info = client.Publish(*ref, name);
  if (!info.ok()) return Fail(what, info.status());
  if (flags.json) {
    PrintJson(InfoJson(*info));
  } else {
    std::printf("%s: generation %" PRIu64 ", %s %s, %s\n", name.c_str(), info->generation,
                DTypeText(info->dtype).c_str(), ShapeText(info->shape).c_str(),
                BytesText(info->nbytes).c_str());
  }
  return 0;
}

int CmdGet(Client& client, const GlobalFlags& flags, const std::string& name, const std::string& out,
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
      // Capped so the milliseconds fit an int64; 1e9 s is over 30 years.
      options.wait = Wait::For(std::chrono::milliseconds(
          static_cast<int64_t>(std::min(*wait_seconds, 1e9) * 1000.0)));
    }
  }
  Result<TensorRef> ref = client.Acquire(name, options);
  if (!ref.ok()) return Fail(what, ref.status());
  if (!out.empty()) {
    Status written = WriteNpyFile(*ref, out);
    if (!written.ok()) return Fail(what, written);
  }
  const TensorInfo& t = ref->info();
  if (flags.json) {
    PrintJson(InfoJson(t));
  } else if (out.empty()) {
    PrintInfoHuman(t);
  } else {
    std::printf("%s: generation %" PRIu64 ", %s %s -> %s\n", name.c_str(), t.generation,
                DTypeText(t.dtype).c_str(), ShapeText(t.shape).c_str(), out.c_str());
  }
  return 0;
}

int CmdRm(Client& client, const GlobalFlags& flags, const std::string& name) {
  if (name.ends_with('/')) return CmdRmPrefix(client, flags, name);
  Status s = client.Delete(name);
  if (!s.ok()) return Fail("rm " + name, s);
  if (flags.json) {
    Json out = Json::object();
    out["deleted"] = name;
    PrintJson(out);
  }
  return 0;
}

int CmdWatch(Client& client, const GlobalFlags& flags, const std::string& prefix) {
  const std::string what = "watch " + PrefixText(prefix);
  Result<std::unique_ptr<Watcher>> watcher = client.Watch(prefix, false);
  if (!watcher.ok()) return Fail(what, watcher.status());
  EndOnSignal();
  while (!Interrupted()) {
    Result<std::optional<WatchEvent>> next = (*watcher)->Next(std::chrono::milliseconds(200));
    if (!next.ok()) return Fail(what, next.status());
    if (!next->has_value()) continue;
    const WatchEvent& e = **next;
    if (flags.json) {
      PrintJson(WatchEventJson(e));
    } else if (e.kind == WatchEvent::Kind::kBound && e.tensor) {
      std::printf("bound    %s  gen %" PRIu64 "  %s %s  %s\n", e.name.c_str(), e.generation,
                  DTypeText(e.tensor->dtype).c_str(), ShapeText(e.tensor->shape).c_str(),
                  BytesText(e.tensor->nbytes).c_str());
    } else if (e.kind == WatchEvent::Kind::kReset) {
      std::printf("reset    (events were dropped; list again)\n");
    } else {
      std::printf("%-8s %s  gen %" PRIu64 "\n", WatchKindText(e.kind), e.name.c_str(), e.generation);
    }
  }
  (*watcher)->Cancel();
  return 0;
}

}  // namespace tensord::cli
