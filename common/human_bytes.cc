#include "common/human_bytes.h"

#include <cstdio>

namespace tensord::common {

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  constexpr int kLastUnit = sizeof(kUnits) / sizeof(kUnits[0]) - 1;
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  // Up while the value would print as 1024.0 or more, so 1048575 bytes reads "1.0 MiB".
  while (value >= 1023.95 && unit < kLastUnit) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", value, kUnits[unit]);
  return text;
}

std::string ExactAndHumanBytes(uint64_t bytes) {
  std::string text = std::to_string(bytes) + " bytes";
  if (bytes >= 1024) text += " (" + HumanBytes(bytes) + ")";
  return text;
}

}  // namespace tensord::common
