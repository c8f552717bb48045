#pragma once
// Shared by the libFuzzer targets in tests/fuzz: a check that aborts (so libFuzzer records the
// input as a crash) with a message saying which invariant broke.
#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);            \
      std::abort();                                                                                \
    }                                                                                              \
  } while (false)
