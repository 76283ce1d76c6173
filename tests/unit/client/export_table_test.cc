// ExportTable: a source stays until its export is released, and is only ever dropped by
// whoever takes it, never under the table's lock.
#include "client/export_table.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensord::internal {
namespace {

using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// A source whose deleter counts its drops and, as user code may, calls back into the table
// (which would deadlock were it dropped under the table's lock).
ExportTable::Source Observed(ExportTable& table, int* dropped, size_t* held_then) {
  return std::shared_ptr<const void>(new int(0), [&table, dropped, held_then](const void* p) {
    *held_then = table.held();
    ++*dropped;
    delete static_cast<const int*>(p);
  });
}

TEST(ExportTableTest, ASourceStaysUntilItsExportIsReleasedAndIsDroppedByWhoeverTakesIt) {
  ExportTable table;
  int dropped = 0;
  size_t held_then = 99;
  table.Add(7, 70, Observed(table, &dropped, &held_then));
  table.Add(8, 80, Observed(table, &dropped, &held_then));
  EXPECT_EQ(table.held(), 2u);
  EXPECT_THAT(table.HeldTensorIds(), UnorderedElementsAre(7u, 8u));

  EXPECT_FALSE(table.Release(9));      // not an export of ours
  EXPECT_FALSE(table.Release(7, 71));  // another buffer: not this export
  EXPECT_TRUE(table.Release(7, 70));
  EXPECT_FALSE(table.Release(7, 70));  // a repeated notice
  EXPECT_EQ(table.held(), 1u);
  EXPECT_EQ(dropped, 0);  // released, not dropped: the table only moves it
  std::vector<ExportTable::Source> released = table.TakeReleased();
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(dropped, 0);
  released.clear();
  EXPECT_EQ(dropped, 1);
  EXPECT_EQ(held_then, 1u);
  EXPECT_THAT(table.TakeReleased(), IsEmpty());

  std::vector<ExportTable::Source> held = table.TakeHeld();
  EXPECT_EQ(held.size(), 1u);
  EXPECT_EQ(table.held(), 0u);
  EXPECT_EQ(dropped, 1);
  held.clear();
  EXPECT_EQ(dropped, 2);
}

TEST(ExportTableTest, ReleaseWithoutABufferIdMatchesTheTensor) {
  ExportTable table;
  int dropped = 0;
  size_t held_then = 0;
  table.Add(7, 70, Observed(table, &dropped, &held_then));
  EXPECT_TRUE(table.Release(7));
  table.TakeReleased().clear();
  EXPECT_EQ(dropped, 1);
}

TEST(ExportTableTest, UnsureIsOwedOnceUntilTaken) {
  ExportTable table;
  EXPECT_FALSE(table.TakeUnsure());
  table.MarkUnsure();
  table.MarkUnsure();
  EXPECT_TRUE(table.TakeUnsure());
  EXPECT_FALSE(table.TakeUnsure());
}

TEST(ExportTableTest, WhatIsLeftIsDroppedWithTheTable) {
  int dropped = 0;
  size_t held_then = 0;
  {
    ExportTable table;
    // The deleter must not touch the table being destroyed: a plain counter here.
    table.Add(1, 10, std::shared_ptr<const void>(new int(0), [&dropped](const void* p) {
      ++dropped;
      delete static_cast<const int*>(p);
    }));
    table.Add(2, 20, Observed(table, &dropped, &held_then));
    ASSERT_TRUE(table.Release(2));
    table.TakeReleased().clear();
    EXPECT_EQ(dropped, 1);
  }
  EXPECT_EQ(dropped, 2);
}

}  // namespace
}  // namespace tensord::internal
