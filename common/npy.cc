#include "common/npy.h"

#include <bit>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tensor_desc.h"

namespace tensord::common {
namespace {

static_assert(std::endian::native == std::endian::little,
              "npy byte-order handling assumes a little-endian host");

constexpr std::string_view kMagic = "\x93NUMPY";
// numpy itself refuses headers over 10000 bytes by default; 1 MiB leaves room for any
// sane shape while bounding what a hostile file can make us parse.
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kAlign = 64;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("npy: ", what));
}

uint32_t ReadLittleEndian(std::string_view bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

// --- the header dictionary, a Python literal parsed by hand ---------------------------

// A value in the dictionary: a string, a bool, or a tuple of non-negative ints.
struct DictValue {
  enum Kind { kString, kBool, kTuple } kind = kString;
  std::string text;
  bool flag = false;
  std::vector<int64_t> ints;
};

class DictParser {
 public:
  explicit DictParser(std::string_view text) : text_(text) {}

  // Calls `on_entry(key, value)` for each entry; fails on anything but a flat dict of
  // string keys whose values are strings, True/False or tuples of ints.
  template <typename F>
  absl::Status Parse(F on_entry) {
    SkipSpace();
    if (!Consume('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      TENSORD_RETURN_IF_ERROR(ParseString(&key));
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after a key");
      SkipSpace();
      DictValue value;
      TENSORD_RETURN_IF_ERROR(ParseValue(&value));
      TENSORD_RETURN_IF_ERROR(on_entry(key, std::move(value)));
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return Error("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the dictionary");
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return Malformed(absl::StrCat("header dictionary: ", what, " at byte ", pos_, " of '",
                                  absl::CHexEscape(AbslView(text_.substr(0, 200))), "'"));
  }
  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  // A quoted string without escapes: no key or descr numpy writes needs one.
  absl::Status ParseString(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Error("expected a quoted string");
    }
    char quote = text_[pos_++];
    size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return Error("unterminated string");
    std::string_view body = text_.substr(pos_, end - pos_);
    if (body.find('\\') != std::string_view::npos || body.find('\n') != std::string_view::npos) {
      return Error("escapes and newlines in strings are not supported");
    }
    *out = std::string(body);
    pos_ = end + 1;
    return absl::OkStatus();
  }

  absl::Status ParseInt(int64_t* out) {
    size_t start = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (__builtin_mul_overflow(value, 10, &value) ||
          __builtin_add_overflow(value, text_[pos_] - '0', &value)) {
        return Error("shape entry does not fit in 64 bits");
      }
      ++pos_;
    }
    if (pos_ == start) return Error("expected a non-negative integer");
    *out = value;
    return absl::OkStatus();
  }

  // (), (3,), (2, 3) and (2, 3,); a bare (3) is an int in Python, not a tuple.
  absl::Status ParseTuple(std::vector<int64_t>* out) {
    SkipSpace();
    if (Consume(')')) return absl::OkStatus();
    while (true) {
      int64_t value = 0;
      TENSORD_RETURN_IF_ERROR(ParseInt(&value));
      out->push_back(value);
      if (out->size() > static_cast<size_t>(kMaxNdim)) {
        return Error(absl::StrCat("more than ", kMaxNdim, " dimensions"));
      }
      SkipSpace();
      if (Consume(')')) {
        if (out->size() == 1) return Error("a one-element tuple needs a trailing comma");
        return absl::OkStatus();
      }
      if (!Consume(',')) return Error("expected ',' or ')' in a tuple");
      SkipSpace();
      if (Consume(')')) return absl::OkStatus();
    }
  }

  absl::Status ParseValue(DictValue* value) {
    if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) {
      value->kind = DictValue::kString;
      return ParseString(&value->text);
    }
    if (ConsumeWord("True")) {
      value->kind = DictValue::kBool;
      value->flag = true;
      return absl::OkStatus();
    }
    if (ConsumeWord("False")) {
      value->kind = DictValue::kBool;
      value->flag = false;
      return absl::OkStatus();
    }
    if (Consume('(')) {
      value->kind = DictValue::kTuple;
      return ParseTuple(&value->ints);
    }
    if (pos_ < text_.size() && text_[pos_] == '[') {
      return Error("lists are not supported (structured dtypes cannot be shared)");
    }
    return Error("expected a string, True, False or a tuple");
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// --- dtypes ---------------------------------------------------------------------------

tensord::v1::DataType MakeDType(tensord::v1::DTypeCode code, uint32_t bits) {
  tensord::v1::DataType dtype;
  dtype.set_code(code);
  dtype.set_bits(bits);
  dtype.set_lanes(1);
  return dtype;
}

absl::StatusOr<tensord::v1::DataType> ParseDescr(std::string_view descr) {
  char order = '\0';
  std::string_view rest = descr;
  if (!rest.empty() && (rest[0] == '<' || rest[0] == '>' || rest[0] == '|' || rest[0] == '=')) {
    order = rest[0];
    rest.remove_prefix(1);
  }
  std::optional<tensord::v1::DataType> dtype;
  if (rest == "bfloat16") {
    dtype = MakeDType(tensord::v1::DTYPE_CODE_BFLOAT, 16);
  } else if (rest.size() >= 2) {
    int64_t bytes = 0;
    for (char c : rest.substr(1)) {
      if (c < '0' || c > '9' || bytes > 16) {
        bytes = -1;
        break;
      }
      bytes = bytes * 10 + (c - '0');
    }
    tensord::v1::DTypeCode code = tensord::v1::DTYPE_CODE_UNSPECIFIED;
    switch (rest[0]) {
      case 'b': code = tensord::v1::DTYPE_CODE_BOOL; break;
      case 'i': code = tensord::v1::DTYPE_CODE_INT; break;
      case 'u': code = tensord::v1::DTYPE_CODE_UINT; break;
      case 'f': code = tensord::v1::DTYPE_CODE_FLOAT; break;
      case 'c': code = tensord::v1::DTYPE_CODE_COMPLEX; break;
      default: break;
    }
    if (code != tensord::v1::DTYPE_CODE_UNSPECIFIED && bytes > 0) {
      tensord::v1::DataType candidate = MakeDType(code, static_cast<uint32_t>(bytes * 8));
      if (ItemBytes(candidate) != 0) dtype = candidate;
    }
  }
  if (!dtype) {
    return Malformed(absl::StrCat("descr '", absl::CHexEscape(AbslView(descr.substr(0, 64))),
                                  "' is not a supported dtype (bool, int, uint, float, "
                                  "complex or bfloat16)"));
  }
  if (order == '>' && ItemBytes(*dtype) > 1) {
    return Malformed(absl::StrCat(
        "descr '", AbslView(descr), "' is big-endian; tensord shares native little-endian memory: "
        "convert it first, e.g. arr.astype(arr.dtype.newbyteorder('<'))"));
  }
  return *dtype;
}

absl::StatusOr<std::string> FormatDescr(const tensord::v1::DataType& dtype) {
  uint64_t bytes = ItemBytes(dtype);
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: dtype ", DTypeName(dtype), " cannot be written to .npy"));
  }
  // numpy's own spelling: '|' where byte order is meaningless.
  std::string order = bytes == 1 ? "|" : "<";
  switch (dtype.code()) {
    case tensord::v1::DTYPE_CODE_BOOL: return absl::StrCat(order, "b", bytes);
    case tensord::v1::DTYPE_CODE_INT: return absl::StrCat(order, "i", bytes);
    case tensord::v1::DTYPE_CODE_UINT: return absl::StrCat(order, "u", bytes);
    case tensord::v1::DTYPE_CODE_FLOAT: return absl::StrCat(order, "f", bytes);
    case tensord::v1::DTYPE_CODE_COMPLEX: return absl::StrCat(order, "c", bytes);
    // ml_dtypes has no descr numpy can round-trip; tensord's reader and writer agree on this.
    case tensord::v1::DTYPE_CODE_BFLOAT: return std::string("bfloat16");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("npy: dtype ", DTypeName(dtype), " cannot be written to .npy"));
  }
}

// The header length (dictionary, padding and '\n') that makes preamble + header a
// multiple of kAlign.
size_t PaddedHeaderBytes(size_t preamble, size_t dict_bytes) {
  size_t total = preamble + dict_bytes + 1;
  return total + (kAlign - total % kAlign) % kAlign - preamble;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i == 0 ? "" : ", ", shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// --- the header as a whole --------------------------------------------------------------

// Reads the preamble: version and header length, giving where the dictionary lies.
absl::Status ParsePreamble(std::string_view prefix, uint64_t file_size, NpyHeader* header,
                           std::string_view* dict_text) {
  if (prefix.size() < kMagic.size() + 2 || prefix.substr(0, kMagic.size()) != kMagic) {
    return Malformed("not a .npy file (bad magic)");
  }
  int major = static_cast<uint8_t>(prefix[6]);
  int minor = static_cast<uint8_t>(prefix[7]);
  if (minor != 0 || major < 1 || major > 3) {
    return Malformed(absl::StrCat("format version ", major, ".", minor,
                                  " is not supported (1.0, 2.0 or 3.0)"));
  }
  size_t len_bytes = major == 1 ? 2 : 4;
  if (prefix.size() < 8 + len_bytes) return Malformed("file ends inside the header length");
  uint64_t header_len = ReadLittleEndian(prefix.substr(8, len_bytes));
  if (header_len > kMaxHeaderBytes) {
    return Malformed(absl::StrCat("header of ", header_len, " bytes is longer than the ",
                                  kMaxHeaderBytes, " allowed"));
  }
  header->data_offset = 8 + len_bytes + header_len;
  if (header->data_offset > file_size) {
    return Malformed(absl::StrCat("file of ", file_size, " bytes ends inside its ",
                                  header->data_offset, "-byte header"));
  }
  if (header->data_offset > prefix.size()) {
    return Malformed(absl::StrCat("header of ", header->data_offset,
                                  " bytes is longer than the ", prefix.size(),
                                  " bytes read"));
  }
  *dict_text = prefix.substr(8 + len_bytes, header_len);
  return absl::OkStatus();
}

absl::Status ParseDict(std::string_view text, NpyHeader* header) {
  bool have_descr = false, have_fortran = false, have_shape = false;
  DictParser parser(text);
  TENSORD_RETURN_IF_ERROR(parser.Parse([&](const std::string& key,
                                           DictValue value) -> absl::Status {
    bool* seen = key == "descr" ? &have_descr
                 : key == "fortran_order" ? &have_fortran
                 : key == "shape" ? &have_shape
                                  : nullptr;
    if (seen == nullptr) {
      return Malformed(absl::StrCat("unexpected key '", absl::CHexEscape(key), "' in header"));
    }
    if (*seen) return Malformed(absl::StrCat("key '", key, "' appears twice in header"));
    *seen = true;
    if (key == "descr") {
      if (value.kind != DictValue::kString) return Malformed("'descr' is not a string");
      TENSORD_ASSIGN_OR_RETURN(header->dtype, ParseDescr(value.text));
    } else if (key == "fortran_order") {
      if (value.kind != DictValue::kBool) return Malformed("'fortran_order' is not True/False");
      header->fortran_order = value.flag;
    } else {
      if (value.kind != DictValue::kTuple) return Malformed("'shape' is not a tuple");
      header->shape = std::move(value.ints);
    }
    return absl::OkStatus();
  }));
  if (!have_descr || !have_fortran || !have_shape) {
    return Malformed("header lacks one of 'descr', 'fortran_order' and 'shape'");
  }
  return absl::OkStatus();
}

absl::Status CheckDataSize(uint64_t file_size, NpyHeader* header) {
  uint64_t bytes = ItemBytes(header->dtype);
  for (int64_t dim : header->shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) {
      return Malformed(absl::StrCat("shape ", ShapeString(header->shape),
                                    " is too large: its byte size overflows"));
    }
  }
  header->data_bytes = bytes;
  uint64_t available = file_size - header->data_offset;  // data_offset <= file_size
  if (bytes != available) {
    return Malformed(absl::StrCat("header says ", bytes, " data bytes but the file has ",
                                  available));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(std::string_view prefix, uint64_t file_size) {
  if (prefix.size() > file_size) {
    return Malformed(absl::StrCat("read ", prefix.size(), " bytes of a file said to hold ",
                                  file_size));
  }
  NpyHeader header;
  std::string_view dict_text;
  TENSORD_RETURN_IF_ERROR(ParsePreamble(prefix, file_size, &header, &dict_text));
  TENSORD_RETURN_IF_ERROR(ParseDict(dict_text, &header));
  TENSORD_RETURN_IF_ERROR(CheckDataSize(file_size, &header));
  return header;
}

absl::StatusOr<std::string> FormatNpyHeader(const tensord::v1::DataType& dtype,
                                            const std::vector<int64_t>& shape,
                                            bool fortran_order) {
  TENSORD_ASSIGN_OR_RETURN(std::string descr, FormatDescr(dtype));
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("npy: shape[", i, "] is ", shape[i], ": dimensions must be >= 0"));
    }
  }
  std::string dict = absl::StrCat("{'descr': '", descr, "', 'fortran_order': ",
                                  fortran_order ? "True" : "False",
                                  ", 'shape': ", ShapeString(shape), ", }");
  // Padded with spaces and ended by '\n' so that the data starts 64-byte aligned, as numpy
  // writes it; version 2.0 only when the 2-byte length cannot hold the header.
  bool v2 = false;
  size_t padded = PaddedHeaderBytes(kMagic.size() + 4, dict.size());
  if (padded > 0xffff) {
    v2 = true;
    padded = PaddedHeaderBytes(kMagic.size() + 6, dict.size());
  }
  dict.append(padded - dict.size() - 1, ' ');
  dict.push_back('\n');

  std::string out(kMagic);
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back('\0');
  const uint32_t len = static_cast<uint32_t>(dict.size());
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) {
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  }
  out += dict;
  return out;
}

}  // namespace tensord::common
