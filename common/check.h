// TENSORD_CHECK: an invariant check that stays on in release builds. Use it only for the
// program's own invariants; anything that comes from outside (a request, a file, a peer's
// fd) is validated and answered with a status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define TENSORD_CHECK(cond)                                                          \
  do {                                                                               \
    if (!(cond)) [[unlikely]] {                                                      \
      std::fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (false)
