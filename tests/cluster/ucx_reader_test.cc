// UcxReader between two UCX nodes of one process over TCP on loopback (UCX_TLS=tcp, set
// before UCX reads its configuration): a 64 MiB region registered once is read back whole,
// in chunks with several gets in flight, and byte for byte equal; an owner that goes away
// mid-read fails the read with UNAVAILABLE naming it, and leaves no get running.
#include "server/cluster/ucx_reader.h"

#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tensord::server::cluster {
namespace {

class UcxReaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The network path, not shared memory: over TCP, on loopback.
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
  }

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<UcxNode>> owner = UcxNode::Create();
    ASSERT_TRUE(owner.ok()) << owner.status();
    owner_ = std::move(*owner);
    absl::StatusOr<std::unique_ptr<UcxNode>> reader = UcxNode::Create();
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = std::move(*reader);
  }

  void TearDown() override { StopOwner(); }

  // Over TCP the owner's worker serves the gets: it must be progressed meanwhile.
  void StartOwner() {
    serving_ = true;
    owner_thread_ = std::thread([this] {
      while (serving_) owner_->Progress();
    });
  }
  void StopOwner() {
    serving_ = false;
    if (owner_thread_.joinable()) owner_thread_.join();
  }

  std::unique_ptr<UcxNode> owner_;
  std::unique_ptr<UcxNode> reader_;
  std::atomic<bool> serving_{false};
  std::thread owner_thread_;
};

TEST_F(UcxReaderTest, ReadsARegionWholeInOverlappedChunks) {
  constexpr size_t kSize = 64 << 20;
  std::vector<uint32_t> source(kSize / 4);
  std::iota(source.begin(), source.end(), 0x1234u);
  absl::StatusOr<std::unique_ptr<UcxRegion>> region = UcxRegion::Register(*owner_, source.data(), kSize);
  ASSERT_TRUE(region.ok()) << region.status();
  StartOwner();

  absl::StatusOr<std::unique_ptr<UcxEndpoint>> endpoint =
      UcxEndpoint::Connect(*reader_, owner_->address(), "node a");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  std::vector<uint32_t> copy(kSize / 4, 0);
  const absl::Time start = absl::Now();
  absl::Status read = (*endpoint)->Read(copy.data(), kSize, (*region)->address(), (*region)->packed_key(),
                                        {.chunk_bytes = 4 << 20, .in_flight = 4});
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(std::memcmp(copy.data(), source.data(), kSize), 0);
  std::printf("ucx get over tcp on loopback: 64 MiB in %s (%.0f MB/s)\n", absl::FormatDuration(took).c_str(),
              kSize / absl::ToDoubleSeconds(took) / 1e6);

  // A part of the region, at an offset: the same bytes.
  std::vector<uint32_t> part(1000, 0);
  ASSERT_TRUE((*endpoint)
                  ->Read(part.data(), part.size() * 4, (*region)->address() + 4000, (*region)->packed_key(),
                         {.chunk_bytes = 1000})
                  .ok());
  EXPECT_EQ(std::memcmp(part.data(), source.data() + 1000, part.size() * 4), 0);
  endpoint->reset();
  StopOwner();
}

TEST_F(UcxReaderTest, AnOwnerThatGoesAwayFailsTheRead) {
  constexpr size_t kSize = 16 << 20;
  std::vector<char> source(kSize, 'x');
  absl::StatusOr<std::unique_ptr<UcxRegion>> region = UcxRegion::Register(*owner_, source.data(), kSize);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::string key = (*region)->packed_key();
  const uint64_t address = (*region)->address();
  StartOwner();
  absl::StatusOr<std::unique_ptr<UcxEndpoint>> endpoint =
      UcxEndpoint::Connect(*reader_, owner_->address(), "node a");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  std::vector<char> copy(kSize, 0);
  ASSERT_TRUE((*endpoint)->Read(copy.data(), kSize, address, key).ok());

  // The owner's node goes away (its worker and sockets with it), as a dead broker's would.
  StopOwner();
  region->reset();
  owner_.reset();
  absl::Status read = (*endpoint)->Read(copy.data(), kSize, address, key, {.timeout = absl::Seconds(20)});
  ASSERT_FALSE(read.ok());
  std::printf("the read from a node gone: %s\n", read.ToString().c_str());
  EXPECT_TRUE(read.code() == absl::StatusCode::kUnavailable || read.code() == absl::StatusCode::kDeadlineExceeded)
      << read;
  EXPECT_NE(read.message().find("node a"), std::string_view::npos) << read;
  // Broken for good: the next read says so at once.
  absl::Status again = (*endpoint)->Read(copy.data(), 16, address, key);
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
}

}  // namespace
}  // namespace tensord::server::cluster
