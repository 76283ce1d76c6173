// The floors the tensord figures are compared with, each between two processes over a
// Unix socket, measured in the same run:
//   floor/unix_stream_rtt   64 bytes there and back on a SOCK_STREAM Unix socket;
//   floor/grpc_bidi_rtt     64 bytes there and back on one gRPC bidirectional stream over a
//                           Unix socket (a generic echo service: ByteBuffers, no .proto);
//   floor/memfd_handoff     create a memfd, write 4 KiB, pass it with SCM_RIGHTS on a
//                           SOCK_SEQPACKET socket; the peer maps it, reads, unmaps, acks;
//   floor/fd_pass_existing  the same without the create and write: an existing memfd is
//                           passed, mapped, read and acked (what a broker that already
//                           holds the memory pays).
// The peer is this program run again as `--serve KIND PATH` (RunFloorServer).
#pragma once

#include <string>

#include "tests/bench/bench_util.h"

namespace tensord::bench {

// Registers the floor benchmarks.
void RegisterFloors(const Scale& scale);

// The helper server side: KIND is unix-echo, grpc-echo or fd-sink, listening on PATH.
// Prints "ready" once listening, serves one connection, returns the exit code.
int RunFloorServer(const std::string& kind, const std::string& path);

}  // namespace tensord::bench
