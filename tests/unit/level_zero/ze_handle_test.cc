#include "common/memory/level_zero/ze_handle.h"

#include "common/memory/device_names.h"
#include "common/memory/level_zero/ze_loader.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensord::common {
namespace {

using ::testing::HasSubstr;

std::string Uuid() { return std::string("fedcba9876543210", 16); }

ZeHandle Allocation() {
  ZeHandle h;
  h.kind = ZeHandleKind::kDaemonAllocation;
  h.uuid = Uuid();
  h.size = 1u << 20;
  for (size_t i = 8; i < h.memory.size(); ++i) h.memory[i] = static_cast<uint8_t>(i * 3);
  h.has_event_pool = true;
  h.event_count = 1;
  for (size_t i = 8; i < h.event_pool.size(); ++i) h.event_pool[i] = static_cast<uint8_t>(i * 5);
  return h;
}

void ExpectInvalid(const std::string& bytes, const std::string& why) {
  auto decoded = DecodeZeHandle(bytes);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(), HasSubstr(why));
}

TEST(ZeHandleTest, ADaemonAllocationWithItsPoolRoundTrips) {
  const ZeHandle in = Allocation();
  const std::string bytes = EncodeZeHandle(in);
  ASSERT_EQ(bytes.size(), kZeHandleBytes);
  EXPECT_EQ(bytes.substr(0, 4), "TDZE");
  auto decoded = DecodeZeHandle(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->kind, ZeHandleKind::kDaemonAllocation);
  EXPECT_EQ(decoded->uuid, Uuid());
  EXPECT_EQ(decoded->size, in.size);
  EXPECT_EQ(decoded->offset, 0u);
  EXPECT_EQ(decoded->memory, in.memory);
  EXPECT_TRUE(decoded->has_event_pool);
  EXPECT_EQ(decoded->event_count, 1u);
  EXPECT_EQ(decoded->event_pool, in.event_pool);
  EXPECT_EQ(decoded->fd_count(), 2u);
}

TEST(ZeHandleTest, AProducerExportHasNoPoolAndOneFd) {
  ZeHandle in = Allocation();
  in.kind = ZeHandleKind::kProducerExport;
  in.offset = 4096;
  in.has_event_pool = false;
  in.event_count = 0;
  auto decoded = DecodeZeHandle(EncodeZeHandle(in));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->kind, ZeHandleKind::kProducerExport);
  EXPECT_EQ(decoded->offset, 4096u);
  EXPECT_FALSE(decoded->has_event_pool);
  EXPECT_EQ(decoded->fd_count(), 1u);
}

TEST(ZeHandleTest, DecodingIsStrict) {
  const std::string good = EncodeZeHandle(Allocation());
  ExpectInvalid(good.substr(0, 100), "100 bytes, not 176");
  ExpectInvalid(good + "x", "177 bytes");
  std::string bad = good;
  bad[0] = 'X';
  ExpectInvalid(bad, "wrong magic");
  bad = good;
  bad[4] = 2;
  ExpectInvalid(bad, "version 2");
  bad = good;
  bad[6] = 9;
  ExpectInvalid(bad, "unknown kind 9");
  bad = good;
  for (int i = 24; i < 32; ++i) bad[static_cast<size_t>(i)] = 0;
  ExpectInvalid(bad, "allocation of 0 bytes");
  bad = good;
  bad[32 + 2] = 0x10;  // offset 1 MiB: at the end of the 1 MiB allocation
  ExpectInvalid(bad, "outside the allocation");
  bad = good;
  bad[104] = 4;
  ExpectInvalid(bad, "unknown flags");
  bad = good;
  bad[108] = 0;  // a pool flagged with no events
  ExpectInvalid(bad, "with 0 events");
}

TEST(ZeHandleTest, ReadyFencesRoundTripAndAnythingElseIsRefused) {
  const std::string bytes = EncodeZeReadyFence(ZeReadyFence{Uuid(), 0});
  ASSERT_EQ(bytes.size(), kZeReadyFenceBytes);
  auto decoded = DecodeZeReadyFence(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->uuid, Uuid());
  EXPECT_EQ(decoded->event_index, 0u);
  // A CUDA fence (88 bytes, "TDCE") or a damaged one is not a level_zero fence.
  EXPECT_EQ(DecodeZeReadyFence(std::string(88, 'a')).status().code(), absl::StatusCode::kInvalidArgument);
  std::string bad = bytes;
  bad[2] = 'C';
  EXPECT_THAT(DecodeZeReadyFence(bad).status().message(), HasSubstr("level_zero ready fence: 32 bytes"));
}

TEST(ZeHandleTest, TheFdSitsInTheFirstBytesWhereIntelsDriverPutsIt) {
  std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> bytes{};
  bytes.fill(0xee);
  SetIpcFd(bytes, 1234);
  EXPECT_EQ(IpcFd(bytes), 1234);
  EXPECT_EQ(bytes[0], 1234 & 0xff);
  EXPECT_EQ(bytes[1], 1234 >> 8);
  for (size_t i = 2; i < 8; ++i) EXPECT_EQ(bytes[i], 0) << i;
  EXPECT_EQ(bytes[8], 0xee);  // the driver's own bytes are untouched
}

}  // namespace
}  // namespace tensord::common

namespace tensord::common {
namespace {

TEST(ZeHandleTest, MessagesSpellAUuidAsStatusAndQuotasDo) {
  const std::string uuid("\x01\x23\x45\x67\x89\xab\xcd\xef\x10\x32\x54\x76\x98\xba\xdc\xfe", 16);
  EXPECT_EQ(FormatZeUuid(uuid), "01234567-89ab-cdef-1032-547698badcfe");
  EXPECT_EQ(FormatZeUuid(uuid), FormatDeviceUuid(tensord::v1::DEVICE_TYPE_ONEAPI, uuid));
}

}  // namespace
}  // namespace tensord::common
