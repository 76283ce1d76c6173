// tensord_load_peer: a client process for the crash and load tests (public client API only).
//
//   wait-hold SOCKET NAME             acquire NAME waiting forever; print "held <sum>", sleep
//   cycle SOCKET NAME COUNT SUM        COUNT times: acquire NAME (no lease cache), check that
//                                      its float32 elements add up to SUM, drop it and flush
//                                      the release; print "cycled <ok> <bad>" and exit 0 if
//                                      all were good
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tensord/client.h"

namespace {

int Fail(const char* what, const tensord::Status& status) {
  std::printf("error %s: %s\n", what, status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

double Sum(const tensord::TensorRef& tensor) {
  const float* data = static_cast<const float*>(tensor.data());
  double sum = 0;
  for (int64_t i = 0; i < tensor.info().shape[0]; ++i) sum += data[i];
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tensord_load_peer COMMAND SOCKET NAME ...\n");
    return 2;
  }
  const std::string command = argv[1];
  tensord::ClientOptions options;
  options.socket_path = argv[2];
  options.lease_cache = false;  // every acquire asks the broker
  auto client = tensord::Client::Connect(options);
  if (!client.ok()) return Fail("connect", client.status());

  if (command == "wait-hold" && argc == 4) {
    tensord::AcquireOptions acquire;
    acquire.wait = tensord::Wait::Forever();
    auto tensor = (*client)->Acquire(argv[3], acquire);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    std::printf("held %f\n", Sum(*tensor));
    std::fflush(stdout);
    while (true) pause();
  }
  if (command == "cycle" && argc == 6) {
    const long count = std::atol(argv[4]);
    const double want = std::strtod(argv[5], nullptr);
    long ok = 0;
    long bad = 0;
    for (long i = 0; i < count; ++i) {
      {
        auto tensor = (*client)->Acquire(argv[3]);
        if (!tensor.ok()) return Fail("acquire", tensor.status());
        if (std::fabs(Sum(*tensor) - want) < 1e-3) {
          ++ok;
        } else {
          ++bad;
        }
      }
      if (auto flushed = (*client)->Flush(); !flushed.ok()) return Fail("flush", flushed);
    }
    std::printf("cycled %ld %ld\n", ok, bad);
    std::fflush(stdout);
    return bad == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "tensord_load_peer: bad command or arguments\n");
  return 2;
}
