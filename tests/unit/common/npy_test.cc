#include "common/npy.h"

#include <cstring>
#include <string>

#include "common/tensor_desc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::common {
namespace {

using ::tensord::common::testing::IsOk;
using ::tensord::common::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

v1::DataType DType(const char* name) { return ParseDTypeName(name).value(); }

// A v1.0 file's first bytes with `dict` as the header, padded the way numpy pads it.
std::string RawHeader(const std::string& dict, int major = 1) {
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  size_t len_bytes = major == 1 ? 2 : 4;
  std::string body = dict;
  while ((8 + len_bytes + body.size() + 1) % 64 != 0) body.push_back(' ');
  body.push_back('\n');
  for (size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<char>((body.size() >> (8 * i)) & 0xff));
  return out + body;
}

absl::StatusOr<NpyHeader> ParseWithData(const std::string& header, uint64_t data_bytes) {
  return ParseNpyHeader(header, header.size() + data_bytes);
}

TEST(NpyTest, RoundTripsEveryDType) {
  struct Case {
    const char* name;
    const char* descr;
  };
  for (const Case& c : {Case{"bool", "'|b1'"}, Case{"int8", "'|i1'"}, Case{"int16", "'<i2'"},
                        Case{"int32", "'<i4'"}, Case{"int64", "'<i8'"}, Case{"uint8", "'|u1'"},
                        Case{"uint16", "'<u2'"}, Case{"uint32", "'<u4'"}, Case{"uint64", "'<u8'"},
                        Case{"float16", "'<f2'"}, Case{"float32", "'<f4'"},
                        Case{"float64", "'<f8'"}, Case{"complex64", "'<c8'"},
                        Case{"complex128", "'<c16'"}, Case{"bfloat16", "'bfloat16'"}}) {
    SCOPED_TRACE(c.name);
    v1::DataType dtype = DType(c.name);
    auto header = FormatNpyHeader(dtype, {2, 3}, false);
    ASSERT_THAT(header, IsOk());
    EXPECT_EQ(header->size() % 64, 0u);
    EXPECT_EQ(header->back(), '\n');
    EXPECT_THAT(*header, HasSubstr(std::string("'descr': ") + c.descr));
    uint64_t data_bytes = 6 * ItemBytes(dtype);
    auto parsed = ParseWithData(*header, data_bytes);
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(DTypeName(parsed->dtype), c.name);
    EXPECT_THAT(parsed->shape, ElementsAre(2, 3));
    EXPECT_FALSE(parsed->fortran_order);
    EXPECT_EQ(parsed->data_offset, header->size());
    EXPECT_EQ(parsed->data_bytes, data_bytes);
  }
}

TEST(NpyTest, WritesWhatNumpyWrites) {
  // Byte for byte what numpy 1.x/2.x save for np.zeros((2, 3), '<f4').
  std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                         "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expected.append(128 - expected.size() - 1, ' ');
  expected.push_back('\n');
  EXPECT_EQ(FormatNpyHeader(DType("float32"), {2, 3}, false).value(), expected);
}

TEST(NpyTest, ZeroDimensionalAndEmptyArrays) {
  auto scalar = FormatNpyHeader(DType("float64"), {}, false);
  ASSERT_THAT(scalar, IsOk());
  EXPECT_THAT(*scalar, HasSubstr("'shape': ()"));
  auto parsed = ParseWithData(*scalar, 8);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_TRUE(parsed->shape.empty());
  EXPECT_EQ(parsed->data_bytes, 8u);

  auto one = FormatNpyHeader(DType("int32"), {5}, false);
  ASSERT_THAT(one, IsOk());
  EXPECT_THAT(*one, HasSubstr("'shape': (5,)"));
  EXPECT_THAT(ParseWithData(*one, 20), IsOk());

  auto empty = FormatNpyHeader(DType("int32"), {0, 7}, false);
  ASSERT_THAT(empty, IsOk());
  auto parsed_empty = ParseWithData(*empty, 0);
  ASSERT_THAT(parsed_empty, IsOk());
  EXPECT_THAT(parsed_empty->shape, ElementsAre(0, 7));
  EXPECT_EQ(parsed_empty->data_bytes, 0u);
}

TEST(NpyTest, FortranOrder) {
  auto header = FormatNpyHeader(DType("float32"), {4, 5}, true);
  ASSERT_THAT(header, IsOk());
  EXPECT_THAT(*header, HasSubstr("'fortran_order': True"));
  auto parsed = ParseWithData(*header, 80);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_TRUE(parsed->fortran_order);
}

TEST(NpyTest, AcceptsVersionsTwoAndThreeAndLooseSpelling) {
  for (int major : {2, 3}) {
    std::string h = RawHeader("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", major);
    auto parsed = ParseWithData(h, 24);
    ASSERT_THAT(parsed, IsOk()) << major;
    EXPECT_EQ(parsed->data_offset, h.size());
  }
  // Key order, quotes, whitespace and trailing commas vary among writers.
  std::string h = RawHeader("{\"shape\":(2,3,),\"fortran_order\":True,\"descr\":\"=f8\"}");
  auto parsed = ParseWithData(h, 48);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_THAT(parsed->shape, ElementsAre(2, 3));
  EXPECT_TRUE(parsed->fortran_order);
  EXPECT_EQ(DTypeName(parsed->dtype), "float64");
}

TEST(NpyTest, RefusesBadMagicAndVersion) {
  std::string good = FormatNpyHeader(DType("uint8"), {4}, false).value();
  std::string bad = good;
  bad[1] = 'M';
  EXPECT_THAT(ParseWithData(bad, 4), StatusIs(kInvalid, HasSubstr("bad magic")));
  EXPECT_THAT(ParseNpyHeader("", 0), StatusIs(kInvalid, HasSubstr("bad magic")));
  bad = good;
  bad[6] = 4;
  EXPECT_THAT(ParseWithData(bad, 4), StatusIs(kInvalid, HasSubstr("version 4.0")));
}

TEST(NpyTest, RefusesTruncatedHeader) {
  std::string good = FormatNpyHeader(DType("uint8"), {4}, false).value();
  // The file ends inside the header.
  EXPECT_THAT(ParseNpyHeader(good.substr(0, 40), 40),
              StatusIs(kInvalid, HasSubstr("file of 40 bytes ends inside its 128-byte header")));
  EXPECT_THAT(ParseNpyHeader(good.substr(0, 9), 9),
              StatusIs(kInvalid, HasSubstr("header length")));
  // The caller read less than the header says it spans.
  EXPECT_THAT(ParseNpyHeader(good.substr(0, 40), 1000),
              StatusIs(kInvalid, HasSubstr("longer than the 40 bytes read")));
}

TEST(NpyTest, RefusesHeaderThatLiesAboutDataSize) {
  std::string header = FormatNpyHeader(DType("float32"), {10, 100}, false).value();
  EXPECT_THAT(ParseWithData(header, 12),
              StatusIs(kInvalid, "npy: header says 4000 data bytes but the file has 12"));
  EXPECT_THAT(ParseWithData(header, 4001),
              StatusIs(kInvalid, "npy: header says 4000 data bytes but the file has 4001"));
  EXPECT_THAT(ParseWithData(header, 4000), IsOk());
}

TEST(NpyTest, RefusesShapeOverflow) {
  std::string h = RawHeader(
      "{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 1099511627776, 16), }");
  EXPECT_THAT(ParseWithData(h, 0), StatusIs(kInvalid, HasSubstr("overflows")));
  h = RawHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }");
  EXPECT_THAT(ParseWithData(h, 0), StatusIs(kInvalid, HasSubstr("64 bits")));
}

TEST(NpyTest, RefusesBigEndian) {
  std::string h = RawHeader("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }");
  EXPECT_THAT(ParseWithData(h, 8), StatusIs(kInvalid, HasSubstr("'>f4' is big-endian")));
  // A single byte has no byte order.
  h = RawHeader("{'descr': '>u1', 'fortran_order': False, 'shape': (2,), }");
  EXPECT_THAT(ParseWithData(h, 2), IsOk());
}

TEST(NpyTest, RefusesGarbageDictionaries) {
  for (const char* dict : {
           "",
           "garbage",
           "{'descr': '<f4', 'fortran_order': False}",                           // no shape
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",   // extra key
           "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
           "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2)}",  // an int, not a tuple
           "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2,,)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",    // unclosed
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x",  // trailing text
           "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}",
           "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}",
           "{'descr': '<U8', 'fortran_order': False, 'shape': (2,)}",
           "{'descr': '<f3', 'fortran_order': False, 'shape': (2,)}",
           "{'descr': 'O', 'fortran_order': False, 'shape': (2,)}",
           "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}",
       }) {
    EXPECT_THAT(ParseWithData(RawHeader(dict), 8), StatusIs(kInvalid, HasSubstr("npy:")))
        << dict;
  }
}

TEST(NpyTest, FormatRefusesWhatNpyCannotSay) {
  v1::DataType bad;
  bad.set_code(v1::DTYPE_CODE_FLOAT);
  bad.set_bits(8);
  bad.set_lanes(1);
  EXPECT_THAT(FormatNpyHeader(bad, {1}, false), StatusIs(kInvalid, HasSubstr("cannot be written")));
  EXPECT_THAT(FormatNpyHeader(DType("int8"), {-1}, false), StatusIs(kInvalid, HasSubstr("shape[0]")));
}

}  // namespace
}  // namespace tensord::common
