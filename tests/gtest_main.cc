// main() of the test binaries that have none of their own (tests/CMakeLists.txt).
#include <gmock/gmock.h>

#include "tests/gtest_run.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  return tensord::testing::RunAllTestsReportingSkips();
}
