// How a tensord test binary ends, so that ctest tells a binary that tested nothing from one
// that passed: RUN_ALL_TESTS() returns 0 also when every case called GTEST_SKIP (no GPU, not
// root), and ctest would report that binary Passed.
#pragma once

#include <gtest/gtest.h>

namespace tensord::testing {

// tensord_add_gtest registers it as the test's SKIP_RETURN_CODE (tests/CMakeLists.txt).
inline constexpr int kAllSkippedExitCode = 77;

// RUN_ALL_TESTS(), but kAllSkippedExitCode when the run passed and every case it ran was
// skipped. A failure wins over skips; a run that selected no case (an empty
// --gtest_filter) returns RUN_ALL_TESTS()'s own answer.
inline int RunAllTestsReportingSkips() {
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (rc == 0 && unit.test_to_run_count() > 0 &&
      unit.skipped_test_count() == unit.test_to_run_count()) {
    return kAllSkippedExitCode;
  }
  return rc;
}

}  // namespace tensord::testing
