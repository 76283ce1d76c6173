// Tensor names: `[A-Za-z0-9._-]` segments joined by single '/', no empty, '.' or '..'
// segments, at most kMaxNameBytes (protocol_limits.h, with kMaxSegmentBytes). The first
// segment is the namespace that ACLs and quotas apply to. Names are compared byte for byte;
// there is no canonicalisation beyond refusing anything that is not already canonical.
// Thread-safe pure functions.
//
// Errors: INVALID_ARGUMENT that quotes the (truncated) name and says which rule it broke.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/protocol_limits.h"

namespace tensord::common {

absl::Status ValidateName(std::string_view name);
// A namespace: one segment.
absl::Status ValidateNamespace(std::string_view ns);
// A prefix for List/Watch/Take: empty, a valid name, or a valid name followed by '/'.
absl::Status ValidatePrefix(std::string_view prefix);
// The first segment of a valid name.
std::string_view NamespaceOf(std::string_view name);
// Whether `name` lies under `prefix` as ValidatePrefix accepts it: "" matches everything,
// "a/" matches "a/x" but not "ab", "a" matches "a" and "a/x".
bool NameHasPrefix(std::string_view name, std::string_view prefix);

// `text` in single quotes for an error message, cut after 128 bytes ("...") so a 100 kB
// name does not make a 100 kB error.
std::string QuoteForError(std::string_view text);

// The Levenshtein distance of a and b when it is at most `limit`, else nullopt; costs
// O(min(|a|, |b|) * limit), so it is cheap to ask of long names with a small limit.
std::optional<size_t> EditDistanceWithin(std::string_view a, std::string_view b, size_t limit);

}  // namespace tensord::common
