// Logging through spdlog. The daemon configures the level and sink at start
// (SetLogLevel); libraries log through the default logger.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "spdlog/spdlog.h"

namespace tensord::common {

// "trace", "debug", "info", "warn", "error", "critical", "off".
absl::Status SetLogLevel(std::string_view level);

}  // namespace tensord::common
