// Helpers the CLI tests share: where ctest put the binaries, and a scratch directory.
#pragma once

#include <cstdlib>
#include <string>

#include "tests/common/scratch_dir.h"

namespace cascade::cli::test_util {

// The build's bin/ (ctest sets CASCADE_BINARY_DIR); empty outside ctest.
inline std::string BinDir() {
  const char* dir = std::getenv("CASCADE_BINARY_DIR");
  return dir == nullptr ? "" : std::string(dir) + "/bin";
}

// A fresh directory under the temp dir, removed with everything in it when this goes.
using TempDir = test_support::ScratchDir;

}  // namespace cascade::cli::test_util
