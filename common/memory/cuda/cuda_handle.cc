#include "common/memory/cuda/cuda_handle.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/memory/handle_bytes.h"

namespace tensord::common {
namespace {

constexpr char kMagic[4] = {'T', 'D', 'C', 'U'};
constexpr char kFenceMagic[4] = {'T', 'D', 'C', 'E'};
constexpr uint16_t kFenceVersion = 1;

using handle_bytes::GetLe;
using handle_bytes::PutLe;

}  // namespace

const char* CudaHandleKindName(CudaHandleKind kind) {
  switch (kind) {
    case CudaHandleKind::kVmmFd:
      return "VMM fd";
    case CudaHandleKind::kLegacyIpc:
      return "legacy IPC";
  }
  return "unknown";
}

std::string EncodeCudaHandle(const CudaHandle& handle) {
  TENSORD_CHECK(handle.uuid.size() == kCudaUuidBytes);
  std::string out;
  out.reserve(kCudaLegacyIpcHandleBytes);
  out.append(kMagic, sizeof(kMagic));
  PutLe(out, kCudaHandleVersion, 2);
  PutLe(out, static_cast<uint16_t>(handle.kind), 2);
  out.append(handle.uuid);
  PutLe(out, handle.size, 8);
  if (handle.kind == CudaHandleKind::kLegacyIpc) {
    PutLe(out, handle.offset, 8);
    out.append(reinterpret_cast<const char*>(handle.ipc_handle.data()), handle.ipc_handle.size());
  }
  return out;
}

absl::StatusOr<CudaHandle> DecodeCudaHandle(std::string_view data) {
  if (data.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda handle: ", data.size(), " bytes, too short for its header (8)"));
  }
  if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("cuda handle: wrong magic (not a tensord cuda handle)");
  }
  const uint64_t version = GetLe(data, 4, 2);
  if (version != kCudaHandleVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda handle: version ", version, ", this build reads version ", kCudaHandleVersion));
  }
  const uint64_t kind = GetLe(data, 6, 2);
  size_t expected = 0;
  if (kind == static_cast<uint16_t>(CudaHandleKind::kVmmFd)) {
    expected = kCudaVmmHandleBytes;
  } else if (kind == static_cast<uint16_t>(CudaHandleKind::kLegacyIpc)) {
    expected = kCudaLegacyIpcHandleBytes;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("cuda handle: unknown kind ", kind));
  }
  CudaHandle handle;
  handle.kind = static_cast<CudaHandleKind>(kind);
  if (data.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("cuda handle: ", data.size(), " bytes for a ",
                                                   CudaHandleKindName(handle.kind), " handle, expected ",
                                                   expected));
  }
  handle.uuid = std::string(data.substr(8, kCudaUuidBytes));
  handle.size = GetLe(data, 24, 8);
  if (handle.size == 0) return absl::InvalidArgumentError("cuda handle: allocation size is 0");
  if (handle.kind == CudaHandleKind::kLegacyIpc) {
    handle.offset = GetLe(data, 32, 8);
    if (handle.offset >= handle.size) {
      return absl::InvalidArgumentError(absl::StrCat("cuda handle: offset ", handle.offset,
                                                     " is outside the allocation of ", handle.size, " bytes"));
    }
    std::memcpy(handle.ipc_handle.data(), data.data() + 40, kCudaIpcHandleBytes);
  }
  return handle;
}

std::string EncodeCudaEventFence(const CudaEventFence& fence) {
  TENSORD_CHECK(fence.uuid.size() == kCudaUuidBytes);
  std::string out;
  out.reserve(kCudaEventFenceBytes);
  out.append(kFenceMagic, sizeof(kFenceMagic));
  PutLe(out, kFenceVersion, 2);
  PutLe(out, 0, 2);
  out.append(fence.uuid);
  out.append(reinterpret_cast<const char*>(fence.ipc_event.data()), fence.ipc_event.size());
  return out;
}

absl::StatusOr<CudaEventFence> DecodeCudaEventFence(std::string_view data) {
  if (data.size() != kCudaEventFenceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ready fence: ", data.size(), " bytes, expected ", kCudaEventFenceBytes));
  }
  if (std::memcmp(data.data(), kFenceMagic, sizeof(kFenceMagic)) != 0) {
    return absl::InvalidArgumentError("cuda ready fence: wrong magic (not a tensord cuda fence)");
  }
  const uint64_t version = GetLe(data, 4, 2);
  if (version != kFenceVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ready fence: version ", version, ", this build reads ", kFenceVersion));
  }
  if (GetLe(data, 6, 2) != 0) return absl::InvalidArgumentError("cuda ready fence: reserved bytes are not 0");
  CudaEventFence fence;
  fence.uuid = std::string(data.substr(8, kCudaUuidBytes));
  std::memcpy(fence.ipc_event.data(), data.data() + 8 + kCudaUuidBytes, kCudaIpcHandleBytes);
  return fence;
}

}  // namespace tensord::common
