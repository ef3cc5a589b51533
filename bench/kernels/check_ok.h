// CHECK_OK(expr) for the kernel benchmarks: a failing absl::Status prints where and why and
// exits 1 (a benchmark has nothing sensible to go on with).
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

#define CHECK_OK(expr)                                                                \
  do {                                                                                \
    absl::Status _s = (expr);                                                         \
    if (!_s.ok()) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)
