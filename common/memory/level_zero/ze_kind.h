// Level Zero device memory (Intel GPUs) as a memory kind (memory_kind.h). Known to every
// build; the backend and importer exist only where level_zero/ze_api.h was found.
#pragma once

#include "common/memory/memory_kind.h"

namespace tensord::common {

inline constexpr MemoryKind kLevelZeroKind{
    .type = tensord::v1::DEVICE_TYPE_ONEAPI,
    .name = "level_zero",
    .device_prefix = "xpu",  // torch's name for Intel GPUs
    .numbered = true,
    .host_readable = false,
    .own_memory = true,
    .streams = StreamRule::kHostWait,
    .uuid_prefix = "",
};

}  // namespace tensord::common
