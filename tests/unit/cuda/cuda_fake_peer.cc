// cuda_fake_peer: the other process of the cross-process cuda-fake tests. The parent test
// starts it with its own environment (CUDA_VISIBLE_DEVICES, TENSORD_LIBCUDA) and one end of
// a SOCK_SEQPACKET socketpair as argv[2].
//
//   cuda_fake_peer import SOCK    receives [u64 buffer size][u8 mode][handle bytes] + fd,
//                                 imports, checks the parent's bytes, writes its own, and
//                                 answers one report line; then unmaps and reports leaks.
//   cuda_fake_peer export-ipc SOCK  a legacy-IPC producer: cuMemAlloc on its device 0,
//                                 fills it, sends a legacy CudaHandle (offset 4096), and
//                                 keeps the memory until the parent sends "done".
//   cuda_fake_peer ready-fence SOCK  a producer's ready fence: holds its streams, records
//                                 one on device 0 (so it stays pending), sends its bytes;
//                                 on "finish" completes its streams and answers "finished";
//                                 on "done" exits.
#include <dlfcn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/memory/cuda/cuda_driver.h"
#include "common/memory/cuda/cuda_handle.h"
#include "common/memory/cuda/cuda_importer.h"
#include "common/memory/cuda/cuda_stream_order.h"
#include "tests/fd_passing.h"

namespace tc = tensord::common;

namespace {

constexpr size_t kProbe = 64;

void* FakeSymbol(const char* name) {
  void* lib = ::dlopen(std::getenv("TENSORD_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  return lib == nullptr ? nullptr : ::dlsym(lib, name);
}

int LiveObjects() {
  auto* f = reinterpret_cast<int (*)(const char*)>(FakeSymbol("tensord_fake_cuda_live_objects"));
  return f == nullptr ? -1 : f(nullptr);
}

using tensord::common::testing::ReceiveWithFd;
using tensord::common::testing::SendWithFd;

std::vector<uint8_t> Pattern(uint8_t seed) {
  std::vector<uint8_t> p(kProbe);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(seed + i * 3);
  return p;
}

int Import(int sock) {
  std::string msg;
  int fd = -1;
  if (!ReceiveWithFd(sock, &msg, &fd) || msg.size() < 9) return 10;
  uint64_t size = 0;
  std::memcpy(&size, msg.data(), 8);
  const auto mode = static_cast<tc::MapMode>(msg[8]);
  tc::FetchedBuffer buffer;
  buffer.buffer_id = 1;
  buffer.size = size;
  buffer.device_type = tensord::v1::DEVICE_TYPE_CUDA;
  buffer.handle.data = msg.substr(9);
  if (fd >= 0) buffer.handle.fds.emplace_back(fd);

  std::string report;
  {
    tc::CudaImporter importer;
    auto region = importer.Import(buffer, mode, "buffer 1");
    buffer.handle.fds.clear();  // closed once imported, as the client does
    if (!region.ok()) {
      SendWithFd(sock, absl::StrCat("error=", region.status().ToString()));
      return 0;
    }
    auto* cuda = static_cast<tc::CudaRegion*>(region->get());
    const tc::CudaDriver& driver = tc::CudaDriver::Get();
    auto context = tc::ScopedCudaContext::Push(driver, cuda->device_ordinal());
    if (!context.ok()) return 11;
    std::vector<uint8_t> got(kProbe);
    const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(cuda->data()));
    bool read_ok = driver.cuMemcpyDtoH_v2(got.data(), ptr, kProbe) == CUDA_SUCCESS && got == Pattern(1);
    std::vector<uint8_t> mine = Pattern(2);
    CUresult wrote = driver.cuMemcpyHtoD_v2(ptr, mine.data(), kProbe);
    report = absl::StrCat("ordinal=", cuda->device_ordinal(), " read=", read_ok ? "ok" : "wrong",
                          " write=", driver.ErrorText(wrote), " enforced=", cuda->access_enforced() ? 1 : 0);
  }
  absl::StrAppend(&report, " live_after=", LiveObjects());
  return SendWithFd(sock, report) ? 0 : 12;
}

int ExportIpc(int sock) {
  const tc::CudaDriver& driver = tc::CudaDriver::Get();
  if (!driver.available()) return 20;
  auto* alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(FakeSymbol("cuMemAlloc_v2"));
  auto* free_ = reinterpret_cast<CUresult (*)(CUdeviceptr)>(FakeSymbol("cuMemFree_v2"));
  auto* get_handle = reinterpret_cast<CUresult (*)(CUipcMemHandle*, CUdeviceptr)>(FakeSymbol("cuIpcGetMemHandle"));
  if (alloc == nullptr || free_ == nullptr || get_handle == nullptr) return 21;
  auto context = tc::ScopedCudaContext::Push(driver, 0);
  if (!context.ok()) return 22;
  CUdeviceptr base = 0;
  const size_t size = 2u << 20;
  if (alloc(&base, size) != CUDA_SUCCESS) return 23;
  std::vector<uint8_t> pattern = Pattern(1);
  if (driver.cuMemcpyHtoD_v2(base + 4096, pattern.data(), kProbe) != CUDA_SUCCESS) return 24;
  CUipcMemHandle ipc;
  if (get_handle(&ipc, base) != CUDA_SUCCESS) return 25;
  auto uuid = driver.DeviceUuid(0);
  if (!uuid.ok()) return 26;
  tc::CudaHandle handle;
  handle.kind = tc::CudaHandleKind::kLegacyIpc;
  handle.uuid = *uuid;
  handle.size = size;
  handle.offset = 4096;
  std::memcpy(handle.ipc_handle.data(), ipc.reserved, sizeof(ipc.reserved));
  if (!SendWithFd(sock, tc::EncodeCudaHandle(handle))) return 27;
  // The exporter must outlive every importer.
  std::string done;
  int fd = -1;
  if (!ReceiveWithFd(sock, &done, &fd) || done != "done") return 28;
  return free_(base) == CUDA_SUCCESS ? 0 : 29;
}

int ReadyFence(int sock) {
  if (!tc::CudaDriver::Get().available()) return 29;  // loads the stand-in FakeSymbol looks in
  auto* hold = reinterpret_cast<void (*)(int)>(FakeSymbol("tensord_fake_cuda_hold_streams"));
  auto* finish = reinterpret_cast<int (*)()>(FakeSymbol("tensord_fake_cuda_finish_streams"));
  if (hold == nullptr || finish == nullptr) return 30;
  hold(1);
  auto fence = tc::CudaStreamOrder::Get().RecordReady(0, 1, "fence");
  if (!fence.ok() || !SendWithFd(sock, *fence)) return 31;
  for (;;) {
    std::string command;
    int fd = -1;
    if (!ReceiveWithFd(sock, &command, &fd)) return 32;
    if (command == "done") return 0;
    if (command != "finish") return 33;
    finish();
    if (!SendWithFd(sock, "finished")) return 34;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const int sock = std::atoi(argv[2]);
  const std::string mode = argv[1];
  if (mode == "import") return Import(sock);
  if (mode == "export-ipc") return ExportIpc(sock);
  if (mode == "ready-fence") return ReadyFence(sock);
  return 2;
}
