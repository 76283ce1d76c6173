// A tensor in memory its producer owns (BackendBuffer::OwnedByProducer: legacy CUDA IPC)
// retires when the producer's session closes; one in memory the broker's buffer owns does
// not. The device backend here is a stand-in that adopts any handle bytes.
#include <unistd.h>

#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/memory/host/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/broker/broker.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server::testing {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

// Adopted handle bytes; the memory is the producer's when `owned_by_producer`.
class AdoptedBuffer final : public common::BackendBuffer {
 public:
  AdoptedBuffer(std::string data, uint64_t size, bool owned_by_producer)
      : data_(std::move(data)), size_(size), owned_by_producer_(owned_by_producer) {}
  uint64_t size() const override { return size_; }
  absl::StatusOr<common::MemoryHandle> Export() const override {
    common::MemoryHandle handle;
    handle.data = data_;
    return handle;
  }
  absl::Status CheckShareable(const std::string&) const override { return absl::OkStatus(); }
  bool OwnedByProducer() const override { return owned_by_producer_; }

 private:
  const std::string data_;
  const uint64_t size_;
  const bool owned_by_producer_;
};

// One GPU that adopts whatever handle bytes a producer sends.
class OneGpu final : public common::MemoryBackend {
 public:
  explicit OneGpu(bool owned_by_producer) : owned_by_producer_(owned_by_producer) {}
  std::string_view name() const override { return "cuda"; }
  v1::DeviceType device_type() const override { return v1::DEVICE_TYPE_CUDA; }
  std::string unavailable_reason() const override { return ""; }
  std::vector<common::BackendDevice> devices() const override {
    common::BackendDevice d;
    d.device.set_type(v1::DEVICE_TYPE_CUDA);
    d.device.set_index(0);
    d.device.set_uuid(std::string(16, '\x42'));
    d.name = "Test GPU";
    d.total_bytes = uint64_t{1} << 30;
    return {d};
  }
  uint64_t RoundUp(const common::BackendDevice&, uint64_t size) const override { return size; }
  absl::StatusOr<std::unique_ptr<common::BackendBuffer>> Allocate(const common::BackendDevice&, uint64_t,
                                                                  const std::string&) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<std::unique_ptr<common::BackendBuffer>> Adopt(const common::BackendDevice&,
                                                               common::MemoryHandle handle, uint64_t size,
                                                               const std::string&) override {
    return std::make_unique<AdoptedBuffer>(std::move(handle.data), size, owned_by_producer_);
  }

 private:
  const bool owned_by_producer_;
};

// Records the watch events a watcher would stream.
class EventRecorder final : public WatchSink {
 public:
  bool Push(const v1::WatchEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
    return true;
  }
  void Close() override {}
  std::vector<v1::WatchEvent> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::vector<v1::WatchEvent> events_;
};

// Records what the broker pushes down one session's stream.
class PushRecorder final : public PushSink {
 public:
  bool Push(const v1::SessionResponse& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    pushes_.push_back(message);
    return true;
  }
  void Close() override {}
  // The (tensor id, buffer id) of each ExportReleased pushed so far.
  std::vector<std::pair<uint64_t, uint64_t>> released() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<uint64_t, uint64_t>> out;
    for (const v1::SessionResponse& push : pushes_) {
      if (push.has_export_released()) {
        out.emplace_back(push.export_released().tensor_id(), push.export_released().buffer_id());
      }
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<v1::SessionResponse> pushes_;
};

class ProducerMemoryTest : public BrokerTest {
 protected:
  void StartWithGpu(bool owned_by_producer) {
    broker_.reset();
    BrokerOptions options;
    options.max_host_bytes = 64 << 20;
    options.daemon_uid = getuid();
    std::vector<std::unique_ptr<common::MemoryBackend>> backends;
    backends.push_back(std::make_unique<common::HostBackend>());
    backends.push_back(std::make_unique<OneGpu>(owned_by_producer));
    broker_ = std::make_unique<Broker>(
        options, std::make_unique<BackendRegistry>(std::move(backends), std::vector<common::MissingBackend>{}));
  }

  // Exports float32[16] on the GPU, as a producer's client sends it, and publishes it.
  v1::AllocateResponse ExportAndPublish(uint64_t session, const std::string& name) {
    v1::ExportRequest request;
    request.set_ns(name.substr(0, name.find('/')));
    *request.mutable_desc() = Float32Request("", 16).desc();
    request.mutable_desc()->mutable_device()->set_type(v1::DEVICE_TYPE_CUDA);
    request.set_handle_data("the producer's handle");
    request.set_size(64);
    auto exported = broker_->Export(session, request);
    EXPECT_TRUE(exported.ok()) << exported.status();
    if (!exported.ok()) return {};
    EXPECT_TRUE(Publish(session, exported->tensor().tensor_id(), name).ok());
    return *exported;
  }

  absl::StatusOr<v1::AcquireResponse> AcquireId(uint64_t session, uint64_t tensor_id) {
    v1::AcquireRequest request;
    request.set_tensor_id(tensor_id);
    std::promise<absl::StatusOr<v1::AcquireResponse>> promise;
    broker_->Acquire(session, request, [&](absl::StatusOr<v1::AcquireResponse> r) { promise.set_value(std::move(r)); });
    return promise.get_future().get();
  }

  std::shared_ptr<PushRecorder> Attach(uint64_t session) {
    auto recorder = std::make_shared<PushRecorder>();
    EXPECT_TRUE(broker_->AttachSink(session, recorder).ok());
    return recorder;
  }

  absl::StatusOr<std::vector<Broker::FetchedHandle>> Fetch(uint64_t session, uint64_t buffer_id) {
    v1::FetchFd fetch;
    fetch.add_buffer_ids(buffer_id);
    return broker_->FetchHandles(session, fetch);
  }
};

TEST_F(ProducerMemoryTest, ItsProducerExitingRetiresATensorInMemoryTheProducerOwned) {
  StartWithGpu(/*owned_by_producer=*/true);
  const uint64_t producer = Open();
  const uint64_t reader = Open();
  const uint64_t late = Open();
  auto watched = std::make_shared<EventRecorder>();
  v1::WatchRequest watch;
  watch.set_prefix("gpu/");
  ASSERT_TRUE(broker_->AddWatcher(late, watch, watched).ok());

  const v1::AllocateResponse exported = ExportAndPublish(producer, "gpu/t");
  const uint64_t tensor_id = exported.tensor().tensor_id();
  const uint64_t buffer_id = exported.tensor().buffer().buffer_id();
  auto held = Acquire(reader, "gpu/t");
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(AcquireId(late, tensor_id).ok());  // while the producer lives

  broker_->CloseSession(producer);

  EXPECT_EQ(Acquire(late, "gpu/t").status().code(), absl::StatusCode::kNotFound);
  auto by_id = AcquireId(late, tensor_id);
  EXPECT_EQ(by_id.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(by_id.status().message(),
              AllOf(HasSubstr("tensor " + std::to_string(tensor_id) + ": its producer (pid " +
                              std::to_string(getpid()) + ", session " + std::to_string(producer) + ") exited"),
                    HasSubstr("its memory was the producer's")));
  // A reader that has not mapped it yet cannot fetch it any more.
  auto fetched = Fetch(reader, buffer_id);
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fetched.status().message(), HasSubstr("exited"));
  // Watchers hear the name go, as for a Delete.
  std::vector<v1::WatchEvent> events = watched->events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind(), v1::WatchEvent::KIND_UNBOUND);
  EXPECT_EQ(events.back().name(), "gpu/t");
  // Leases held stay until released; then the tensor is gone.
  v1::StatRequest stat;
  stat.set_tensor_id(tensor_id);
  auto described = broker_->Stat(reader, stat);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->tensor().state(), v1::TENSOR_STATE_RETIRED);
  v1::ReleaseRequest release;
  release.add_lease_ids(held->lease_id());
  auto released = broker_->Release(reader, release);
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->released(), 1u);
  EXPECT_EQ(broker_->GetStatus().tensors(), 1u);  // the one `late` still holds
  broker_->CloseSession(late);
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
  EXPECT_EQ(AcquireId(reader, tensor_id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ProducerMemoryTest, AnUnnamedTensorInTheProducersMemoryRetiresToo) {
  StartWithGpu(/*owned_by_producer=*/true);
  const uint64_t producer = Open();
  const uint64_t reader = Open();
  const v1::AllocateResponse exported = ExportAndPublish(producer, "");
  const uint64_t tensor_id = exported.tensor().tensor_id();
  auto held = AcquireId(reader, tensor_id);
  ASSERT_TRUE(held.ok()) << held.status();
  broker_->CloseSession(producer);
  EXPECT_EQ(AcquireId(reader, tensor_id).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::StatRequest stat;
  stat.set_tensor_id(tensor_id);
  EXPECT_EQ(broker_->Stat(reader, stat)->tensor().state(), v1::TENSOR_STATE_RETIRED);
}

TEST_F(ProducerMemoryTest, MemoryTheBufferOwnsOutlivesItsProducer) {
  StartWithGpu(/*owned_by_producer=*/false);
  const uint64_t producer = Open();
  const uint64_t reader = Open();
  const v1::AllocateResponse exported = ExportAndPublish(producer, "gpu/t");
  broker_->CloseSession(producer);
  auto acquired = Acquire(reader, "gpu/t");
  ASSERT_TRUE(acquired.ok()) << acquired.status();
  EXPECT_TRUE(AcquireId(reader, exported.tensor().tensor_id()).ok());
  EXPECT_TRUE(Fetch(reader, exported.tensor().buffer().buffer_id()).ok());
}

// A producer that lets its export go before it exits leaves nothing behind to retire.
TEST_F(ProducerMemoryTest, ATensorDroppedBeforeItsProducerExitsIsForgotten) {
  StartWithGpu(/*owned_by_producer=*/true);
  const uint64_t producer = Open();
  const v1::AllocateResponse exported = ExportAndPublish(producer, "gpu/t");
  v1::DeleteRequest remove;
  remove.set_name("gpu/t");
  ASSERT_TRUE(broker_->Delete(producer, remove).ok());
  v1::ReleaseRequest release;
  release.add_lease_ids(exported.lease_id());
  ASSERT_TRUE(broker_->Release(producer, release).ok());
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
  // A second export gets a new buffer; closing retires only what is left (nothing stale
  // is looked up: a stale buffer id would CHECK-fail).
  ExportAndPublish(producer, "gpu/u");
  broker_->CloseSession(producer);
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
}

// The producer's client keeps the memory until it hears ExportReleased: exactly when the
// tensor is unbound and the last lease (a consumer's here) is gone, and only to it.
TEST_F(ProducerMemoryTest, TheProducerHearsExportReleasedWhenTheLastLeaseOnItsUnboundExportGoes) {
  StartWithGpu(/*owned_by_producer=*/true);
  const uint64_t producer = Open();
  const uint64_t reader = Open();
  auto producer_pushes = Attach(producer);
  auto reader_pushes = Attach(reader);
  const v1::AllocateResponse exported = ExportAndPublish(producer, "gpu/t");
  const uint64_t tensor_id = exported.tensor().tensor_id();
  const uint64_t buffer_id = exported.tensor().buffer().buffer_id();
  auto held = Acquire(reader, "gpu/t");
  ASSERT_TRUE(held.ok()) << held.status();

  Release(producer, exported.lease_id());  // bound, and the reader's lease remains
  EXPECT_THAT(producer_pushes->released(), IsEmpty());
  Delete(reader, "gpu/t");  // unbound; the reader's lease remains
  EXPECT_THAT(producer_pushes->released(), IsEmpty());
  Release(reader, held->lease_id());
  EXPECT_THAT(producer_pushes->released(), ElementsAre(Pair(tensor_id, buffer_id)));
  EXPECT_THAT(reader_pushes->released(), IsEmpty());
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
}

TEST_F(ProducerMemoryTest, ABoundExportIsNotReleasedEvenWithNoLeaseLeft) {
  StartWithGpu(/*owned_by_producer=*/true);
  const uint64_t producer = Open();
  auto pushes = Attach(producer);
  const v1::AllocateResponse exported = ExportAndPublish(producer, "gpu/t");
  Release(producer, exported.lease_id());
  EXPECT_THAT(pushes->released(), IsEmpty());  // the name holds it
  EXPECT_EQ(broker_->GetStatus().tensors(), 1u);
  Delete(producer, "gpu/t");
  EXPECT_THAT(pushes->released(),
              ElementsAre(Pair(exported.tensor().tensor_id(), exported.tensor().buffer().buffer_id())));

  // Unnamed, only the producer's own lease holds it.
  const v1::AllocateResponse unnamed = ExportAndPublish(producer, "");
  EXPECT_EQ(pushes->released().size(), 1u);
  Release(producer, unnamed.lease_id());
  ASSERT_EQ(pushes->released().size(), 2u);
  EXPECT_EQ(pushes->released()[1], std::make_pair(unnamed.tensor().tensor_id(), unnamed.tensor().buffer().buffer_id()));
}

TEST_F(ProducerMemoryTest, MemoryTheBufferOwnsIsFreedWithoutTellingItsProducer) {
  StartWithGpu(/*owned_by_producer=*/false);
  const uint64_t producer = Open();
  auto pushes = Attach(producer);
  const v1::AllocateResponse exported = ExportAndPublish(producer, "gpu/t");
  Release(producer, exported.lease_id());
  Delete(producer, "gpu/t");
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
  EXPECT_THAT(pushes->released(), IsEmpty());
  // Nor does host memory the broker allocated.
  PublishNew(producer, "host/t");
  Delete(producer, "host/t");
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
  EXPECT_THAT(pushes->released(), IsEmpty());
}

// A push with no stream attached is lost; the session's next stream must start with a
// cache_reset, which is how its client learns to ask again.
TEST_F(ProducerMemoryTest, AnExportReleasedWithNoStreamAttachedOwesTheNextStreamAReset) {
  StartWithGpu(/*owned_by_producer=*/true);
  const uint64_t producer = Open();
  const uint64_t idle = Open();  // the same calls, no release: owes nothing
  const v1::AllocateResponse exported = ExportAndPublish(producer, "");
  ExportAndPublish(idle, "");
  Release(producer, exported.lease_id());
  absl::StatusOr<bool> idle_owed = broker_->AttachSink(idle, std::make_shared<PushRecorder>());
  ASSERT_TRUE(idle_owed.ok()) << idle_owed.status();
  EXPECT_FALSE(*idle_owed);
  auto next = std::make_shared<PushRecorder>();
  absl::StatusOr<bool> owed = broker_->AttachSink(producer, next);
  ASSERT_TRUE(owed.ok()) << owed.status();
  EXPECT_TRUE(*owed);
  EXPECT_THAT(next->released(), IsEmpty());
}

// A producer whose session closed has nobody to tell: its export retired, and when the
// last consumer lets go nothing is pushed anywhere.
TEST_F(ProducerMemoryTest, NoExportReleasedReachesAnyoneOnceTheProducerClosed) {
  StartWithGpu(/*owned_by_producer=*/true);
  const uint64_t producer = Open();
  const uint64_t reader = Open();
  auto producer_pushes = Attach(producer);
  auto reader_pushes = Attach(reader);
  ExportAndPublish(producer, "gpu/t");
  auto held = Acquire(reader, "gpu/t");
  ASSERT_TRUE(held.ok()) << held.status();
  broker_->CloseSession(producer);
  Release(reader, held->lease_id());
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
  EXPECT_THAT(producer_pushes->released(), IsEmpty());
  EXPECT_THAT(reader_pushes->released(), IsEmpty());
}

}  // namespace
}  // namespace tensord::server::testing
