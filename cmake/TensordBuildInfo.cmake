# Writes OUTPUT, the header that `tensord --version` and `tensorctl --version` print from:
# the project version, the commit built (`git describe --always --dirty` in SOURCE_DIR, or
# COMMIT when the build names one, as a tree without .git can) and the memory backends.
# Runs at build time (`cmake -P`), so the commit is the one built, not the one configured;
# OUTPUT is rewritten only when its text changes, so nothing recompiles otherwise.
if(COMMIT STREQUAL "")
  execute_process(COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
                  OUTPUT_VARIABLE COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE git_result ERROR_QUIET)
  if(NOT git_result EQUAL 0 OR COMMIT STREQUAL "")
    set(COMMIT "unknown")
  endif()
endif()
set(text "// Written by cmake/TensordBuildInfo.cmake at build time.
#pragma once
#define TENSORD_VERSION_LINE \"${VERSION} (commit ${COMMIT}; memory backends: ${BACKENDS})\"
")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUTPUT}" "${text}")
