#include "common/memory/cuda/cuda_importer.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/memory/cuda/cuda_backend.h"
#include "common/memory/cuda/cuda_handle.h"
#include "common/memory/cuda/cuda_stream_order.h"
#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/fake_cuda_env.h"
#include "tests/fd_passing.h"

extern char** environ;

namespace tensord::common {
namespace {

using ::testing::HasSubstr;
using testing::FakeFailNext;
using testing::FakeLiveObjects;
using testing::ReceiveWithFd;
using testing::SendWithFd;
using testing::FakeSymbol;
using testing::FakeUuid;
using testing::FakeUuidText;

constexpr uint64_t kMiB = 1u << 20;
constexpr size_t kProbe = 64;

BackendDevice Cuda(int index) {
  BackendDevice d;
  d.device.set_type(tensord::v1::DEVICE_TYPE_CUDA);
  d.device.set_index(index);
  return d;
}

std::vector<uint8_t> Pattern(uint8_t seed) {  // as cuda_fake_peer.cc
  std::vector<uint8_t> p(kProbe);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(seed + i * 3);
  return p;
}

CUdeviceptr Ptr(const ImportedRegion& region) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(region.data()));
}

FetchedBuffer Fetched(MemoryHandle handle, uint64_t size) {
  FetchedBuffer b;
  b.buffer_id = 7;
  b.size = size;
  b.device_type = tensord::v1::DEVICE_TYPE_CUDA;
  b.handle = std::move(handle);
  return b;
}

// A cuda_fake_peer child with `env` added to this process's environment.
struct Peer {
  pid_t pid = -1;
  UniqueFd sock;

  // The child's exit status, or -1.
  int Wait() {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return -1;
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Peer() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      Wait();
    }
  }
};

void StartPeer(Peer* peer, const char* mode, const std::vector<std::string>& env) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  peer->sock.reset(sv[0]);
  UniqueFd child_end(sv[1]);
  std::vector<std::string> strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    bool overridden = false;
    for (const std::string& o : env) overridden |= entry.substr(0, entry.find('=')) == o.substr(0, o.find('='));
    if (!overridden) strings.push_back(entry);
  }
  strings.insert(strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& s : strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string fd_arg = std::to_string(child_end.get());
  char* argv[] = {const_cast<char*>(TENSORD_CUDA_FAKE_PEER_PATH), const_cast<char*>(mode), fd_arg.data(), nullptr};
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::fcntl(child_end.get(), F_SETFD, 0);  // the child's end survives exec
    ::execve(argv[0], argv, envp.data());
    ::_exit(127);
  }
  peer->pid = pid;
}

void Send(int sock, const std::string& bytes, int fd = -1) { ASSERT_TRUE(SendWithFd(sock, bytes, fd)); }

// One datagram; an fd that came with it is closed. Empty on end of file or an error.
std::string Receive(int sock) {
  std::string bytes;
  int fd = -1;
  if (!ReceiveWithFd(sock, &bytes, &fd)) return std::string();
  if (fd >= 0) ::close(fd);
  return bytes;
}

class CudaImporterTest : public ::testing::Test {
 protected:
  const CudaDriver& driver_ = CudaDriver::Get();
  CudaBackend backend_;
  CudaImporter importer_;
};

TEST_F(CudaImporterTest, ImportsAVmmBufferWritableAndReadOnly) {
  const int before = FakeLiveObjects();
  auto buffer = backend_.Allocate(Cuda(1), 4 * kMiB, "t1");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  {
    auto writable = importer_.Import(Fetched(*(*buffer)->Export(), 3 * kMiB), MapMode::kSharedWritable, "buffer 7");
    ASSERT_TRUE(writable.ok()) << writable.status();
    auto* w = static_cast<CudaRegion*>(writable->get());
    EXPECT_NE(w->data(), nullptr);
    EXPECT_EQ(w->size(), 3 * kMiB);
    EXPECT_EQ(w->mode(), MapMode::kSharedWritable);
    EXPECT_EQ(w->device_ordinal(), 1);
    EXPECT_TRUE(w->access_enforced());

    auto reader = importer_.Import(Fetched(*(*buffer)->Export(), 4 * kMiB), MapMode::kSharedReadOnly, "buffer 7");
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto* r = static_cast<CudaRegion*>(reader->get());
    EXPECT_NE(r->data(), w->data());  // its own mapping of the same allocation
    EXPECT_TRUE(r->access_enforced());

    auto context = ScopedCudaContext::Push(driver_, 1);
    ASSERT_TRUE(context.ok()) << context.status();
    std::vector<uint8_t> pattern = Pattern(1);
    ASSERT_EQ(driver_.cuMemcpyHtoD_v2(Ptr(*w) + kMiB, pattern.data(), kProbe), CUDA_SUCCESS);
    std::vector<uint8_t> got(kProbe);
    ASSERT_EQ(driver_.cuMemcpyDtoH_v2(got.data(), Ptr(*r) + kMiB, kProbe), CUDA_SUCCESS);
    EXPECT_EQ(got, pattern);
    // The reader's mapping refuses writes.
    EXPECT_EQ(driver_.cuMemcpyHtoD_v2(Ptr(*r), pattern.data(), kProbe), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(FakeLiveObjects("mapping"), 2);
  }
  EXPECT_EQ(FakeLiveObjects("mapping"), 0);
  EXPECT_EQ(FakeLiveObjects("reservation"), 0);
  buffer->reset();
  EXPECT_EQ(FakeLiveObjects(), before);
}

TEST_F(CudaImporterTest, AFailedMapUndoesTheImportAndTheReservation) {
  auto buffer = backend_.Allocate(Cuda(0), 2 * kMiB, "t2");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const int before = FakeLiveObjects();
  FakeFailNext("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY);
  auto region = importer_.Import(Fetched(*(*buffer)->Export(), 2 * kMiB), MapMode::kPrivate, "buffer 8");
  EXPECT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(region.status().message(), HasSubstr("buffer 8: cuMemMap of 2097152 bytes: CUDA_ERROR_OUT_OF_MEMORY"));
  EXPECT_EQ(FakeLiveObjects(), before);

  FakeFailNext("cuMemSetAccess", CUDA_ERROR_INVALID_DEVICE);
  region = importer_.Import(Fetched(*(*buffer)->Export(), 2 * kMiB), MapMode::kPrivate, "buffer 8");
  EXPECT_EQ(region.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FakeLiveObjects(), before);
}

TEST_F(CudaImporterTest, RefusesMalformedOrMismatchedBuffers) {
  auto buffer = backend_.Allocate(Cuda(0), 2 * kMiB, "t3");
  ASSERT_TRUE(buffer.ok()) << buffer.status();

  MemoryHandle no_fd = *(*buffer)->Export();
  no_fd.fds.clear();
  auto r1 = importer_.Import(Fetched(std::move(no_fd), 2 * kMiB), MapMode::kPrivate, "buffer 9");
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r1.status().message(), HasSubstr("buffer 9: a VMM handle comes with one fd, got 0"));

  auto r2 = importer_.Import(Fetched(*(*buffer)->Export(), 2 * kMiB + 1), MapMode::kPrivate, "buffer 9");
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r2.status().message(), HasSubstr("the cuda handle backs 2097152 bytes, the buffer has 2097153"));

  MemoryHandle garbage;
  garbage.data = "TDCU";
  auto r3 = importer_.Import(Fetched(std::move(garbage), 2 * kMiB), MapMode::kPrivate, "buffer 9");
  EXPECT_EQ(r3.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r3.status().message(), HasSubstr("buffer 9: cuda handle: 4 bytes, too short"));

  FetchedBuffer host = Fetched(*(*buffer)->Export(), 2 * kMiB);
  host.device_type = tensord::v1::DEVICE_TYPE_CPU;
  EXPECT_EQ(importer_.Import(host, MapMode::kPrivate, "buffer 9").status().code(),
            absl::StatusCode::kInvalidArgument);

  CudaHandle elsewhere;
  elsewhere.uuid = FakeUuid(9);
  elsewhere.size = 2 * kMiB;
  MemoryHandle absent;
  absent.data = EncodeCudaHandle(elsewhere);
  absent.fds.push_back(std::move((*buffer)->Export()->fds[0]));
  auto r4 = importer_.Import(Fetched(std::move(absent), 2 * kMiB), MapMode::kPrivate, "buffer 9");
  EXPECT_EQ(r4.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r4.status().message(),
            "buffer 9: device GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20009 is not visible in this process "
            "(CUDA_VISIBLE_DEVICES unset)");
}

TEST(CudaImporterReadOnlyTest, ADriverThatRefusesReadOnlyGetsAWritableMappingThatSaysSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("TENSORD_FAKE_CUDA_NO_READ_ONLY", "1", 1);
        CudaBackend backend;
        CudaImporter importer;
        auto buffer = backend.Allocate(Cuda(0), 2 * kMiB, "t");
        if (!buffer.ok()) std::_Exit(3);
        auto region = importer.Import(Fetched(*(*buffer)->Export(), 2 * kMiB), MapMode::kSharedReadOnly, "b");
        if (!region.ok()) std::_Exit(4);
        auto* r = static_cast<CudaRegion*>(region->get());
        std::fprintf(stderr, "mode_ro=%d enforced=%d\n", r->mode() == MapMode::kSharedReadOnly,
                     r->access_enforced());
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "mode_ro=1 enforced=0");
}

// The daemon's buffer (parent, sees both devices: the buffer is on its cuda:1) imported by
// a process that sees only that device, by UUID: there it is cuda:0.
TEST_F(CudaImporterTest, AnotherProcessImportsByUuidUnderItsOwnOrdinal) {
  auto buffer = backend_.Allocate(Cuda(1), 2 * kMiB, "t5");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto producer = importer_.Import(Fetched(*(*buffer)->Export(), 2 * kMiB), MapMode::kSharedWritable, "buffer 5");
  ASSERT_TRUE(producer.ok()) << producer.status();
  EXPECT_EQ(static_cast<CudaRegion*>(producer->get())->device_ordinal(), 1);
  auto context = ScopedCudaContext::Push(driver_, 1);
  ASSERT_TRUE(context.ok());
  std::vector<uint8_t> pattern = Pattern(1);
  ASSERT_EQ(driver_.cuMemcpyHtoD_v2(Ptr(**producer), pattern.data(), kProbe), CUDA_SUCCESS);

  for (MapMode mode : {MapMode::kPrivate, MapMode::kSharedReadOnly}) {
    Peer peer;
    StartPeer(&peer, "import", {"CUDA_VISIBLE_DEVICES=" + FakeUuidText(1)});
    MemoryHandle handle = *(*buffer)->Export();
    uint64_t size = 2 * kMiB;
    std::string msg(reinterpret_cast<const char*>(&size), 8);
    msg.push_back(static_cast<char>(mode));
    msg += handle.data;
    Send(peer.sock.get(), msg, handle.fds[0].get());
    handle.fds.clear();
    std::string report = Receive(peer.sock.get());
    EXPECT_EQ(peer.Wait(), 0);
    std::vector<uint8_t> got(kProbe);
    ASSERT_EQ(driver_.cuMemcpyDtoH_v2(got.data(), Ptr(**producer), kProbe), CUDA_SUCCESS);
    if (mode == MapMode::kPrivate) {
      EXPECT_EQ(report, "ordinal=0 read=ok write=CUDA_SUCCESS (no error) enforced=1 live_after=0");
      EXPECT_EQ(got, Pattern(2));  // the peer's write, seen here
      ASSERT_EQ(driver_.cuMemcpyHtoD_v2(Ptr(**producer), pattern.data(), kProbe), CUDA_SUCCESS);
    } else {
      EXPECT_EQ(report,
                "ordinal=0 read=ok write=CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered) "
                "enforced=1 live_after=0");
      EXPECT_EQ(got, pattern);  // unchanged
    }
  }
}

TEST_F(CudaImporterTest, AProcessThatCannotSeeTheDeviceIsToldWhich) {
  auto buffer = backend_.Allocate(Cuda(1), 2 * kMiB, "t6");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  Peer peer;
  StartPeer(&peer, "import", {"CUDA_VISIBLE_DEVICES=0"});
  MemoryHandle handle = *(*buffer)->Export();
  uint64_t size = 2 * kMiB;
  std::string msg(reinterpret_cast<const char*>(&size), 8);
  msg.push_back(static_cast<char>(MapMode::kPrivate));
  msg += handle.data;
  Send(peer.sock.get(), msg, handle.fds[0].get());
  EXPECT_EQ(Receive(peer.sock.get()),
            "error=FAILED_PRECONDITION: buffer 1: device GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20001 is not visible "
            "in this process (CUDA_VISIBLE_DEVICES=0)");
  EXPECT_EQ(peer.Wait(), 0);
}

// A producer's legacy IPC export (peer: sees physical device 1 as its cuda:0), adopted by
// the daemon's backend and imported here twice: one open, refcounted.
TEST_F(CudaImporterTest, LegacyIpcOpensOnceAndClosesOnTheLastRelease) {
  Peer producer;
  StartPeer(&producer, "export-ipc", {"CUDA_VISIBLE_DEVICES=1"});
  std::string bytes = Receive(producer.sock.get());
  ASSERT_EQ(bytes.size(), kCudaLegacyIpcHandleBytes);

  MemoryHandle sent;
  sent.data = bytes;
  auto adopted = backend_.Adopt(Cuda(1), std::move(sent), 2 * kMiB - 4096, "tensor 3");
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  auto exported = (*adopted)->Export();
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->data, bytes);

  const int opens_before = FakeLiveObjects("ipc_open");
  auto first = importer_.Import(Fetched(std::move(*exported), 2 * kMiB - 4096), MapMode::kPrivate, "buffer 3");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = importer_.Import(Fetched(*(*adopted)->Export(), kMiB), MapMode::kSharedReadOnly, "buffer 3");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*first)->data(), (*second)->data());
  EXPECT_EQ(FakeLiveObjects("ipc_open"), opens_before + 1);
  auto* r = static_cast<CudaRegion*>(second->get());
  EXPECT_EQ(r->device_ordinal(), 1);
  EXPECT_FALSE(r->access_enforced());  // legacy IPC cannot be mapped read-only
  EXPECT_EQ((*first)->size(), 2 * kMiB - 4096);

  {
    auto context = ScopedCudaContext::Push(driver_, 1);
    ASSERT_TRUE(context.ok());
    std::vector<uint8_t> got(kProbe);
    ASSERT_EQ(driver_.cuMemcpyDtoH_v2(got.data(), Ptr(**first), kProbe), CUDA_SUCCESS);
    EXPECT_EQ(got, Pattern(1));  // the producer wrote at offset 4096: data() includes it
  }

  first->reset();
  EXPECT_EQ(FakeLiveObjects("ipc_open"), opens_before + 1);
  second->reset();
  EXPECT_EQ(FakeLiveObjects("ipc_open"), opens_before);

  // Closed for good: a new import opens again.
  auto third = importer_.Import(Fetched(*(*adopted)->Export(), kMiB), MapMode::kPrivate, "buffer 3");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(FakeLiveObjects("ipc_open"), opens_before + 1);
  third->reset();
  EXPECT_EQ(FakeLiveObjects("ipc_open"), opens_before);

  Send(producer.sock.get(), "done");
  EXPECT_EQ(producer.Wait(), 0);
}

// The producer's half of legacy IPC: a pointer inside a cuMemAlloc'ed block becomes a
// handle that names the block, the pointer's offset in it and the device's UUID. Another
// process that sees the device under another ordinal reads and writes the bytes at the
// pointer through it; the broker's backend adopts it as memory its producer owns.
TEST_F(CudaImporterTest, ExportsAnInteriorPointerAsItsAllocationAndTheOffset) {
  auto alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(FakeSymbol("cuMemAlloc_v2"));
  auto free_block = reinterpret_cast<CUresult (*)(CUdeviceptr)>(FakeSymbol("cuMemFree_v2"));
  CUdeviceptr base = 0;
  const std::vector<uint8_t> pattern = Pattern(1);
  {
    auto context = ScopedCudaContext::Push(driver_, 1);
    ASSERT_TRUE(context.ok());
    ASSERT_EQ(alloc(&base, 2 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(driver_.cuMemcpyHtoD_v2(base + 4096, pattern.data(), kProbe), CUDA_SUCCESS);
  }
  const void* interior = reinterpret_cast<const void*>(static_cast<uintptr_t>(base + 4096));
  const tensord::v1::Device gpu1 = Cuda(1).device;
  auto exported = importer_.ExportExisting(interior, kMiB, gpu1, "tensor 9");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_TRUE(exported->fds.empty());
  auto handle = DecodeCudaHandle(exported->data);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(handle->kind, CudaHandleKind::kLegacyIpc);
  EXPECT_EQ(handle->uuid, testing::FakeUuid(1));
  EXPECT_EQ(handle->size, 2 * kMiB);
  EXPECT_EQ(handle->offset, 4096u);

  MemoryHandle sent;
  sent.data = exported->data;
  auto adopted = backend_.Adopt(Cuda(1), std::move(sent), kMiB, "tensor 9");
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_TRUE((*adopted)->OwnedByProducer());

  Peer peer;
  StartPeer(&peer, "import", {"CUDA_VISIBLE_DEVICES=" + FakeUuidText(1)});
  uint64_t size = kMiB;
  std::string msg(reinterpret_cast<const char*>(&size), 8);
  msg.push_back(static_cast<char>(MapMode::kPrivate));
  msg += exported->data;
  Send(peer.sock.get(), msg);
  EXPECT_THAT(Receive(peer.sock.get()), HasSubstr("ordinal=0 read=ok write=CUDA_SUCCESS"));
  EXPECT_EQ(peer.Wait(), 0);
  {
    auto context = ScopedCudaContext::Push(driver_, 1);
    ASSERT_TRUE(context.ok());
    std::vector<uint8_t> got(kProbe);
    ASSERT_EQ(driver_.cuMemcpyDtoH_v2(got.data(), base + 4096, kProbe), CUDA_SUCCESS);
    EXPECT_EQ(got, Pattern(2));  // the peer wrote where the pointer points
    ASSERT_EQ(free_block(base), CUDA_SUCCESS);
  }
}

TEST_F(CudaImporterTest, ExportRefusesWhatItCannotShareAndSaysWhy) {
  auto alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(FakeSymbol("cuMemAlloc_v2"));
  auto free_block = reinterpret_cast<CUresult (*)(CUdeviceptr)>(FakeSymbol("cuMemFree_v2"));
  auto context = ScopedCudaContext::Push(driver_, 1);
  ASSERT_TRUE(context.ok());
  CUdeviceptr base = 0;
  ASSERT_EQ(alloc(&base, 2 * kMiB), CUDA_SUCCESS);
  const void* interior = reinterpret_cast<const void*>(static_cast<uintptr_t>(base + 4096));
  const tensord::v1::Device gpu1 = Cuda(1).device;

  auto past_the_end = importer_.ExportExisting(interior, 2 * kMiB, gpu1, "tensor 10");
  EXPECT_EQ(past_the_end.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past_the_end.status().message(),
              HasSubstr("tensor 10: 2097152 bytes from the pointer reach past its allocation of 2097152 bytes "
                        "(the pointer is at offset 4096)"));
  auto other_device = importer_.ExportExisting(interior, 64, Cuda(0).device, "tensor 10");
  EXPECT_EQ(other_device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other_device.status().message(), HasSubstr("the pointer is on cuda:1, the tensor's device is cuda:0"));
  tensord::v1::Device wrong_uuid = gpu1;
  wrong_uuid.set_uuid(testing::FakeUuid(0));
  EXPECT_EQ(importer_.ExportExisting(interior, 64, wrong_uuid, "tensor 10").status().code(),
            absl::StatusCode::kInvalidArgument);
  int on_the_host = 0;
  auto host = importer_.ExportExisting(&on_the_host, sizeof(on_the_host), gpu1, "tensor 10");
  EXPECT_EQ(host.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(host.status().message(), HasSubstr("not CUDA device memory"));
  EXPECT_EQ(importer_.ExportExisting(nullptr, 64, gpu1, "tensor 10").status().code(),
            absl::StatusCode::kInvalidArgument);
  FakeFailNext("cuIpcGetMemHandle", CUDA_ERROR_NOT_SUPPORTED);
  auto refused = importer_.ExportExisting(interior, 64, gpu1, "tensor 10");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(refused.status().message(), HasSubstr("cuIpcGetMemHandle"));
  ASSERT_EQ(free_block(base), CUDA_SUCCESS);
}

TEST_F(CudaImporterTest, RegionsOutliveTheirImporter) {
  Peer producer;
  StartPeer(&producer, "export-ipc", {"CUDA_VISIBLE_DEVICES=1"});
  MemoryHandle handle;
  handle.data = Receive(producer.sock.get());
  const int opens_before = FakeLiveObjects("ipc_open");
  std::unique_ptr<ImportedRegion> region;
  {
    CudaImporter importer;
    auto imported = importer.Import(Fetched(std::move(handle), kMiB), MapMode::kPrivate, "buffer 4");
    ASSERT_TRUE(imported.ok()) << imported.status();
    region = std::move(*imported);
  }
  EXPECT_EQ(FakeLiveObjects("ipc_open"), opens_before + 1);
  region.reset();
  EXPECT_EQ(FakeLiveObjects("ipc_open"), opens_before);
  Send(producer.sock.get(), "done");
  EXPECT_EQ(producer.Wait(), 0);
}

// The fake's calls of `symbol` in this process so far.
int FakeCalls(const char* symbol) {
  return reinterpret_cast<int (*)(const char*)>(FakeSymbol("tensord_fake_cuda_calls"))(symbol);
}

// A consumer keeps the ready events it opened, per (source, fence): a producer's reused
// fence is opened once, the same bytes from another source (another process that reuses
// an old pid and so the same handle) are opened anew, a fence with no source is opened each
// time, and the least recently used beyond the bound is destroyed.
TEST_F(CudaImporterTest, OpenedReadyEventsAreKeptPerSourceAndFence) {
  Peer producer;
  StartPeer(&producer, "ready-fence", {});
  const std::string fence = Receive(producer.sock.get());
  ASSERT_FALSE(fence.empty());
  const StreamOrder& order = CudaStreamOrder::Get();
  const int opens = FakeCalls("cuIpcOpenEventHandle");
  const int live = FakeLiveObjects("event");
  ASSERT_TRUE(order.WaitReady(ReadyFence{fence, "session-a"}, 0, 0x11, "tensor 1").ok());
  ASSERT_TRUE(order.WaitReady(ReadyFence{fence, "session-a"}, 0, 0x12, "tensor 2").ok());
  EXPECT_EQ(FakeCalls("cuIpcOpenEventHandle"), opens + 1);
  EXPECT_EQ(FakeLiveObjects("event"), live + 1);  // kept
  ASSERT_TRUE(order.WaitReady(ReadyFence{fence, "session-b"}, 0, 0x11, "tensor 3").ok());
  EXPECT_EQ(FakeCalls("cuIpcOpenEventHandle"), opens + 2);
  ASSERT_TRUE(order.WaitReady(ReadyFence{fence, ""}, 0, 0x11, "tensor 4").ok());
  ASSERT_TRUE(order.WaitReady(ReadyFence{fence, ""}, 0, 0x11, "tensor 5").ok());
  EXPECT_EQ(FakeCalls("cuIpcOpenEventHandle"), opens + 4);
  EXPECT_EQ(FakeLiveObjects("event"), live + 2) << "an event opened without a source was kept";
  // Each wait was on the producer's still pending event.
  auto waits = reinterpret_cast<int (*)(uintptr_t, int, int)>(FakeSymbol("tensord_fake_cuda_stream_waits"));
  EXPECT_EQ(waits(0x11, producer.pid, 1), 4);
  EXPECT_EQ(waits(0x12, producer.pid, 1), 1);

  // Past the bound, the least recently used goes (session-a's, used before session-b's).
  for (size_t i = 0; i + 2 < CudaStreamOrder::kMaxOpenedReadyEvents; ++i) {
    ASSERT_TRUE(order.WaitReady(ReadyFence{fence, "filler-" + std::to_string(i)}, 0, 0x13, "tensor 6").ok());
  }
  EXPECT_EQ(FakeLiveObjects("event"), live + static_cast<int>(CudaStreamOrder::kMaxOpenedReadyEvents));
  ASSERT_TRUE(order.WaitReady(ReadyFence{fence, "session-c"}, 0, 0x13, "tensor 7").ok());
  EXPECT_EQ(FakeLiveObjects("event"), live + static_cast<int>(CudaStreamOrder::kMaxOpenedReadyEvents));
  const int before_reuse = FakeCalls("cuIpcOpenEventHandle");
  ASSERT_TRUE(order.WaitReady(ReadyFence{fence, "session-b"}, 0, 0x13, "tensor 8").ok());
  EXPECT_EQ(FakeCalls("cuIpcOpenEventHandle"), before_reuse) << "session-b's event was not kept";
  ASSERT_TRUE(order.WaitReady(ReadyFence{fence, "session-a"}, 0, 0x13, "tensor 9").ok());
  EXPECT_EQ(FakeCalls("cuIpcOpenEventHandle"), before_reuse + 1) << "session-a's event was not the one evicted";
  Send(producer.sock.get(), "done");
  EXPECT_EQ(producer.Wait(), 0);
}

// A producer's event this process cannot open for want of a context it shares (seen on an
// H200 with the producer in another PID namespace) fails the wait saying what to do.
TEST_F(CudaImporterTest, AnEventThatCannotBeOpenedHereSaysHowToPublishWithout) {
  Peer producer;
  StartPeer(&producer, "ready-fence", {});
  const std::string fence = Receive(producer.sock.get());
  ASSERT_FALSE(fence.empty());
  FakeFailNext("cuIpcOpenEventHandle", CUDA_ERROR_INVALID_CONTEXT);
  absl::Status waited = CudaStreamOrder::Get().WaitReady(ReadyFence{fence, "session-z"}, 0, 0x11, "tensor 3");
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("tensor 3: cuIpcOpenEventHandle on cuda:0"));
  EXPECT_THAT(waited.message(), HasSubstr("another PID namespace"));
  EXPECT_THAT(waited.message(), HasSubstr("Python stream=-1"));
  Send(producer.sock.get(), "done");
  EXPECT_EQ(producer.Wait(), 0);
}

// For a consumer with no stream: a host wait that returns once the producer's work is done.
TEST_F(CudaImporterTest, WaitReadyOnHostReturnsOnceTheProducersWorkIsDone) {
  Peer producer;
  StartPeer(&producer, "ready-fence", {});
  const std::string fence = Receive(producer.sock.get());
  ASSERT_FALSE(fence.empty());
  const StreamOrder& order = CudaStreamOrder::Get();
  const int syncs = FakeCalls("cuEventSynchronize");
  absl::Status waited = absl::UnknownError("not yet");
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    waited = order.WaitReadyOnHost(ReadyFence{fence, "session-a"}, 0, "tensor 1");
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (FakeCalls("cuEventSynchronize") == syncs && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(FakeCalls("cuEventSynchronize"), syncs) << "no host wait began";
  EXPECT_FALSE(done) << "the host wait returned while the producer's work was pending";
  Send(producer.sock.get(), "finish");
  EXPECT_EQ(Receive(producer.sock.get()), "finished");
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
  Send(producer.sock.get(), "done");
  EXPECT_EQ(producer.Wait(), 0);
}

}  // namespace
}  // namespace tensord::common
