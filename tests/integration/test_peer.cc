// tensord_test_peer: the other process in integration tests. Uses only the public client
// API (libtensord.so). Prints one line per step so the test can wait for it, then either
// exits or sleeps until it is killed.
//
//   produce SOCKET NAME COUNT VALUE      publish float32[COUNT] filled with VALUE, exit
//   hold SOCKET NAME                      acquire NAME, print "held <sum>", sleep
//   allocate SOCKET NS COUNT              allocate without publishing, print "allocated <id>", sleep
//   fork-hold SOCKET NAME                 acquire NAME; fork a child that acquires it again
//                                         with its own session; both sleep
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tensord/client.h"

namespace {

int Fail(const char* what, const tensord::Status& status) {
  std::printf("error %s: %s\n", what, status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void SleepForever() {
  while (true) pause();
}

double Sum(const tensord::TensorRef& tensor) {
  const float* data = static_cast<const float*>(tensor.data());
  double sum = 0;
  for (int64_t i = 0; i < tensor.info().shape[0]; ++i) sum += data[i];
  return sum;
}

std::unique_ptr<tensord::Client> Connect(const char* socket) {
  tensord::ClientOptions options;
  options.socket_path = socket;
  auto client = tensord::Client::Connect(options);
  if (!client.ok()) {
    Fail("connect", client.status());
    std::exit(1);
  }
  return std::move(client).value();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tensord_test_peer COMMAND SOCKET ARGS...\n");
    return 2;
  }
  std::string command = argv[1];
  auto client = Connect(argv[2]);
  if (command == "produce" && argc == 6) {
    tensord::TensorSpec spec;
    spec.dtype = tensord::dtypes::kFloat32;
    spec.shape = {std::atoll(argv[4])};
    std::string name = argv[3];
    auto tensor = client->Allocate(name.substr(0, name.find('/')), spec);
    if (!tensor.ok()) return Fail("allocate", tensor.status());
    float* data = static_cast<float*>(tensor->mutable_data());
    for (int64_t i = 0; i < spec.shape[0]; ++i) data[i] = std::strtof(argv[5], nullptr);
    auto published = client->Publish(*tensor, name);
    if (!published.ok()) return Fail("publish", published.status());
    Say("published " + std::to_string(published->tensor_id));
    return 0;
  }
  if (command == "hold" && argc == 4) {
    auto tensor = client->Acquire(argv[3]);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    Say("held " + std::to_string(Sum(*tensor)));
    SleepForever();
  }
  if (command == "allocate" && argc == 5) {
    tensord::TensorSpec spec;
    spec.shape = {std::atoll(argv[4])};
    auto tensor = client->Allocate(argv[3], spec);
    if (!tensor.ok()) return Fail("allocate", tensor.status());
    Say("allocated " + std::to_string(tensor->info().tensor_id));
    SleepForever();
  }
  if (command == "fork-hold" && argc == 4) {
    auto tensor = client->Acquire(argv[3]);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    Say("parent-held " + std::to_string(client->session_id()));
    pid_t child = fork();
    if (child == 0) {
      // The child's client must open a session of its own on first use.
      auto again = client->Acquire(argv[3]);
      if (!again.ok()) return Fail("child acquire", again.status());
      Say("child-held " + std::to_string(client->session_id()) + " " + std::to_string(Sum(*again)) +
          " inherited " + std::to_string(Sum(*tensor)));
      SleepForever();
    }
    Say("forked " + std::to_string(child));
    SleepForever();
  }
  std::fprintf(stderr, "tensord_test_peer: bad command or arguments\n");
  return 2;
}
