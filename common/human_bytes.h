// HumanBytes: a byte count as people read it, for logs and tables ("11.8 GiB", "512 B").
// Binary units (KiB, MiB, GiB, TiB, PiB, EiB) with one decimal; counts under 1 KiB exactly.
// Where the exact count matters, print it beside this. A thread-safe pure function.
#pragma once

#include <cstdint>
#include <string>

namespace tensord::common {

std::string HumanBytes(uint64_t bytes);

// "8192 bytes (8.0 KiB)": the exact count, with HumanBytes beside it from 1 KiB up
// ("512 bytes" below), for messages where both matter (a quota refusal).
std::string ExactAndHumanBytes(uint64_t bytes);

}  // namespace tensord::common
