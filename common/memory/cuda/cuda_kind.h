// CUDA device memory, and pinned views of host memory, as memory kinds (memory_kind.h).
// Known to every build; the backend and importers exist only where cuda.h was found.
#pragma once

#include "common/memory/memory_kind.h"

namespace tensord::common {

inline constexpr MemoryKind kCudaKind{
    .type = tensord::v1::DEVICE_TYPE_CUDA,
    .name = "cuda",
    .device_prefix = "cuda",
    .numbered = true,
    .host_readable = false,
    .own_memory = true,
    .streams = StreamRule::kCuda,
    .uuid_prefix = "GPU-",  // as nvidia-smi and CUDA_VISIBLE_DEVICES write it
};

// Host memory a consumer asked to see registered with the CUDA driver (pinned=True): a view,
// never memory of its own.
inline constexpr MemoryKind kCudaHostKind{
    .type = tensord::v1::DEVICE_TYPE_CUDA_HOST,
    .name = "cuda_host",
    .device_prefix = "cuda_host",
    .numbered = false,
    .host_readable = true,
    .own_memory = false,
    .streams = StreamRule::kNone,
    .uuid_prefix = "",
};

}  // namespace tensord::common
