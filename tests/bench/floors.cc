#include "tests/bench/floors.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <memory>

#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace tensord::bench {
namespace {

using namespace std::chrono_literals;

constexpr size_t kMessageBytes = 64;
constexpr size_t kHandoffBytes = 4096;
constexpr char kEchoMethod[] = "/tensord.bench.Echo/Stream";

sockaddr_un Address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) Die("socket path too long: " + path);
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

Fd Listen(const std::string& path, int type) {
  Fd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) Die("socket: " + std::string(strerror(errno)));
  sockaddr_un address = Address(path);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd.get(), 4) != 0) {
    Die("listen on " + path + ": " + strerror(errno));
  }
  return fd;
}

Fd Connect(const std::string& path, int type) {
  Fd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) Die("socket: " + std::string(strerror(errno)));
  sockaddr_un address = Address(path);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    Die("connect to " + path + ": " + strerror(errno));
  }
  return fd;
}

// Reads or writes exactly `size` bytes; false on end of file.
bool ReadFull(int fd, void* data, size_t size) {
  auto* bytes = static_cast<uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die("read: " + std::string(strerror(errno)));
    if (n == 0) return false;
    bytes += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void WriteFull(int fd, const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die("write: " + std::string(strerror(errno)));
    bytes += n;
    size -= static_cast<size_t>(n);
  }
}

void SendFd(int socket, int fd, uint64_t size) {
  iovec payload{&size, sizeof(size)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &payload;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  if (::sendmsg(socket, &message, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(size))) {
    Die("sendmsg: " + std::string(strerror(errno)));
  }
}

// Receives one fd and its size; false on end of file.
bool ReceiveFd(int socket, Fd* fd, uint64_t* size) {
  iovec payload{size, sizeof(*size)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &payload;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  if (n == 0) return false;
  if (n != static_cast<ssize_t>(sizeof(*size)) || (message.msg_flags & MSG_CTRUNC) != 0) {
    Die("recvmsg: a short or truncated message");
  }
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (header == nullptr || header->cmsg_type != SCM_RIGHTS) Die("recvmsg: no fd attached");
  int received;
  std::memcpy(&received, CMSG_DATA(header), sizeof(int));
  fd->Reset(received);
  return true;
}

Fd MakeMemfd(size_t size) {
  Fd fd(::memfd_create("tensord-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    Die("memfd: " + std::string(strerror(errno)));
  }
  return fd;
}

// Starts this program as a helper server and waits until it listens.
std::unique_ptr<Process> StartServer(const std::string& kind, const std::string& path) {
  auto server = std::make_unique<Process>(std::vector<std::string>{SelfPath(), "--serve", kind, path});
  server->WaitForLine("ready", 20s);
  return server;
}

// ---- servers ----

int ServeUnixEcho(const std::string& path) {
  Fd listener = Listen(path, SOCK_STREAM);
  std::printf("ready\n");
  std::fflush(stdout);
  Fd peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!peer.valid()) Die("accept: " + std::string(strerror(errno)));
  std::array<uint8_t, kMessageBytes> message;
  while (ReadFull(peer.get(), message.data(), message.size())) WriteFull(peer.get(), message.data(), message.size());
  return 0;
}

int ServeFdSink(const std::string& path) {
  Fd listener = Listen(path, SOCK_SEQPACKET);
  std::printf("ready\n");
  std::fflush(stdout);
  Fd peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!peer.valid()) Die("accept: " + std::string(strerror(errno)));
  Fd fd;
  uint64_t size = 0;
  while (ReceiveFd(peer.get(), &fd, &size)) {
    uint8_t first;
    {
      Mapping mapping(fd.get(), size, PROT_READ, MAP_SHARED);
      fd.Reset();  // mapped: the fd is not needed any more
      first = *static_cast<volatile uint8_t*>(mapping.data());
    }
    WriteFull(peer.get(), &first, 1);
  }
  return 0;
}

class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buffer_;
};

class EchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    if (context->method() != kEchoMethod) return grpc::CallbackGenericService::CreateReactor(context);
    return new EchoReactor();
  }
};

int ServeGrpcEcho(const std::string& path) {
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) Die("grpc echo server: cannot listen on " + path);
  std::printf("ready\n");
  std::fflush(stdout);
  server->Wait();  // until the benchmark kills this process
  return 0;
}

// ---- benchmarks ----

void UnixStreamRtt(benchmark::State& state) {
  TempDir dir;
  const std::string path = dir.path() + "/echo.sock";
  auto server = StartServer("unix-echo", path);
  Fd socket = Connect(path, SOCK_STREAM);
  std::array<uint8_t, kMessageBytes> message{};
  Samples samples(state.max_iterations);
  for (auto _ : state) {
    TimeIteration(state, samples, [&] {
      WriteFull(socket.get(), message.data(), message.size());
      if (!ReadFull(socket.get(), message.data(), message.size())) Die("unix echo: the server went away");
    });
  }
  samples.Report(state);
}

// One step of an async gRPC call: waits for `tag` on the queue.
void Await(grpc::CompletionQueue& queue, void* tag, const char* what) {
  void* got = nullptr;
  bool ok = false;
  if (!queue.Next(&got, &ok) || got != tag || !ok) Die(std::string("grpc echo: ") + what + " failed");
}

void GrpcBidiRtt(benchmark::State& state) {
  TempDir dir;
  const std::string path = dir.path() + "/grpc.sock";
  auto server = StartServer("grpc-echo", path);
  auto channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  auto call = stub.PrepareCall(&context, kEchoMethod, &queue);
  void* const tag = reinterpret_cast<void*>(1);
  call->StartCall(tag);
  Await(queue, tag, "start");
  std::array<uint8_t, kMessageBytes> message{};
  grpc::ByteBuffer reply;
  auto round_trip = [&] {
    grpc::Slice slice(message.data(), message.size());
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, tag);
    Await(queue, tag, "write");
    call->Read(&reply, tag);
    Await(queue, tag, "read");
  };
  round_trip();  // the first message sets the stream up
  if (reply.Length() != kMessageBytes) Die("grpc echo: wrong reply size");
  Samples samples(state.max_iterations);
  for (auto _ : state) TimeIteration(state, samples, round_trip);
  samples.Report(state);
  call->WritesDone(tag);
  Await(queue, tag, "writes done");
  grpc::Status status;
  call->Finish(&status, tag);
  Await(queue, tag, "finish");
  queue.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (queue.Next(&ignored_tag, &ignored_ok)) {
  }
}

// existing = false: create a memfd and write 4 KiB each time; true: pass the same one.
void FdHandoff(benchmark::State& state, bool existing) {
  TempDir dir;
  const std::string path = dir.path() + "/fd.sock";
  auto server = StartServer("fd-sink", path);
  Fd socket = Connect(path, SOCK_SEQPACKET);
  std::array<uint8_t, kHandoffBytes> content;
  content.fill(7);
  Fd kept = MakeMemfd(kHandoffBytes);
  if (::pwrite(kept.get(), content.data(), content.size(), 0) != static_cast<ssize_t>(content.size())) {
    Die("pwrite: " + std::string(strerror(errno)));
  }
  Samples samples(state.max_iterations);
  for (auto _ : state) {
    uint8_t ack = 0;
    TimeIteration(state, samples, [&] {
      Fd fresh;
      if (!existing) {
        fresh = MakeMemfd(kHandoffBytes);
        if (::pwrite(fresh.get(), content.data(), content.size(), 0) != static_cast<ssize_t>(content.size())) {
          Die("pwrite: " + std::string(strerror(errno)));
        }
      }
      SendFd(socket.get(), existing ? kept.get() : fresh.get(), kHandoffBytes);
      if (!ReadFull(socket.get(), &ack, 1)) Die("fd sink: the server went away");
    });
    if (ack != 7) Die("fd sink read the wrong byte");
  }
  samples.Report(state);
}

}  // namespace

void RegisterFloors(const Scale& scale) {
  benchmark::RegisterBenchmark("floor/unix_stream_rtt", UnixStreamRtt)
      ->Iterations(scale.Pick(20000, 50))->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("floor/grpc_bidi_rtt", GrpcBidiRtt)
      ->Iterations(scale.Pick(10000, 50))->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("floor/memfd_handoff", [](benchmark::State& state) { FdHandoff(state, false); })
      ->Iterations(scale.Pick(10000, 50))->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("floor/fd_pass_existing", [](benchmark::State& state) { FdHandoff(state, true); })
      ->Iterations(scale.Pick(10000, 50))->UseManualTime()->Unit(benchmark::kMicrosecond);
}

int RunFloorServer(const std::string& kind, const std::string& path) {
  if (kind == "unix-echo") return ServeUnixEcho(path);
  if (kind == "fd-sink") return ServeFdSink(path);
  if (kind == "grpc-echo") return ServeGrpcEcho(path);
  std::fprintf(stderr, "tensord_bench: unknown server kind %s\n", kind.c_str());
  return 2;
}

}  // namespace tensord::bench
