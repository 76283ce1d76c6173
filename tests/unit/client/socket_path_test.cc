// Socket-path resolution, the daemon uid check, connection failures, and the consumer-side
// validation of broker descriptions: what the client can check without a daemon.
#include <stdlib.h>
#include <unistd.h>

#include "client/session_holder.h"
#include "client/fd_connection.h"
#include "client/tensor_convert.h"
#include "common/socket_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::internal {
namespace {

using common::testing::StatusIs;
using ::testing::HasSubstr;

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(SocketPathTest, AnExplicitPathWins) {
  ScopedEnv env("TENSORD_SOCKET", "/tmp/from-env.sock");
  ClientOptions options;
  options.socket_path = "/tmp/explicit.sock";
  EXPECT_EQ(ResolveSocketPath(options), "/tmp/explicit.sock");
}

TEST(SocketPathTest, TheEnvironmentComesNext) {
  ScopedEnv env("TENSORD_SOCKET", "/tmp/from-env.sock");
  EXPECT_EQ(ResolveSocketPath(ClientOptions{}), "/tmp/from-env.sock");
  EXPECT_EQ(tensord::DefaultClientSocketPath(), "/tmp/from-env.sock");
}

TEST(SocketPathTest, WithoutEitherTheSystemSocketIsTheFallback) {
  ScopedEnv env("TENSORD_SOCKET", nullptr);
  ScopedEnv xdg("XDG_RUNTIME_DIR", "/nonexistent-tensord-test");
  // No per-user socket exists there, so the system path is used.
  EXPECT_EQ(ResolveSocketPath(ClientOptions{}), "/run/tensord/tensord.sock");
  EXPECT_EQ(tensord::DefaultClientSocketPath(), common::DefaultClientSocketPath());
}

TEST(DaemonUidTest, RootOurselvesAndTrustedUidsAreAccepted) {
  const uint32_t trusted[] = {4242};
  EXPECT_TRUE(CheckDaemonUid(0, 1000, trusted, "/s").ok());
  EXPECT_TRUE(CheckDaemonUid(1000, 1000, trusted, "/s").ok());
  EXPECT_TRUE(CheckDaemonUid(4242, 1000, trusted, "/s").ok());
}

TEST(DaemonUidTest, AnyOtherUidIsPermissionDeniedNamingIt) {
  const uint32_t trusted[] = {4242};
  EXPECT_THAT(CheckDaemonUid(31337, 1000, trusted, "/run/t.sock.fd"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       ::testing::AllOf(HasSubstr("uid 31337"), HasSubstr("/run/t.sock.fd"))));
}

TEST(ConnectTest, NoBrokerIsUnavailableNamingThePath) {
  ClientOptions options;
  options.socket_path = "/tmp/tensord-client-test-" + std::to_string(::getpid()) + "/none.sock";
  auto client = Client::Connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("no tensord broker at " + options.socket_path));
  EXPECT_THAT(client.status().message(), HasSubstr("is the daemon running?"));
}

tensord::v1::TensorInfo GoodInfo() {
  tensord::v1::TensorInfo t;
  t.set_tensor_id(5);
  t.set_name("ns/x");
  t.set_generation(2);
  t.mutable_desc()->mutable_dtype()->set_code(tensord::v1::DTYPE_CODE_FLOAT);
  t.mutable_desc()->mutable_dtype()->set_bits(32);
  t.mutable_desc()->mutable_dtype()->set_lanes(1);
  t.mutable_desc()->add_shape(2);
  t.mutable_desc()->add_shape(3);
  t.mutable_desc()->mutable_device()->set_type(tensord::v1::DEVICE_TYPE_CPU);
  t.mutable_buffer()->set_buffer_id(7);
  t.mutable_buffer()->set_size(4096);
  t.mutable_buffer()->set_offset(128);
  t.set_nbytes(24);
  t.set_state(tensord::v1::TENSOR_STATE_SEALED);
  return t;
}

TEST(ValidateTensorInfoTest, AGoodDescriptionConvertsWithStridesFilledIn) {
  auto v = ValidateTensorInfo(GoodInfo(), "acquire 'ns/x'");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->info.tensor_id, 5u);
  EXPECT_EQ(v->info.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(v->info.strides, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(v->info.nbytes, 24u);
  EXPECT_EQ(v->info.dtype.code, kDLFloat);
  EXPECT_EQ(v->info.state, TensorState::kSealed);
  EXPECT_EQ(v->buffer_offset, 128u);
}

TEST(ValidateTensorInfoTest, ATensorReachingPastItsBufferIsRefused) {
  tensord::v1::TensorInfo t = GoodInfo();
  t.mutable_buffer()->set_offset(4090);
  EXPECT_THAT(ValidateTensorInfo(t, "acquire 'ns/x'"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("acquire 'ns/x'")));
}

TEST(ValidateTensorInfoTest, HostileDescriptionsAreRefused) {
  tensord::v1::TensorInfo neg = GoodInfo();
  neg.mutable_desc()->set_shape(0, -1);
  EXPECT_THAT(ValidateTensorInfo(neg, "t"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shape")));
  tensord::v1::TensorInfo huge = GoodInfo();
  huge.mutable_desc()->set_shape(0, int64_t{1} << 40);
  huge.mutable_desc()->set_shape(1, int64_t{1} << 40);
  EXPECT_FALSE(ValidateTensorInfo(huge, "t").ok());
  tensord::v1::TensorInfo no_buffer = GoodInfo();
  no_buffer.mutable_buffer()->set_buffer_id(0);
  EXPECT_THAT(ValidateTensorInfo(no_buffer, "t"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("no buffer")));
  tensord::v1::TensorInfo wrong_bytes = GoodInfo();
  wrong_bytes.set_nbytes(4000);
  EXPECT_FALSE(ValidateTensorInfo(wrong_bytes, "t").ok());
}

TEST(ValidateTensorInfoTest, AZeroByteTensorNeedsNoBuffer) {
  tensord::v1::TensorInfo t = GoodInfo();
  t.mutable_desc()->set_shape(0, 0);
  t.set_nbytes(0);
  t.mutable_buffer()->Clear();
  auto v = ValidateTensorInfo(t, "t");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->info.nbytes, 0u);
}

}  // namespace
}  // namespace tensord::internal
