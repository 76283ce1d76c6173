// BrokerTest: a Broker in-process (host backend, 64 MiB quota, namespace "shared" readable
// by uid 4242) with helpers that do what a client does: open sessions, allocate, seal,
// publish, acquire.
#pragma once

#include <unistd.h>

#include <future>
#include <memory>
#include <string>

#include "common/memory/host/host_backend.h"
#include "common/memory/host/memfd.h"
#include "gtest/gtest.h"
#include "server/broker/broker.h"

namespace tensord::server::testing {

namespace v1 = tensord::v1;

class BrokerTest : public ::testing::Test {
 protected:
  BrokerTest() { Start([](BrokerOptions&) {}); }

  // (Re)creates the broker with the fixture's options as changed by `adjust`.
  template <typename Adjust>
  void Start(Adjust adjust) {
    broker_.reset();
    BrokerOptions options;
    options.max_host_bytes = 64 << 20;
    options.daemon_uid = getuid();
    options.acls["shared"].read_uids = {4242};
    adjust(options);
    broker_ = std::make_unique<Broker>(options, HostOnlyBackends());
  }

  uint64_t Open(uid_t uid = getuid()) {
    common::PeerCredentials creds{uid, getgid(), getpid()};
    auto welcome = broker_->OpenSession(creds, "test");
    EXPECT_TRUE(welcome.ok());
    return welcome->session_id();
  }

  // A host float32[count] in `ns`.
  static v1::AllocateRequest Float32Request(const std::string& ns, int64_t count) {
    v1::AllocateRequest request;
    request.set_ns(ns);
    v1::TensorDesc* desc = request.mutable_desc();
    desc->mutable_dtype()->set_code(v1::DTYPE_CODE_FLOAT);
    desc->mutable_dtype()->set_bits(32);
    desc->mutable_dtype()->set_lanes(1);
    desc->add_shape(count);
    desc->mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
    return request;
  }

  absl::StatusOr<v1::AllocateResponse> Allocate(uint64_t session, const std::string& ns, int64_t count) {
    return Allocate(session, Float32Request(ns, count));
  }

  absl::StatusOr<v1::AllocateResponse> Allocate(uint64_t session, const v1::AllocateRequest& request) {
    std::promise<absl::StatusOr<v1::AllocateResponse>> promise;
    broker_->Allocate(session, request, [&](absl::StatusOr<v1::AllocateResponse> r) { promise.set_value(std::move(r)); });
    return promise.get_future().get();
  }

  // What a producer's client does before publishing: map, fill, seal against writes.
  void Seal(uint64_t session, const v1::AllocateResponse& allocated) {
    v1::FetchFd fetch;
    fetch.add_buffer_ids(allocated.tensor().buffer().buffer_id());
    auto fds = broker_->FetchHandles(session, fetch);
    ASSERT_TRUE(fds.ok()) << fds.status();
    ASSERT_TRUE(common::SealFutureWrite((*fds)[0].handle.fds[0].get(), "test").ok());
  }

  absl::StatusOr<v1::PublishResponse> Publish(uint64_t session, uint64_t tensor_id, const std::string& name) {
    v1::PublishRequest request;
    request.set_tensor_id(tensor_id);
    request.set_name(name);
    return broker_->Publish(session, request);
  }

  absl::StatusOr<v1::AcquireResponse> Acquire(uint64_t session, const std::string& name, uint64_t timeout_ms = 0) {
    v1::AcquireRequest request;
    request.set_name(name);
    if (timeout_ms > 0) request.set_timeout_ms(timeout_ms);
    std::promise<absl::StatusOr<v1::AcquireResponse>> promise;
    broker_->Acquire(session, request, [&](absl::StatusOr<v1::AcquireResponse> r) { promise.set_value(std::move(r)); });
    return promise.get_future().get();
  }

  // Releases one lease the session holds (a failure fails the test).
  void Release(uint64_t session, uint64_t lease_id) {
    v1::ReleaseRequest release;
    release.add_lease_ids(lease_id);
    auto released = broker_->Release(session, release);
    ASSERT_TRUE(released.ok()) << released.status();
    EXPECT_EQ(released->released(), 1u);
  }

  // Unbinds `name` (a failure fails the test).
  void Delete(uint64_t session, const std::string& name) {
    v1::DeleteRequest remove;
    remove.set_name(name);
    ASSERT_TRUE(broker_->Delete(session, remove).ok());
  }

  uint64_t PublishNew(uint64_t session, const std::string& name) {
    auto allocated = Allocate(session, name.substr(0, name.find('/')), 16);
    EXPECT_TRUE(allocated.ok()) << allocated.status();
    Seal(session, *allocated);
    EXPECT_TRUE(Publish(session, allocated->tensor().tensor_id(), name).ok());
    v1::ReleaseRequest release;
    release.add_lease_ids(allocated->lease_id());
    EXPECT_TRUE(broker_->Release(session, release).ok());
    return allocated->tensor().tensor_id();
  }

  std::unique_ptr<Broker> broker_;
};

}  // namespace tensord::server::testing
