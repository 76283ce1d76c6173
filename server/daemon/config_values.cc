#include "server/daemon/config_values.h"

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <limits>
#include <optional>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/names.h"
#include "common/status.h"

namespace tensord::server {
namespace {

struct Unit {
  const char* name;  // lower case; units are matched without regard to case
  uint64_t factor;
};

constexpr Unit kUnits[] = {
    {"b", 1},
    {"k", uint64_t{1} << 10},  {"kib", uint64_t{1} << 10}, {"kb", 1000},
    {"m", uint64_t{1} << 20},  {"mib", uint64_t{1} << 20}, {"mb", 1000 * 1000},
    {"g", uint64_t{1} << 30},  {"gib", uint64_t{1} << 30}, {"gb", 1000 * 1000 * 1000},
    {"t", uint64_t{1} << 40},  {"tib", uint64_t{1} << 40}, {"tb", uint64_t{1000} * 1000 * 1000 * 1000},
};

constexpr char kSizeForm[] =
    "a size is a decimal number of bytes with an optional unit (B, K, KiB, KB, M, MiB, MB, G, GiB, GB, T, "
    "TiB, TB), like 512MiB, 4G or 1.5GiB";

absl::Status Invalid(absl::string_view reason) { return absl::InvalidArgumentError(reason); }

bool IsDigits(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), absl::ascii_isdigit);
}

absl::string_view TakeDigits(absl::string_view& text) {
  size_t n = 0;
  while (n < text.size() && absl::ascii_isdigit(text[n])) ++n;
  absl::string_view digits = text.substr(0, n);
  text.remove_prefix(n);
  return digits;
}

// The mistakes that used to be guessed at, each refused with its own reason: a sign,
// hexadecimal, leading zeros (octal to some readers), scientific notation, inner whitespace.
absl::Status RefuseCommonMistakes(absl::string_view text, absl::string_view form) {
  if (text.empty()) return Invalid(absl::StrCat("empty; ", form));
  if (text[0] == '+' || text[0] == '-') return Invalid(absl::StrCat("no sign is accepted; ", form));
  if (absl::StartsWithIgnoreCase(text, "0x")) return Invalid(absl::StrCat("hexadecimal is not accepted; ", form));
  absl::string_view rest = text;
  absl::string_view whole = TakeDigits(rest);
  if (whole.size() > 1 && whole[0] == '0') {
    return Invalid(absl::StrCat("leading zeros are not accepted (octal is not either); ", form));
  }
  if (absl::ConsumePrefix(&rest, ".")) TakeDigits(rest);
  if (!whole.empty() && rest.size() > 1 && (rest[0] == 'e' || rest[0] == 'E') &&
      (absl::ascii_isdigit(rest[1]) || rest[1] == '+' || rest[1] == '-')) {
    return Invalid(absl::StrCat("scientific notation is not accepted; ", form));
  }
  if (std::any_of(text.begin(), text.end(), absl::ascii_isspace)) {
    return Invalid(absl::StrCat("no whitespace is accepted inside; ", form));
  }
  return absl::OkStatus();
}
}  // namespace

// The grammar of sizes: digits, optionally '.' and digits, optionally a unit; the result a
// whole number of bytes from 1 to 2^63-1. Errors give the reason only; callers say where
// the text came from.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::Status mistake = RefuseCommonMistakes(text, kSizeForm); !mistake.ok()) return mistake;
  absl::string_view rest = text;
  absl::string_view whole = TakeDigits(rest);
  absl::string_view fraction;
  bool has_point = absl::ConsumePrefix(&rest, ".");
  if (has_point) fraction = TakeDigits(rest);
  if (whole.empty() || (has_point && fraction.empty())) return Invalid(kSizeForm);
  uint64_t factor = 1;
  if (!rest.empty()) {
    std::string unit = absl::AsciiStrToLower(rest);
    const Unit* found = std::find_if(std::begin(kUnits), std::end(kUnits),
                                     [&](const Unit& u) { return unit == u.name; });
    if (found == std::end(kUnits)) return Invalid(absl::StrCat("unknown unit '", rest, "'; ", kSizeForm));
    factor = found->factor;
  } else if (has_point) {
    return Invalid("a fraction needs a unit, like 1.5GiB: a number alone is a whole number of bytes");
  }
  // Buffers are sized in off_t: a size above its largest value could never be allocated, and
  // a quota that large (9999999TiB) is a typo, not a limit.
  constexpr char kTooLarge[] = "too large: a size is at most 9223372036854775807 bytes (8 EiB, the largest off_t)";
  if (whole.size() > 20) return Invalid(kTooLarge);
  absl::uint128 bytes = 0;
  for (char digit : whole) bytes = bytes * 10 + static_cast<uint64_t>(digit - '0');
  bytes *= factor;
  // Exact arithmetic: 1.5GiB is 1610612736 bytes, and 0.1B is refused rather than rounded.
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (!fraction.empty()) {
    // 10^26 times a TiB still fits 128 bits; no whole number of bytes needs more places.
    if (fraction.size() > 26) return Invalid("more than 26 decimal places: not a whole number of bytes");
    absl::uint128 numerator = 0, denominator = 1;
    for (char digit : fraction) {
      numerator = numerator * 10 + static_cast<uint64_t>(digit - '0');
      denominator *= 10;
    }
    numerator *= factor;
    if (numerator % denominator != 0) return Invalid("not a whole number of bytes");
    bytes += numerator / denominator;
  }
  if (bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Invalid(kTooLarge);
  if (bytes == 0) return Invalid("0 bytes: a size is at least 1 byte");
  return absl::Uint128Low64(bytes);
}

absl::StatusOr<DeviceLimits> ParseDeviceLimits(std::string_view text) {
  DeviceLimits limits;
  bool have_all = false;
  for (absl::string_view entry : absl::StrSplit(common::AbslView(text), ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) return Invalid("an empty entry: write SIZE or DEVICE=SIZE between commas");
    const size_t eq = entry.find('=');
    absl::string_view name = eq == absl::string_view::npos ? absl::string_view() : absl::StripAsciiWhitespace(entry.substr(0, eq));
    absl::string_view value = eq == absl::string_view::npos ? entry : entry.substr(eq + 1);
    absl::StatusOr<uint64_t> bytes = ParseSize(value);
    if (!bytes.ok()) return Invalid(absl::StrCat(common::QuoteForError(std::string(entry)), ": ", bytes.status().message()));
    if (eq == absl::string_view::npos) {
      if (have_all) return Invalid("two values for every device: name the device of the second (DEVICE=SIZE)");
      have_all = true;
      limits.all = *bytes;
      continue;
    }
    const bool uuid = absl::StartsWith(name, "GPU-") && name.size() > 4;
    const size_t colon = name.find(':');
    const bool ordinal = colon != absl::string_view::npos && colon > 0 && colon + 1 < name.size() &&
                         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(colon) + 1, name.end(),
                                     [](char c) { return absl::ascii_isdigit(c); });
    if (!uuid && !ordinal) {
      return Invalid(absl::StrCat(common::QuoteForError(std::string(entry)), ": name the device by its UUID (GPU-...) or as "
                                  "backend:ordinal (cuda:0), as tensorctl status shows it"));
    }
    if (!limits.by_device.emplace(std::string(name), *bytes).second) {
      return Invalid(absl::StrCat(common::QuoteForError(std::string(name)), " is given twice"));
    }
  }
  return limits;
}

absl::StatusOr<uint64_t> ParseCount(absl::string_view text) {
  static const std::string form = absl::StrCat("a count is a whole decimal number from 1 to ", kMaxCount);
  text = absl::StripAsciiWhitespace(text);
  if (absl::Status mistake = RefuseCommonMistakes(text, form); !mistake.ok()) return mistake;
  if (absl::StrContains(text, '.')) return Invalid(absl::StrCat("a count has no fraction; ", form));
  if (!IsDigits(text)) return Invalid(form);
  uint64_t count = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), count);
  if (error == std::errc::result_out_of_range || count > kMaxCount) return Invalid(absl::StrCat("too large; ", form));
  if (count == 0) return Invalid(absl::StrCat("too small; ", form));
  return count;
}

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  absl::StatusOr<uint64_t> size = ParseSize(text);
  if (!size.ok()) return Invalid(absl::StrCat("size ", common::QuoteForError(text), ": ", size.status().message()));
  return size;
}

absl::StatusOr<gid_t> LookUpGroup(std::string_view group_text) {
  absl::string_view text(group_text.data(), group_text.size());
  std::optional<gid_t> number;
  if (IsDigits(text)) {
    constexpr uint64_t kMaxGid = std::numeric_limits<gid_t>::max() - 1;
    if (text.size() > 1 && text[0] == '0') return Invalid("leading zeros are not accepted in a numeric gid");
    uint64_t value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || value > kMaxGid) return Invalid(absl::StrCat("a gid is at most ", kMaxGid));
    number = static_cast<gid_t>(value);
  }
  std::string name(text);
  long hint = sysconf(_SC_GETGR_R_SIZE_MAX);
  std::vector<char> buffer(hint > 0 ? static_cast<size_t>(hint) : 4096);
  group entry{};
  group* found = nullptr;
  int error = 0;
  // A group with many members needs a larger buffer; 1 MiB is plenty, and bounds the retries.
  constexpr size_t kMaxBuffer = size_t{1} << 20;
  while (true) {
    error = number ? getgrgid_r(*number, &entry, buffer.data(), buffer.size(), &found)
                   : getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (error != ERANGE || buffer.size() >= kMaxBuffer) break;
    buffer.resize(buffer.size() * 2);
  }
  // getgr*_r(3): these say "not found" on some systems.
  if (error != 0 && error != ENOENT && error != ESRCH && error != EBADF && error != EPERM) {
    return common::ErrnoToStatus("look up the group", error);
  }
  if (found == nullptr) {
    return Invalid(number ? absl::StrCat("no group has gid ", *number) : std::string("no such group"));
  }
  return found->gr_gid;
}

}  // namespace tensord::server
