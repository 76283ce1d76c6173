#include "common/names.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tensord::common {
namespace {

// Long or binary names are quoted shortened and escaped so that an error message stays
// one readable line.
std::string Quote(absl::string_view name) {
  constexpr size_t kShown = 64;
  std::string shown = absl::CHexEscape(name.substr(0, kShown));
  if (name.size() > kShown) shown += "...";
  return absl::StrCat("'", shown, "'");
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}

absl::Status Invalid(absl::string_view kind, absl::string_view name, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(kind, " ", Quote(name), ": ", rule));
}

absl::Status ValidateSegment(absl::string_view kind, absl::string_view name,
                             absl::string_view segment) {
  if (segment.empty()) {
    return Invalid(kind, name, "empty segment (segments are joined by single '/')");
  }
  if (segment == "." || segment == "..") {
    return Invalid(kind, name, absl::StrCat("segment '", segment, "' is not allowed"));
  }
  if (segment.size() > kMaxSegmentBytes) {
    return Invalid(kind, name,
                   absl::StrCat("a segment is ", segment.size(), " bytes, at most ",
                                kMaxSegmentBytes, " allowed"));
  }
  for (char c : segment) {
    if (!IsNameChar(c)) {
      return Invalid(kind, name,
                     absl::StrCat("character '", absl::CHexEscape(absl::string_view(&c, 1)),
                                  "' is not allowed (use A-Z a-z 0-9 . _ -)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateNameAs(absl::string_view kind, absl::string_view name) {
  if (name.empty()) return Invalid(kind, name, "must not be empty");
  if (name.size() > kMaxNameBytes) {
    return Invalid(kind, name,
                   absl::StrCat("is ", name.size(), " bytes, at most ", kMaxNameBytes,
                                " allowed"));
  }
  if (name.front() == '/') return Invalid(kind, name, "must not start with '/'");
  if (name.back() == '/') return Invalid(kind, name, "must not end with '/'");
  size_t start = 0;
  while (true) {
    size_t slash = name.find('/', start);
    absl::string_view segment = name.substr(start, slash == absl::string_view::npos
                                                      ? absl::string_view::npos
                                                      : slash - start);
    if (absl::Status s = ValidateSegment(kind, name, segment); !s.ok()) return s;
    if (slash == absl::string_view::npos) return absl::OkStatus();
    start = slash + 1;
  }
}

}  // namespace

absl::Status ValidateName(std::string_view name) { return ValidateNameAs("name", AbslView(name)); }

absl::Status ValidateNamespace(std::string_view ns) {
  if (ns.find('/') != std::string_view::npos) {
    return Invalid("namespace", AbslView(ns), "must be a single segment (no '/')");
  }
  return ValidateNameAs("namespace", AbslView(ns));
}

absl::Status ValidatePrefix(std::string_view prefix) {
  if (prefix.empty()) return absl::OkStatus();
  absl::string_view stem = AbslView(prefix);
  if (stem.back() == '/') stem.remove_suffix(1);
  if (stem.empty()) return Invalid("prefix", AbslView(prefix), "'/' alone is not a prefix; use \"\"");
  if (prefix.size() > kMaxNameBytes) {
    return Invalid("prefix", AbslView(prefix),
                   absl::StrCat("is ", prefix.size(), " bytes, at most ", kMaxNameBytes,
                                " allowed"));
  }
  return ValidateNameAs("prefix", stem);
}

std::string_view NamespaceOf(std::string_view name) {
  return name.substr(0, name.find('/'));
}

bool NameHasPrefix(std::string_view name, std::string_view prefix) {
  if (prefix.empty()) return true;
  if (name.substr(0, prefix.size()) != prefix) return false;
  // "a/" already ends at a segment boundary; "a" must match a whole segment.
  return prefix.back() == '/' || name.size() == prefix.size() || name[prefix.size()] == '/';
}

std::string QuoteForError(std::string_view text) {
  constexpr size_t kShown = 128;
  if (text.size() > kShown) {
    return absl::StrCat("'", absl::string_view(text.data(), kShown), "...'");
  }
  return absl::StrCat("'", absl::string_view(text.data(), text.size()), "'");
}

std::optional<size_t> EditDistanceWithin(std::string_view a, std::string_view b, size_t limit) {
  if (a.size() > b.size()) std::swap(a, b);
  if (b.size() - a.size() > limit) return std::nullopt;
  // One row of the distance table, over a; only cells within `limit` of the diagonal can
  // stay within the limit, so the rest stay at `over`.
  const size_t over = limit + 1;
  std::vector<size_t> row(a.size() + 1, over), next(a.size() + 1, over);
  for (size_t i = 0; i <= std::min(a.size(), limit); ++i) row[i] = i;
  for (size_t j = 1; j <= b.size(); ++j) {
    std::fill(next.begin(), next.end(), over);
    if (j <= limit) next[0] = j;
    const size_t from = j > limit ? j - limit : 1;
    const size_t to = std::min(a.size(), j + limit);
    size_t best = next[0];
    for (size_t i = from; i <= to; ++i) {
      const size_t substitute = row[i - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      next[i] = std::min({substitute, row[i] + 1, next[i - 1] + 1, over});
      best = std::min(best, next[i]);
    }
    if (best > limit) return std::nullopt;
    std::swap(row, next);
  }
  return row[a.size()] <= limit ? std::optional<size_t>(row[a.size()]) : std::nullopt;
}

}  // namespace tensord::common
