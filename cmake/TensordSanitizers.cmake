# Instrumented builds: TENSORD_SANITIZER and TENSORD_BUILD_FUZZERS.
#
# TENSORD_SANITIZER applies to every target of the build, compile and link alike:
#   ""       none
#   address  AddressSanitizer + UndefinedBehaviorSanitizer; any undefined behaviour aborts
#            (-fno-sanitize-recover=undefined)
#   thread   ThreadSanitizer, with clang (CC=clang CXX=clang++). Debian's abseil is not
#            instrumented, so every executable also gets
#            tests/sanitizers/tsan_absl_annotations.cc (see there): without it TSan cannot
#            see absl::Mutex and reports everything it guards as racing.
# TENSORD_BUILD_FUZZERS builds the libFuzzer targets of tests/fuzz with clang, instrumented
# with address+undefined and fuzzer coverage, and only what they link (proto, common,
# server): a fuzzing build is configured on its own (CC=clang CXX=clang++).
#
# Sanitizer runtime options for ctest are in TENSORD_SANITIZER_TEST_ENV (a list for the
# ENVIRONMENT test property); tests/CMakeLists.txt applies it to every test.

set(TENSORD_SANITIZER "" CACHE STRING
    "Sanitizer build: empty, 'address' (ASan+UBSan) or 'thread' (TSan)")
set_property(CACHE TENSORD_SANITIZER PROPERTY STRINGS "" address thread)
option(TENSORD_BUILD_FUZZERS "Build the libFuzzer targets (clang only; a build of its own)" OFF)

if(TENSORD_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TENSORD_BUILD_FUZZERS needs clang for libFuzzer: configure a separate "
                        "build directory with CC=clang CXX=clang++")
  endif()
  if(TENSORD_SANITIZER STREQUAL "")
    set(TENSORD_SANITIZER address CACHE STRING "" FORCE)
  elseif(NOT TENSORD_SANITIZER STREQUAL "address")
    message(FATAL_ERROR "TENSORD_BUILD_FUZZERS runs with TENSORD_SANITIZER=address, not "
                        "'${TENSORD_SANITIZER}'")
  endif()
endif()

set(TENSORD_SANITIZER_TEST_ENV "")
set(_tensord_supp_dir "${PROJECT_SOURCE_DIR}/tests/sanitizers")
if(TENSORD_SANITIZER STREQUAL "address")
  set(_tensord_san_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined
                         -fno-omit-frame-pointer)
  # halt_on_error: one report fails the test. LSan's suppressions cover only leaks inside
  # uninstrumented third-party libraries (each entry says why).
  set(TENSORD_SANITIZER_TEST_ENV
      "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
      "LSAN_OPTIONS=suppressions=${_tensord_supp_dir}/lsan.supp:print_suppressions=0"
      "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
elseif(TENSORD_SANITIZER STREQUAL "thread")
  # clang, for its compile-time ignorelist: gRPC's C++ API is inline code in its headers,
  # compiled into our objects but synchronized by libgrpc's atomics, which TSan cannot see;
  # tsan_ignorelist.txt leaves it uninstrumented like the rest of gRPC. (gcc has no such
  # list, and runtime suppressions of those reports would also hide our own races.)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TENSORD_SANITIZER=thread needs clang: configure a separate build "
                        "directory with CC=clang CXX=clang++")
  endif()
  set(_tensord_san_flags -fsanitize=thread)
  add_compile_options(-fsanitize-ignorelist=${_tensord_supp_dir}/tsan_ignorelist.txt)
  # halt_on_error: a race in the daemon kills it, which fails the test that drove it.
  # die_after_fork=0: the client library restarts gRPC's threads in a fork child on
  # purpose (client/session.cc); TSan otherwise aborts any child that starts a thread.
  # history_size=3: enough history to show both stacks of a race in a busy daemon.
  set(TENSORD_SANITIZER_TEST_ENV
      "TSAN_OPTIONS=suppressions=${_tensord_supp_dir}/tsan.supp:second_deadlock_stack=1:halt_on_error=1:die_after_fork=0:history_size=3:print_suppressions=0")
elseif(NOT TENSORD_SANITIZER STREQUAL "")
  message(FATAL_ERROR "TENSORD_SANITIZER must be empty, 'address' or 'thread', not "
                      "'${TENSORD_SANITIZER}'")
endif()

if(_tensord_san_flags)
  # -O1 with line tables only (-g1): an instrumented build compiles in about half the time
  # of -O2 -g (measured with gcc's ASan+UBSan: broker.cc 37 -> 19 s, the hostile test,
  # then one file, 50 -> 26 s), and a report still names the function, file and line of every frame,
  # inlined ones included. Last on the command line, so it wins over the build type's
  # flags; TENSORD_SANITIZER_OPT_FLAGS="" keeps the build type's.
  set(TENSORD_SANITIZER_OPT_FLAGS "-O1;-g1" CACHE STRING
      "Optimization and debug flags of an instrumented build (after the build type's)")
  list(APPEND _tensord_san_flags ${TENSORD_SANITIZER_OPT_FLAGS})
  if(TENSORD_BUILD_FUZZERS)
    # Coverage feedback for everything the fuzzers link; the fuzzer executables add
    # -fsanitize=fuzzer (libFuzzer's main) themselves.
    list(APPEND _tensord_san_flags -fsanitize=fuzzer-no-link)
  endif()
  add_compile_options(${_tensord_san_flags})
  add_link_options(${_tensord_san_flags})
  # The symbolizer for reports, when the machine has it (Debian: llvm).
  find_program(TENSORD_LLVM_SYMBOLIZER NAMES llvm-symbolizer llvm-symbolizer-14)
  if(TENSORD_LLVM_SYMBOLIZER)
    list(APPEND TENSORD_SANITIZER_TEST_ENV
         "ASAN_SYMBOLIZER_PATH=${TENSORD_LLVM_SYMBOLIZER}"
         "TSAN_SYMBOLIZER_PATH=${TENSORD_LLVM_SYMBOLIZER}"
         "UBSAN_SYMBOLIZER_PATH=${TENSORD_LLVM_SYMBOLIZER}"
         "LSAN_SYMBOLIZER_PATH=${TENSORD_LLVM_SYMBOLIZER}")
  endif()
endif()

# Finishes a thread build once every target exists (call once, after every
# add_subdirectory):
# - every executable gets the absl::Mutex annotations. Shared libraries get no copy: their
#   calls into abseil bind to the executable's definitions, which the dynamic list exports.
# - shared libraries may leave the TSan runtime's symbols undefined: clang links the runtime
#   into executables only, so a library linked with --no-undefined (libtensord.so) would
#   not link. `-z undefs` comes after the target's own options and so wins.
function(tensord_finish_sanitizer_setup)
  if(NOT TENSORD_SANITIZER STREQUAL "thread")
    return()
  endif()
  add_library(tensord_tsan_absl_annotations OBJECT
              ${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_absl_annotations.cc)
  target_link_libraries(tensord_tsan_absl_annotations PUBLIC absl::synchronization ${CMAKE_DL_LIBS})
  set(dirs ${PROJECT_SOURCE_DIR})
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "EXECUTABLE")
        target_link_libraries(${target} PRIVATE tensord_tsan_absl_annotations)
        target_link_options(${target} PRIVATE
          "LINKER:--dynamic-list=${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_absl_exports.list")
      elseif(type STREQUAL "SHARED_LIBRARY" OR type STREQUAL "MODULE_LIBRARY")
        target_link_options(${target} PRIVATE "LINKER:-z,undefs")
      endif()
    endforeach()
  endwhile()
endfunction()
