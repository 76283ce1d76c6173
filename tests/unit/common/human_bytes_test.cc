#include "common/human_bytes.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace tensord::common {
namespace {

TEST(HumanBytesTest, CountsUnderAKibibyteAreExact) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1), "1 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
}

TEST(HumanBytesTest, LargerCountsHaveOneDecimalInABinaryUnit) {
  EXPECT_EQ(HumanBytes(1024), "1.0 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{16} << 20), "16.0 MiB");
  EXPECT_EQ(HumanBytes(12638257152), "11.8 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{3} << 40), "3.0 TiB");
  EXPECT_EQ(HumanBytes(std::numeric_limits<uint64_t>::max()), "16.0 EiB");
}

TEST(HumanBytesTest, NeverPrintsATopUnitValueOf1024) {
  EXPECT_EQ(HumanBytes((uint64_t{1} << 20) - 1), "1.0 MiB");
  EXPECT_EQ(HumanBytes((uint64_t{1} << 30) - 1), "1.0 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{1023} << 10), "1023.0 KiB");
}

}  // namespace
}  // namespace tensord::common
