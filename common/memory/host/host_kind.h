// Host memory (memfds) as a memory kind (memory_kind.h).
#pragma once

#include "common/memory/memory_kind.h"

namespace tensord::common {

inline constexpr MemoryKind kHostKind{
    .type = tensord::v1::DEVICE_TYPE_CPU,
    .name = "host",
    .device_prefix = "cpu",
    .numbered = false,
    .host_readable = true,
    .own_memory = true,
    .streams = StreamRule::kNone,
    .uuid_prefix = "",
};

}  // namespace tensord::common
