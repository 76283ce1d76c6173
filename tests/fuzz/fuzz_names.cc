// The name rules (common/names.h) that every request's names and prefixes pass through,
// checked against a second, deliberately plain implementation of the same rules.
//
// Invariants: ValidateName / ValidateNamespace / ValidatePrefix accept exactly what the
// plain rules accept; NamespaceOf gives a valid namespace of a valid name; NameHasPrefix
// agrees with the segment-wise definition; refusals are INVALID_ARGUMENT in one readable
// line of bounded length however long or binary the input.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/names.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::common {
namespace {

std::vector<std::string_view> Split(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t slash = s.find('/', start);
    if (slash == std::string_view::npos) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, slash - start));
    start = slash + 1;
  }
}

bool PlainSegment(std::string_view segment) {
  if (segment.empty() || segment == "." || segment == ".." || segment.size() > kMaxSegmentBytes) {
    return false;
  }
  static const std::string kAllowed =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
  for (char c : segment) {
    if (kAllowed.find(c) == std::string::npos) return false;
  }
  return true;
}

bool PlainName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (std::string_view segment : Split(name)) {
    if (!PlainSegment(segment)) return false;
  }
  return true;
}

bool PlainPrefix(std::string_view prefix) {
  if (prefix.empty()) return true;
  if (prefix.size() > kMaxNameBytes) return false;
  std::string_view stem = prefix;
  if (stem.back() == '/') stem.remove_suffix(1);
  return PlainName(stem);
}

// "" matches everything; "a/" every name under a; "a" the name a and every name under it.
bool PlainHasPrefix(std::string_view name, std::string_view prefix) {
  if (prefix.empty()) return true;
  if (prefix.back() == '/') return name.starts_with(prefix);
  return name == prefix || name.starts_with(std::string(prefix) + "/");
}

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument) << status;
  // The name is quoted shortened and escaped, so the message stays short and printable.
  FUZZ_CHECK(fuzz::IsReadableMessage(status.message(), 400)) << status;
}

void CheckOne(std::string_view s) {
  absl::Status name = ValidateName(s);
  FUZZ_CHECK(name.ok() == PlainName(s)) << name;
  if (!name.ok()) CheckRefusal(name);

  absl::Status ns = ValidateNamespace(s);
  FUZZ_CHECK(ns.ok() == (PlainName(s) && s.find('/') == std::string_view::npos)) << ns;
  if (!ns.ok()) CheckRefusal(ns);

  absl::Status prefix = ValidatePrefix(s);
  FUZZ_CHECK(prefix.ok() == PlainPrefix(s)) << prefix;
  if (!prefix.ok()) CheckRefusal(prefix);

  if (name.ok()) {
    std::string_view first = NamespaceOf(s);
    FUZZ_CHECK(ValidateNamespace(first).ok()) << first;
    FUZZ_CHECK(NameHasPrefix(s, first));
    FUZZ_CHECK(NameHasPrefix(s, s));
    FUZZ_CHECK(NameHasPrefix(s, ""));
    FUZZ_CHECK(ValidatePrefix(s).ok());
    if (s.size() < kMaxNameBytes) {
      std::string under = std::string(s) + "/";
      FUZZ_CHECK(ValidatePrefix(under).ok());
      FUZZ_CHECK(!NameHasPrefix(s, under));
    }
  }
}

}  // namespace
}  // namespace tensord::common

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  std::string a = in.ConsumeRandomLengthString(2048);
  std::string b = in.ConsumeRemainingBytesAsString();
  tensord::common::CheckOne(a);
  tensord::common::CheckOne(b);
  // NameHasPrefix is only defined for a valid name and a valid prefix.
  if (tensord::common::ValidateName(a).ok() && tensord::common::ValidatePrefix(b).ok()) {
    FUZZ_CHECK(tensord::common::NameHasPrefix(a, b) == tensord::common::PlainHasPrefix(a, b))
        << "name '" << a << "' prefix '" << b << "'";
  }
  return 0;
}
