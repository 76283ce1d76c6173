#include "common/memory/cuda/cuda_handle.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensord::common {
namespace {

using ::testing::HasSubstr;

std::string Uuid() { return std::string("0123456789abcdef", 16); }

CudaHandle Vmm() {
  CudaHandle h;
  h.kind = CudaHandleKind::kVmmFd;
  h.uuid = Uuid();
  h.size = 4u << 20;
  return h;
}

CudaHandle Legacy() {
  CudaHandle h;
  h.kind = CudaHandleKind::kLegacyIpc;
  h.uuid = Uuid();
  h.size = 8u << 20;
  h.offset = 4096;
  for (size_t i = 0; i < h.ipc_handle.size(); ++i) h.ipc_handle[i] = static_cast<uint8_t>(i * 7);
  return h;
}

void ExpectInvalid(const std::string& bytes, const std::string& why) {
  auto decoded = DecodeCudaHandle(bytes);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(), HasSubstr(why));
}

TEST(CudaHandleTest, VmmRoundTrips) {
  std::string bytes = EncodeCudaHandle(Vmm());
  ASSERT_EQ(bytes.size(), kCudaVmmHandleBytes);
  EXPECT_EQ(bytes.substr(0, 4), "TDCU");
  auto decoded = DecodeCudaHandle(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->kind, CudaHandleKind::kVmmFd);
  EXPECT_EQ(decoded->uuid, Uuid());
  EXPECT_EQ(decoded->size, 4u << 20);
  EXPECT_EQ(decoded->offset, 0u);
}

TEST(CudaHandleTest, LegacyIpcRoundTrips) {
  CudaHandle in = Legacy();
  std::string bytes = EncodeCudaHandle(in);
  ASSERT_EQ(bytes.size(), kCudaLegacyIpcHandleBytes);
  auto decoded = DecodeCudaHandle(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->kind, CudaHandleKind::kLegacyIpc);
  EXPECT_EQ(decoded->uuid, Uuid());
  EXPECT_EQ(decoded->size, in.size);
  EXPECT_EQ(decoded->offset, in.offset);
  EXPECT_EQ(decoded->ipc_handle, in.ipc_handle);
}

TEST(CudaHandleTest, LayoutIsLittleEndianAndFixed) {
  std::string bytes = EncodeCudaHandle(Legacy());
  EXPECT_EQ(static_cast<uint8_t>(bytes[4]), 1);  // version
  EXPECT_EQ(static_cast<uint8_t>(bytes[5]), 0);
  EXPECT_EQ(static_cast<uint8_t>(bytes[6]), 2);  // kind
  EXPECT_EQ(bytes.substr(8, 16), Uuid());
  EXPECT_EQ(static_cast<uint8_t>(bytes[24 + 2]), 0x80);  // 8 MiB = 0x800000
  EXPECT_EQ(static_cast<uint8_t>(bytes[32 + 1]), 0x10);  // offset 4096 = 0x1000
  EXPECT_EQ(static_cast<uint8_t>(bytes[40 + 1]), 7);
}

TEST(CudaHandleTest, RejectsShortInput) {
  ExpectInvalid("", "0 bytes, too short");
  ExpectInvalid("TDCU\x01", "5 bytes, too short");
}

TEST(CudaHandleTest, RejectsWrongMagic) {
  std::string bytes = EncodeCudaHandle(Vmm());
  bytes[0] = 'X';
  ExpectInvalid(bytes, "wrong magic");
}

TEST(CudaHandleTest, RejectsOtherVersions) {
  std::string bytes = EncodeCudaHandle(Vmm());
  bytes[4] = 2;
  ExpectInvalid(bytes, "version 2, this build reads version 1");
}

TEST(CudaHandleTest, RejectsUnknownKind) {
  std::string bytes = EncodeCudaHandle(Vmm());
  bytes[6] = 3;
  ExpectInvalid(bytes, "unknown kind 3");
  bytes[6] = 0;
  ExpectInvalid(bytes, "unknown kind 0");
}

TEST(CudaHandleTest, RejectsWrongLengthForKind) {
  std::string vmm = EncodeCudaHandle(Vmm());
  ExpectInvalid(vmm.substr(0, 31), "31 bytes for a VMM fd handle, expected 32");
  ExpectInvalid(vmm + "x", "33 bytes for a VMM fd handle, expected 32");
  std::string legacy = EncodeCudaHandle(Legacy());
  ExpectInvalid(legacy.substr(0, 103), "103 bytes for a legacy IPC handle, expected 104");
  // A VMM header claiming legacy IPC (and the reverse) is the wrong length.
  vmm[6] = 2;
  ExpectInvalid(vmm, "32 bytes for a legacy IPC handle, expected 104");
  legacy[6] = 1;
  ExpectInvalid(legacy, "104 bytes for a VMM fd handle, expected 32");
}

TEST(CudaHandleTest, RejectsZeroSize) {
  CudaHandle h = Vmm();
  h.size = 0;
  ExpectInvalid(EncodeCudaHandle(h), "allocation size is 0");
}

TEST(CudaHandleTest, RejectsOffsetOutsideTheAllocation) {
  CudaHandle h = Legacy();
  h.offset = h.size;
  ExpectInvalid(EncodeCudaHandle(h), "offset 8388608 is outside the allocation of 8388608 bytes");
}

TEST(CudaHandleTest, ErrorsNeverContainTheHandleBytes) {
  CudaHandle h = Legacy();
  h.offset = h.size + 1;
  auto decoded = DecodeCudaHandle(EncodeCudaHandle(h));
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(std::string(decoded.status().message()), ::testing::Not(HasSubstr(Uuid())));
}

TEST(CudaEventFenceTest, RoundTripsWithAFixedLayout) {
  CudaEventFence fence;
  fence.uuid = Uuid();
  for (size_t i = 0; i < fence.ipc_event.size(); ++i) fence.ipc_event[i] = static_cast<uint8_t>(200 - i);
  const std::string bytes = EncodeCudaEventFence(fence);
  ASSERT_EQ(bytes.size(), kCudaEventFenceBytes);
  EXPECT_EQ(bytes.substr(0, 8), std::string("TDCE\x01\x00\x00\x00", 8));
  EXPECT_EQ(bytes.substr(8, 16), Uuid());
  auto decoded = DecodeCudaEventFence(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->uuid, Uuid());
  EXPECT_EQ(decoded->ipc_event, fence.ipc_event);
}

TEST(CudaEventFenceTest, RejectsWhatIsNotAFence) {
  CudaEventFence fence;
  fence.uuid = Uuid();
  const std::string good = EncodeCudaEventFence(fence);
  EXPECT_THAT(DecodeCudaEventFence(good.substr(1)).status().message(), ::testing::HasSubstr("87 bytes, expected 88"));
  std::string magic = good;
  magic[3] = 'U';  // a memory handle's magic
  EXPECT_THAT(DecodeCudaEventFence(magic).status().message(), ::testing::HasSubstr("wrong magic"));
  std::string version = good;
  version[4] = 2;
  EXPECT_THAT(DecodeCudaEventFence(version).status().message(), ::testing::HasSubstr("version 2"));
  std::string reserved = good;
  reserved[6] = 1;
  EXPECT_THAT(DecodeCudaEventFence(reserved).status().message(), ::testing::HasSubstr("reserved"));
  EXPECT_EQ(DecodeCudaEventFence(magic).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tensord::common
