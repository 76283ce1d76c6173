// tensord_ze_peer: a process holding Level Zero tensors through the public client, for the
// level-zero-fake integration tests. It runs against tests/fake_ze's software driver
// through the real loader (ZE_ENABLE_ALT_DRIVERS), so it proves the plumbing between
// processes, never an Intel GPU. It is a Level Zero program of its own: its context, handed
// to tensord with UseLevelZeroContext, and an immediate command list that moves the bytes.
// Element i of every tensor is i * 0.5 (float32).
//
//   produce SOCKET NAME ORDINAL COUNT   allocate float32[COUNT] on xpu:ORDINAL, copy the
//                                       values in, publish NAME, print "published <id>",
//                                       exit
//   stalled SOCKET NAME ORDINAL COUNT   the same, but the copy waits behind an event only
//                                       SIGUSR1 signals, and the publish names the command
//                                       list: print "published <id>" at once; on SIGUSR1
//                                       signal it, print "signalled", sleep until killed
//   consume SOCKET NAME COUNT MODE      MODE "host": acquire (waits on the host), print
//                                       "device <type> <id>", copy out, print "ok" or
//                                       "mismatch". MODE "list": acquire with the command
//                                       list as the stream, queue the copy out, print
//                                       "device <type> <id>", then "pending" if the copy
//                                       has not run 300 ms later (else "early"), then "ok"
//                                       or "mismatch" once it has
//   export SOCKET NAME ORDINAL COUNT    zeMemAllocDevice a block with kSlack bytes of -1.0f
//                                       in front of the values, ExportDevice that interior
//                                       pointer, publish NAME, print "exported <id>", sleep
//                                       until killed
//   export2 SOCKET NAME ORDINAL COUNT   as export, with two tensors in one block (NAMEa,
//                                       then NAMEb right after it), both published:
//                                       print "exported <id>", sleep until killed
//   pair SOCKET NAME COUNT              acquire NAMEa and NAMEb, print "pair <a> <b>" (ok
//                                       or mismatch), then "opens <n>" (the fake's open
//                                       IPC handles of this process)
//   hold SOCKET NAME COUNT              acquire, print "held ok"; on SIGUSR1 release,
//                                       flush, print "released", sleep until killed
//   ordered SOCKET NAME COUNT           acquire with the list as the stream, queue a copy
//                                       out behind an event only SIGUSR1 signals, release,
//                                       flush, print "released"; on SIGUSR1 signal it,
//                                       print "signalled", sleep until killed
//   opens SOCKET NAME COUNT             acquire NAME read-write and read-only: print
//                                       "opens <n>" (the fake's open IPC handles), release
//                                       both, print "opens <n>" once none is left (or 10 s)
// A failure prints "error <what>: <status>" and exits 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tensord/client.h"
#include "tests/integration/level_zero/ze_test_api.h"

namespace {

using tensord::testing::ZeProgram;

constexpr size_t kSlack = 64 * 1024;

int Fail(const std::string& what, const tensord::Status& status) {
  std::printf("error %s: %s\n", what.c_str(), status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

int Fail(const std::string& what) {
  std::printf("error %s\n", what.c_str());
  std::fflush(stdout);
  return 1;
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::vector<float> Halves(int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f;
  return values;
}

std::string Verdict(const std::vector<float>& values) {
  return values == Halves(static_cast<int64_t>(values.size())) ? "ok" : "mismatch";
}

void WaitForUsr1(const sigset_t& usr1) {
  int signal = 0;
  sigwait(&usr1, &signal);
}

tensord::TensorSpec XpuFloats(int64_t count, int ordinal) {
  tensord::TensorSpec spec;
  spec.dtype = tensord::dtypes::kFloat32;
  spec.shape = {count};
  spec.device = tensord::DLDevice{tensord::kDLOneAPI, ordinal};
  return spec;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: tensord_ze_peer COMMAND SOCKET NAME ...\n");
    return 2;
  }
  const std::string command = argv[1];
  // Before any thread starts, so that every one inherits it.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);

  const bool produces = command == "produce" || command == "stalled" || command == "export" || command == "export2";
  const int ordinal = produces && argc >= 5 ? std::atoi(argv[4]) : 0;
  ZeProgram ze(ordinal);
  if (!ze.ok()) return Fail("level zero: " + ze.error());
  tensord::Status handed = tensord::UseLevelZeroContext(ze.driver(), ze.context());
  if (!handed.ok()) return Fail("use context", handed);

  tensord::ClientOptions options;
  options.socket_path = argv[2];
  if (command == "opens" || command == "ordered") {
    // Mappings go soon after their last reference, so opens and held releases can be seen.
    options.lease_cache = false;
    options.lease_cache_linger = std::chrono::milliseconds(50);
  }
  auto client = tensord::Client::Connect(options);
  if (!client.ok()) return Fail("connect", client.status());
  const std::string name = argv[3];
  const std::string ns = name.substr(0, name.find('/'));

  if ((command == "produce" || command == "stalled") && argc == 6) {
    const int64_t count = std::atoll(argv[5]);
    auto tensor = (*client)->Allocate(ns, XpuFloats(count, ordinal));
    if (!tensor.ok()) return Fail("allocate", tensor.status());
    static std::vector<float> values = Halves(count);  // read by the list after main's scope
    const size_t bytes = values.size() * sizeof(float);
    tensord::PublishOptions publish;
    ze_event_handle_t gate = nullptr;
    if (command == "produce") {
      if (!ze.CopyNow(tensor->mutable_data(), values.data(), bytes)) return Fail("copy in");
    } else {
      gate = ze.NewEvent();
      if (gate == nullptr || !ze.Stall(gate) || !ze.Copy(tensor->mutable_data(), values.data(), bytes)) {
        return Fail("queue the copy in");
      }
      publish.stream = ze.stream();
    }
    auto published = (*client)->Publish(*tensor, name, publish);
    if (!published.ok()) return Fail("publish", published.status());
    Say("published " + std::to_string(tensor->info().device.device_id));
    if (command == "produce") return 0;
    WaitForUsr1(usr1);
    if (ze.zeEventHostSignal(gate) != ZE_RESULT_SUCCESS) return Fail("signal");
    Say("signalled");
    for (;;) ::pause();
  }
  if ((command == "export" || command == "export2") && argc == 6) {
    const int64_t count = std::atoll(argv[5]);
    const int tensors = command == "export" ? 1 : 2;
    std::vector<float> block(kSlack / sizeof(float), -1.0f);
    const std::vector<float> values = Halves(count);
    for (int i = 0; i < tensors; ++i) block.insert(block.end(), values.begin(), values.end());
    const size_t bytes = block.size() * sizeof(float);
    ze_device_mem_alloc_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
    void* memory = nullptr;
    if (ze.zeMemAllocDevice(static_cast<ze_context_handle_t>(ze.context()), &desc, bytes, 64, ze.device(), &memory) !=
            ZE_RESULT_SUCCESS ||
        !ze.CopyNow(memory, block.data(), bytes)) {
      return Fail("allocate and fill own device memory");
    }
    std::vector<tensord::TensorRef> kept;
    for (int i = 0; i < tensors; ++i) {
      const void* tensor_ptr = static_cast<const uint8_t*>(memory) + kSlack + i * count * sizeof(float);
      auto tensor = (*client)->ExportDevice(tensor_ptr, ns, XpuFloats(count, ordinal));
      if (!tensor.ok()) return Fail("export", tensor.status());
      if (tensor->data() != tensor_ptr) return Fail("export: the producer's view is not its own pointer");
      const std::string bound = tensors == 1 ? name : name + (i == 0 ? "a" : "b");
      auto published = (*client)->Publish(*tensor, bound);
      if (!published.ok()) return Fail("publish", published.status());
      kept.push_back(std::move(*tensor));
    }
    Say("exported " + std::to_string(kept.front().info().device.device_id));
    for (;;) ::pause();  // the memory is ours: keep it until killed
  }
  if (command == "consume" && argc == 6) {
    const int64_t count = std::atoll(argv[4]);
    const bool on_list = std::string(argv[5]) == "list";
    tensord::AcquireOptions acquire;
    if (on_list) acquire.stream = ze.stream();
    auto tensor = (*client)->Acquire(name, acquire);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    std::vector<float> values(static_cast<size_t>(count), -2.0f);
    const size_t bytes = values.size() * sizeof(float);
    if (!on_list) {
      Say("device " + std::to_string(static_cast<int>(tensor->info().device.device_type)) + " " +
          std::to_string(tensor->info().device.device_id));
      if (!ze.CopyNow(values.data(), tensor->data(), bytes)) return Fail("copy out");
      Say(Verdict(values));
      return 0;
    }
    ze_event_handle_t done = ze.NewEvent();
    if (done == nullptr || !ze.Copy(values.data(), tensor->data(), bytes, done)) return Fail("queue the copy out");
    Say("device " + std::to_string(static_cast<int>(tensor->info().device.device_type)) + " " +
        std::to_string(tensor->info().device.device_id));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Say(ze.zeEventQueryStatus(done) == ZE_RESULT_NOT_READY ? "pending" : "early");
    if (ze.zeEventHostSynchronize(done, 20'000'000'000ull) != ZE_RESULT_SUCCESS) return Fail("the copy out never ran");
    Say(Verdict(values));
    return 0;
  }
  if (command == "pair" && argc == 5) {
    const int64_t count = std::atoll(argv[4]);
    std::string verdicts;
    std::vector<tensord::TensorRef> held;
    for (const char* suffix : {"a", "b"}) {
      auto tensor = (*client)->Acquire(name + suffix);
      if (!tensor.ok()) return Fail("acquire", tensor.status());
      std::vector<float> values(static_cast<size_t>(count));
      if (!ze.CopyNow(values.data(), tensor->data(), values.size() * sizeof(float))) return Fail("copy out");
      verdicts += " " + Verdict(values);
      held.push_back(std::move(*tensor));
    }
    Say("pair" + verdicts);
    Say("opens " + std::to_string(tensord::testing::FakeZeLiveObjects("ipc_open")));
    return 0;
  }
  if (command == "hold" && argc == 5) {
    const int64_t count = std::atoll(argv[4]);
    auto tensor = (*client)->Acquire(name);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    std::vector<float> values(static_cast<size_t>(count));
    if (!ze.CopyNow(values.data(), tensor->data(), values.size() * sizeof(float))) return Fail("copy out");
    Say("held " + Verdict(values));
    WaitForUsr1(usr1);
    tensor->Release();
    tensord::Status flushed = (*client)->Flush();
    if (!flushed.ok()) return Fail("flush", flushed);
    Say("released");
    for (;;) ::pause();
  }
  if (command == "ordered" && argc == 5) {
    const int64_t count = std::atoll(argv[4]);
    tensord::AcquireOptions acquire;
    acquire.stream = ze.stream();
    auto tensor = (*client)->Acquire(name, acquire);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    static std::vector<float> values(static_cast<size_t>(count));
    ze_event_handle_t gate = ze.NewEvent();
    if (gate == nullptr || !ze.Stall(gate) || !ze.Copy(values.data(), tensor->data(), values.size() * sizeof(float))) {
      return Fail("queue the copy out");
    }
    // The list still has to read the tensor when its last reference goes.
    tensor->Release();
    tensord::Status flushed = (*client)->Flush();
    if (!flushed.ok()) return Fail("flush", flushed);
    Say("released");
    WaitForUsr1(usr1);
    if (ze.zeEventHostSignal(gate) != ZE_RESULT_SUCCESS) return Fail("signal");
    Say("signalled");
    for (;;) ::pause();
  }
  if (command == "opens" && argc == 5) {
    tensord::AcquireOptions readonly;
    readonly.readonly = true;
    {
      auto writable = (*client)->Acquire(name);
      if (!writable.ok()) return Fail("acquire", writable.status());
      auto read_only = (*client)->Acquire(name, readonly);
      if (!read_only.ok()) return Fail("acquire read-only", read_only.status());
      Say("opens " + std::to_string(tensord::testing::FakeZeLiveObjects("ipc_open")));
    }
    (void)(*client)->Flush();
    int64_t live = tensord::testing::FakeZeLiveObjects("ipc_open");
    for (int i = 0; i < 1000 && live > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      live = tensord::testing::FakeZeLiveObjects("ipc_open");
    }
    Say("opens " + std::to_string(live));
    return 0;
  }
  std::fprintf(stderr, "tensord_ze_peer: unknown command or arguments\n");
  return 2;
}
