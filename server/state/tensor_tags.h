// The tags a tensor may carry. They are kept in the daemon for the tensor's life, so they
// are bounded per entry and in all (common/protocol_limits.h); INVALID_ARGUMENT saying which
// bound a request passed.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/protocol_limits.h"

namespace tensord::server {

// TagMap: a map of strings (a request's protobuf map, or the merged std::map of a publish).
template <typename TagMap>
absl::Status ValidateTags(const TagMap& tags) {
  if (tags.size() > common::kMaxTags) {
    return absl::InvalidArgumentError(absl::StrCat("tags: ", tags.size(), " entries, at most ", common::kMaxTags));
  }
  size_t total = 0;
  for (const auto& [key, value] : tags) {
    if (key.empty() || key.size() > common::kMaxTagKeyBytes || value.size() > common::kMaxTagValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat("tags: keys 1..", common::kMaxTagKeyBytes,
                                                     " bytes, values at most ", common::kMaxTagValueBytes, " bytes"));
    }
    total += key.size() + value.size();
  }
  if (total > common::kMaxTagBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tags: ", total, " bytes of keys and values, at most ",
                                                   common::kMaxTagBytes, " in all"));
  }
  return absl::OkStatus();
}

}  // namespace tensord::server
