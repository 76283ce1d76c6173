// UCX one-sided reads between brokers: the cluster's data path (PeerService registers,
// ReplicaPuller reads, both through UcxWorker's thread). The owning broker registers a buffer with UCX once (UcxRegion)
// and gives a peer the region's address and packed remote key over the control channel;
// the peer connects to the owner's worker (UcxEndpoint) and reads the bytes with gets, in
// chunks with several in flight (UcxEndpoint::Read). Gets, not puts: UCX emulates puts over
// TCP in software, about 20 MB/s here against some 450 MB/s for gets.
//
// Over TCP the owner's worker serves the gets, so the owner must call Progress() while
// peers read (a thread of its own). Debian's UCX 1.13 has TCP and verbs and no CUDA
// transports. Between network namespaces of one machine UCX prefers shared memory unless
// UCX_TLS says otherwise (UCX_TLS=tcp to exercise the network path).
//
// Threads: a UcxNode's worker is driven by one thread at a time; regions may be registered
// and endpoints used from the thread that drives their node. Every handle is released by
// its owner's destructor; an endpoint outlives neither its node nor the regions it reads into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ucp/api/ucp.h"

namespace tensord::server::cluster {

// One UCP context (transports, memory registration) with its worker.
class UcxNode {
 public:
  static absl::StatusOr<std::unique_ptr<UcxNode>> Create();
  ~UcxNode();
  UcxNode(const UcxNode&) = delete;
  UcxNode& operator=(const UcxNode&) = delete;

  // The worker's address, for a peer's UcxEndpoint::Connect (opaque bytes).
  const std::string& address() const { return address_; }
  // Runs pending communication once; true when something was done.
  bool Progress();
  // A file descriptor that turns readable when the worker has work (UCP_FEATURE_WAKEUP),
  // once Arm() said it may sleep.
  int event_fd() const { return event_fd_; }
  // Before sleeping on event_fd(): false when events are pending already (progress again).
  bool Arm();

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }

 private:
  UcxNode() = default;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;  // the worker's; closed with it
  std::string address_;
};

// Memory registered with UCX once, readable by any peer that holds its packed key.
class UcxRegion {
 public:
  static absl::StatusOr<std::unique_ptr<UcxRegion>> Register(UcxNode& node, void* base, size_t size);
  ~UcxRegion();
  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;

  uint64_t address() const { return reinterpret_cast<uint64_t>(base_); }
  size_t size() const { return size_; }
  // What a peer needs to read it (with address() and size()).
  const std::string& packed_key() const { return packed_key_; }

 private:
  UcxRegion(UcxNode& node, void* base, size_t size) : node_(node), base_(base), size_(size) {}
  UcxNode& node_;
  void* base_;
  size_t size_;
  ucp_mem_h memory_ = nullptr;
  std::string packed_key_;
};

// A connection to another node's worker, for reading its regions.
class UcxEndpoint {
 public:
  struct ReadOptions {
    size_t chunk_bytes = 4 << 20;
    int in_flight = 4;
    absl::Duration timeout = absl::Seconds(30);
  };

  static absl::StatusOr<std::unique_ptr<UcxEndpoint>> Connect(UcxNode& node, std::string_view peer_address,
                                                              std::string peer_name);
  ~UcxEndpoint();
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  // Reads size bytes at remote_address of the peer's region (its packed key) into local.
  // UNAVAILABLE naming the peer when it fails or goes away, DEADLINE_EXCEEDED after the
  // timeout; either way no get is left running into local when this returns, and the
  // endpoint is broken for good (connect again).
  absl::Status Read(void* local, size_t size, uint64_t remote_address, std::string_view packed_key,
                    const ReadOptions& options);
  absl::Status Read(void* local, size_t size, uint64_t remote_address, std::string_view packed_key) {
    return Read(local, size, remote_address, packed_key, ReadOptions{});
  }

 private:
  UcxEndpoint(UcxNode& node, std::string peer_name) : node_(node), peer_name_(std::move(peer_name)) {}
  static void OnError(void* self, ucp_ep_h ep, ucs_status_t status);
  // Closes the endpoint (forcibly when broken) and progresses until the close completes.
  void Close();

  UcxNode& node_;
  const std::string peer_name_;
  ucp_ep_h endpoint_ = nullptr;
  ucs_status_t error_ = UCS_OK;
};

}  // namespace tensord::server::cluster
