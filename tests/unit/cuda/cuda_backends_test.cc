// The registry of backends and importers (common/memory/backends.cc) in a build with cuda.
#include "common/memory/backends.h"

#include "gtest/gtest.h"
#include "tests/unit/cuda/fake_cuda_env.h"

namespace tensord::common {
namespace {

TEST(CudaBackendsTest, HostThenCuda) {
  auto backends = MakeBackends();
  ASSERT_GE(backends.size(), 2u);  // level_zero follows where it is built
  EXPECT_EQ(backends[0]->name(), "host");
  EXPECT_EQ(backends[1]->name(), "cuda");
  EXPECT_EQ(backends[1]->unavailable_reason(), "");  // the fake's two devices
  EXPECT_EQ(backends[1]->devices().size(), 2u);
}

TEST(CudaBackendsTest, ClientsImportCuda) {
  auto importer = ProcessImporters().For(tensord::v1::DEVICE_TYPE_CUDA);
  ASSERT_TRUE(importer.ok()) << importer.status();
  EXPECT_EQ((*importer)->device_type(), tensord::v1::DEVICE_TYPE_CUDA);
}

TEST(CudaBackendsTest, ClientsMakePinnedHostViews) {
  auto importer = ProcessImporters().For(tensord::v1::DEVICE_TYPE_CUDA_HOST);
  ASSERT_TRUE(importer.ok()) << importer.status();
  EXPECT_EQ((*importer)->device_type(), tensord::v1::DEVICE_TYPE_CUDA_HOST);
}

TEST(CudaBackendsTest, CudaIsNotMissing) {
  for (const MissingBackend& missing : MissingBackends()) EXPECT_NE(missing.name, "cuda");
}

}  // namespace
}  // namespace tensord::common
