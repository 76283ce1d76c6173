#include "common/memory/level_zero/ze_handle.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/memory/handle_bytes.h"

namespace tensord::common {
namespace {

constexpr char kMagic[4] = {'T', 'D', 'Z', 'E'};
constexpr char kFenceMagic[4] = {'T', 'D', 'Z', 'F'};
constexpr uint16_t kFenceVersion = 1;
constexpr uint32_t kFlagEventPool = 1;

using handle_bytes::GetLe;
using handle_bytes::PutLe;

template <size_t N>
void PutBytes(std::string& out, const std::array<uint8_t, N>& bytes) {
  out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

template <size_t N>
void GetBytes(std::string_view in, size_t at, std::array<uint8_t, N>& bytes) {
  for (size_t i = 0; i < N; ++i) bytes[i] = static_cast<uint8_t>(in[at + i]);
}

absl::Status Bad(const std::string& why) { return absl::InvalidArgumentError(absl::StrCat("level_zero handle: ", why)); }

}  // namespace

const char* ZeHandleKindName(ZeHandleKind kind) {
  switch (kind) {
    case ZeHandleKind::kDaemonAllocation:
      return "daemon allocation";
    case ZeHandleKind::kProducerExport:
      return "producer export";
  }
  return "unknown";
}

std::string EncodeZeHandle(const ZeHandle& handle) {
  TENSORD_CHECK(handle.uuid.size() == kZeUuidBytes);
  std::string out;
  out.reserve(kZeHandleBytes);
  out.append(kMagic, sizeof(kMagic));
  PutLe(out, kZeHandleVersion, 2);
  PutLe(out, static_cast<uint16_t>(handle.kind), 2);
  out.append(handle.uuid);
  PutLe(out, handle.size, 8);
  PutLe(out, handle.offset, 8);
  PutBytes(out, handle.memory);
  PutLe(out, handle.has_event_pool ? kFlagEventPool : 0, 4);
  PutLe(out, handle.has_event_pool ? handle.event_count : 0, 4);
  if (handle.has_event_pool) {
    PutBytes(out, handle.event_pool);
  } else {
    out.append(ZE_MAX_IPC_HANDLE_SIZE, '\0');
  }
  TENSORD_CHECK(out.size() == kZeHandleBytes);
  return out;
}

absl::StatusOr<ZeHandle> DecodeZeHandle(std::string_view data) {
  if (data.size() != kZeHandleBytes) {
    return Bad(absl::StrCat(data.size(), " bytes, not ", kZeHandleBytes));
  }
  if (data.substr(0, 4) != std::string_view(kMagic, 4)) return Bad("wrong magic (not a level_zero handle)");
  if (const uint64_t version = GetLe(data, 4, 2); version != kZeHandleVersion) {
    return Bad(absl::StrCat("version ", version, "; this tensord reads version ", kZeHandleVersion));
  }
  ZeHandle handle;
  const uint64_t kind = GetLe(data, 6, 2);
  if (kind != static_cast<uint16_t>(ZeHandleKind::kDaemonAllocation) &&
      kind != static_cast<uint16_t>(ZeHandleKind::kProducerExport)) {
    return Bad(absl::StrCat("unknown kind ", kind));
  }
  handle.kind = static_cast<ZeHandleKind>(kind);
  handle.uuid = std::string(data.substr(8, kZeUuidBytes));
  handle.size = GetLe(data, 24, 8);
  handle.offset = GetLe(data, 32, 8);
  if (handle.size == 0) return Bad("an allocation of 0 bytes");
  if (handle.offset >= handle.size) {
    return Bad(absl::StrCat("offset ", handle.offset, " is outside the allocation of ", handle.size, " bytes"));
  }
  GetBytes(data, 40, handle.memory);
  const uint64_t flags = GetLe(data, 104, 4);
  if ((flags & ~uint64_t{kFlagEventPool}) != 0) return Bad(absl::StrCat("unknown flags 0x", absl::Hex(flags)));
  handle.has_event_pool = (flags & kFlagEventPool) != 0;
  handle.event_count = static_cast<uint32_t>(GetLe(data, 108, 4));
  if (handle.has_event_pool != (handle.event_count > 0)) {
    return Bad(absl::StrCat("an event pool flag of ", handle.has_event_pool, " with ", handle.event_count, " events"));
  }
  GetBytes(data, 112, handle.event_pool);
  return handle;
}

std::string EncodeZeReadyFence(const ZeReadyFence& fence) {
  TENSORD_CHECK(fence.uuid.size() == kZeUuidBytes);
  std::string out;
  out.reserve(kZeReadyFenceBytes);
  out.append(kFenceMagic, sizeof(kFenceMagic));
  PutLe(out, kFenceVersion, 2);
  PutLe(out, 0, 2);
  out.append(fence.uuid);
  PutLe(out, fence.event_index, 4);
  PutLe(out, 0, 4);
  return out;
}

absl::StatusOr<ZeReadyFence> DecodeZeReadyFence(std::string_view data) {
  if (data.size() != kZeReadyFenceBytes || data.substr(0, 4) != std::string_view(kFenceMagic, 4) ||
      GetLe(data, 4, 2) != kFenceVersion || GetLe(data, 6, 2) != 0 || GetLe(data, 28, 4) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("level_zero ready fence: ", data.size(), " bytes that are not a version ", kFenceVersion,
                     " fence of ", kZeReadyFenceBytes));
  }
  ZeReadyFence fence;
  fence.uuid = std::string(data.substr(8, kZeUuidBytes));
  fence.event_index = static_cast<uint32_t>(GetLe(data, 24, 4));
  return fence;
}

int IpcFd(const std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE>& bytes) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(bytes[static_cast<size_t>(i)]) << (8 * i);
  return static_cast<int>(static_cast<uint32_t>(value));
}

void SetIpcFd(std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE>& bytes, int fd) {
  const auto value = static_cast<uint64_t>(static_cast<uint32_t>(fd));
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>((value >> (8 * i)) & 0xff);
}

}  // namespace tensord::common
