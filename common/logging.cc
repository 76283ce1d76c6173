#include "common/logging.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tensord::common {

absl::Status SetLogLevel(std::string_view level) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  // from_str answers "off" for anything it does not know: accept "off" only when asked.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level '", AbslView(level), "': expected trace, debug, info, warn, error, critical or off"));
  }
  spdlog::set_level(parsed);
  return absl::OkStatus();
}

}  // namespace tensord::common
