// HumanBytes: a byte count as people read it, for logs and tables ("11.8 GiB", "512 B").
// Binary units (KiB, MiB, GiB, TiB, PiB, EiB) with one decimal; counts under 1 KiB exactly.
// Where the exact count matters, print it beside this. A thread-safe pure function.
#pragma once

#include <cstdint>
#include <string>

namespace tensord::common {

std::string HumanBytes(uint64_t bytes);

}  // namespace tensord::common
