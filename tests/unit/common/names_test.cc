#include "common/names.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::common {
namespace {

using ::tensord::common::testing::IsOk;
using ::tensord::common::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ValidateNameTest, AcceptsCanonicalNames) {
  for (const char* name : {"a", "ns/tensor", "team-1/run_2/weights.v3", "A.B/c-d/E_F/0", "...",
                           "a..b", ".hidden"}) {
    EXPECT_THAT(ValidateName(name), IsOk()) << name;
  }
}

TEST(ValidateNameTest, RefusesEmptyAndBadSegments) {
  EXPECT_THAT(ValidateName(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(ValidateName("a//b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'a//b': empty segment")));
  EXPECT_THAT(ValidateName("a/"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("end with '/'")));
  EXPECT_THAT(ValidateName("/a"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("start with '/'")));
  EXPECT_THAT(ValidateName("a/../b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("segment '..'")));
  EXPECT_THAT(ValidateName("a/./b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("segment '.'")));
  EXPECT_THAT(ValidateName(".."), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'..'")));
}

TEST(ValidateNameTest, RefusesOddCharacters) {
  EXPECT_THAT(ValidateName("a b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("character ' '")));
  EXPECT_THAT(ValidateName("ns/na\xc3\xafve"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\\xc3")));
  EXPECT_THAT(ValidateName(std::string("a\0b", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("character '\\x00'")));
  for (const char* name : {"a:b", "a\\b", "a*", "x?y", "ns/t\n", "$HOME", "a~"}) {
    EXPECT_THAT(ValidateName(name), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not allowed")))
        << name;
  }
}

TEST(ValidateNameTest, RefusesTooLong) {
  std::string segment(kMaxSegmentBytes, 'x');
  EXPECT_THAT(ValidateName(segment), IsOk());
  EXPECT_THAT(ValidateName(segment + "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a segment is 256 bytes")));
  std::string name = segment + "/" + segment;  // 511 bytes
  EXPECT_THAT(ValidateName(name), IsOk());
  EXPECT_THAT(ValidateName(name + "/a"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is 513 bytes")));
  // The message quotes a shortened name, not all 513 bytes.
  EXPECT_LT(ValidateName(name + "/a").message().size(), 200u);
}

TEST(ValidateNamespaceTest, OneSegment) {
  EXPECT_THAT(ValidateNamespace("team"), IsOk());
  EXPECT_THAT(ValidateNamespace("team/x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("namespace 'team/x'")));
  EXPECT_THAT(ValidateNamespace(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("namespace")));
  EXPECT_THAT(ValidateNamespace(".."), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("namespace")));
}

TEST(ValidatePrefixTest, EmptyNameOrNameSlash) {
  EXPECT_THAT(ValidatePrefix(""), IsOk());
  EXPECT_THAT(ValidatePrefix("a"), IsOk());
  EXPECT_THAT(ValidatePrefix("a/"), IsOk());
  EXPECT_THAT(ValidatePrefix("a/b/"), IsOk());
  EXPECT_THAT(ValidatePrefix("/"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prefix")));
  EXPECT_THAT(ValidatePrefix("a//"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prefix")));
  EXPECT_THAT(ValidatePrefix("a/../"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'..'")));
}

TEST(NamespaceOfTest, FirstSegment) {
  EXPECT_EQ(NamespaceOf("team/run/w"), "team");
  EXPECT_EQ(NamespaceOf("team"), "team");
}

TEST(NameHasPrefixTest, SegmentAware) {
  EXPECT_TRUE(NameHasPrefix("anything/at/all", ""));
  EXPECT_TRUE(NameHasPrefix("a/x", "a/"));
  EXPECT_FALSE(NameHasPrefix("ab", "a/"));
  EXPECT_FALSE(NameHasPrefix("a", "a/"));
  EXPECT_TRUE(NameHasPrefix("a", "a"));
  EXPECT_TRUE(NameHasPrefix("a/x", "a"));
  EXPECT_FALSE(NameHasPrefix("ab", "a"));
  EXPECT_FALSE(NameHasPrefix("ab/x", "a"));
  EXPECT_TRUE(NameHasPrefix("a/b/c", "a/b"));
  EXPECT_FALSE(NameHasPrefix("a/bc", "a/b"));
  EXPECT_FALSE(NameHasPrefix("b", "a"));
}

TEST(EditDistanceWithinTest, CountsEditsUpToTheLimit) {
  EXPECT_EQ(EditDistanceWithin("weights", "weights", 2), 0u);
  EXPECT_EQ(EditDistanceWithin("weights", "wieghts", 2), 2u);  // a transposition is two edits
  EXPECT_EQ(EditDistanceWithin("weights", "weight", 2), 1u);
  EXPECT_EQ(EditDistanceWithin("weight", "weights", 2), 1u);
  EXPECT_EQ(EditDistanceWithin("kitten", "sitting", 3), 3u);
  EXPECT_EQ(EditDistanceWithin("kitten", "sitting", 2), std::nullopt);
  EXPECT_EQ(EditDistanceWithin("", "abc", 3), 3u);
  EXPECT_EQ(EditDistanceWithin("", "abcd", 3), std::nullopt);
  EXPECT_EQ(EditDistanceWithin("abcdef", "uvwxyz", 3), std::nullopt);
  // Long names cost the band, not the square: a 512-byte name against itself and one edit.
  const std::string long_name(512, 'a');
  EXPECT_EQ(EditDistanceWithin(long_name, long_name + "b", 1), 1u);
  EXPECT_EQ(EditDistanceWithin(long_name, "b" + long_name.substr(1), 1), 1u);
}

}  // namespace
}  // namespace tensord::common
