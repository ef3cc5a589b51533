// The per-chunk ChatML template, and the invariant that chunk boundaries are token boundaries:
// encoding templated chunks one by one gives the ids of encoding the whole templated prompt.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "services/tokenizer/tokenizer.h"
#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::tokenizer {
namespace {

using ::cascade::tokenizer::testutil::Qwen3;
using ::testing::ElementsAre;

TEST(ChatTemplateTest, EachKindRendersQwen3ChatMl) {
  EXPECT_EQ(*ApplyChatTemplate(ChunkKind::kSystem, "S"), "<|im_start|>system\nS<|im_end|>\n");
  EXPECT_EQ(*ApplyChatTemplate(ChunkKind::kContext, "C"), "<|im_start|>user\nC<|im_end|>\n");
  EXPECT_EQ(*ApplyChatTemplate(ChunkKind::kQuery, "Q"), "<|im_start|>user\nQ<|im_end|>\n");
  EXPECT_EQ(*ApplyChatTemplate(ChunkKind::kAssistant, "A"), "<|im_start|>assistant\nA<|im_end|>\n");
  EXPECT_EQ(*ApplyChatTemplate(ChunkKind::kRaw, "raw <x>\n"), "raw <x>\n");
  EXPECT_EQ(*ApplyChatTemplate(ChunkKind::kGenerationPrompt, ""), "<|im_start|>assistant\n");
}

// enable_thinking=false (GenerateRequest::enable_thinking, OpenAI's chat_template_kwargs): the
// generation prompt ends in the empty think block the model's own chat template writes there
// (read from its tokenizer_config.json: the literal under `enable_thinking is false`), and it
// tokenizes alone as at the end of the whole prompt.
TEST(ChatTemplateTest, GenerationPromptWithoutThinkingIsTheModelTemplatesBlock) {
  const std::string no_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(*ApplyChatTemplate(ChunkKind::kGenerationPrompt, "", false), no_think);
  EXPECT_EQ(*ApplyChatTemplate(ChunkKind::kGenerationPrompt, "", true), "<|im_start|>assistant\n");
  std::ifstream f(testutil::Qwen3Dir() + "/tokenizer_config.json");
  ASSERT_TRUE(f.good()) << "run scripts/setup.sh";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string tmpl = nlohmann::json::parse(ss.str()).at("chat_template").get<std::string>();
  // The Jinja source spells the newlines as escapes: '<think>\n\n</think>\n\n'.
  const size_t cond = tmpl.find("enable_thinking is false");
  ASSERT_NE(cond, std::string::npos);
  const size_t block = tmpl.find("'<think>\\n\\n</think>\\n\\n'", cond);
  ASSERT_NE(block, std::string::npos) << tmpl.substr(cond, 120);
  EXPECT_LT(block - cond, 80u) << "the block belongs to that condition";
  EXPECT_LT(tmpl.rfind("'<|im_start|>assistant\\n'", cond), cond)
      << "and follows the assistant's start";

  Chunk q{ChunkKind::kQuery, "Hi"}, gp{ChunkKind::kGenerationPrompt, "", false};
  const std::vector<Chunk> chunks = {q, gp};
  auto per_chunk = EncodeChunks(*Qwen3(), chunks);
  ASSERT_TRUE(per_chunk.ok()) << per_chunk.status();
  auto whole = Qwen3()->Encode("<|im_start|>user\nHi<|im_end|>\n" + no_think);
  ASSERT_TRUE(whole.ok());
  std::vector<int32_t> joined = (*per_chunk)[0];
  joined.insert(joined.end(), (*per_chunk)[1].begin(), (*per_chunk)[1].end());
  EXPECT_EQ(joined, *whole);
  // <|im_start|> assistant \n <think> \n\n </think> \n\n
  EXPECT_THAT((*per_chunk)[1], ElementsAre(151644, 77091, 198, 151667, 271, 151668, 271));
}

TEST(ChatTemplateTest, KindNumbersMirrorTheWireEnum) {
  EXPECT_EQ(static_cast<int>(ChunkKind::kUnspecified), 0);
  EXPECT_EQ(static_cast<int>(ChunkKind::kSystem), 1);
  EXPECT_EQ(static_cast<int>(ChunkKind::kContext), 2);
  EXPECT_EQ(static_cast<int>(ChunkKind::kQuery), 3);
  EXPECT_EQ(static_cast<int>(ChunkKind::kRaw), 4);
  EXPECT_EQ(static_cast<int>(ChunkKind::kGenerationPrompt), 5);
  EXPECT_EQ(static_cast<int>(ChunkKind::kAssistant), 6);
}

TEST(ChatTemplateTest, BadChunksAreInvalidArgument) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(ApplyChatTemplate(ChunkKind::kUnspecified, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApplyChatTemplate(static_cast<ChunkKind>(99), "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApplyChatTemplate(ChunkKind::kGenerationPrompt, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<Chunk> gen_not_last = {{ChunkKind::kGenerationPrompt, ""},
                                           {ChunkKind::kQuery, "q"}};
  absl::StatusOr<std::vector<std::vector<int32_t>>> r = EncodeChunks(*t, gen_not_last);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("chunk 0"));
  const std::vector<Chunk> bad_utf8 = {{ChunkKind::kQuery, "\xff"}};
  EXPECT_EQ(EncodeChunks(*t, bad_utf8).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, NewlineAfterImEndIsItsOwnToken) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  // Between two templated chunks the only ordinary text is "\n", fenced by special tokens.
  EXPECT_THAT(*t->Encode("<|im_end|>\n"), ElementsAre(151645, 198));
  EXPECT_THAT(*t->Encode("<|im_end|>\n<|im_start|>"), ElementsAre(151645, 198, 151644));
  // What the fence prevents: unfenced, the Qwen regex joins newline runs ("\n\n" is one token)
  // and a space run before a newline joins it.
  EXPECT_THAT(*t->Encode("\n\n"), ElementsAre(271));
  EXPECT_EQ(t->Encode("x  \n")->size(), 2u);
}

// Texts that end in what could merge with a following "\n" or "<": spaces, newlines,
// punctuation, CJK, combining marks, digits, partial special tokens.
const std::vector<std::string>& EdgeTexts() {
  static const std::vector<std::string> texts = {"",
                                                 "plain",
                                                 "ends with space ",
                                                 "ends with spaces   ",
                                                 "ends with newline\n",
                                                 "ends with newlines\n\n\n",
                                                 "ends with tab\t",
                                                 "ends with CRLF\r\n",
                                                 " \n \t ",
                                                 "ends with punctuation.",
                                                 "ends with !?",
                                                 "中文结尾。",
                                                 "日本語",
                                                 "한국어",
                                                 "مرحبا",
                                                 "combining at end e\u0301",
                                                 "\u0301 combining at start",
                                                 "digits 1234567",
                                                 "emoji 👨‍👩‍👧",
                                                 "\nstarts with newline",
                                                 "  starts with spaces",
                                                 "<|im_",
                                                 "|>",
                                                 "ends with <",
                                                 "has <|im_end|> inside",
                                                 "<|im_start|>user\nnested turn",
                                                 "'s",
                                                 "x\r"};
  return texts;
}

void ExpectChunksEncodeLikeTheWholePrompt(const Tokenizer& t, const std::vector<Chunk>& chunks) {
  absl::StatusOr<std::vector<std::vector<int32_t>>> per_chunk = EncodeChunks(t, chunks);
  ASSERT_TRUE(per_chunk.ok()) << per_chunk.status();
  ASSERT_EQ(per_chunk->size(), chunks.size());
  std::string whole;
  std::vector<int32_t> joined;
  for (size_t i = 0; i < chunks.size(); ++i) {
    whole += *ApplyChatTemplate(chunks[i].kind, chunks[i].text);
    joined.insert(joined.end(), (*per_chunk)[i].begin(), (*per_chunk)[i].end());
  }
  absl::StatusOr<std::vector<int32_t>> whole_ids = t.Encode(whole);
  ASSERT_TRUE(whole_ids.ok());
  EXPECT_EQ(joined, *whole_ids) << "prompt: " << whole;
}

TEST(ChatTemplateTest, TemplatedChunksTokenizeAloneAsInTheWholePrompt) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  const std::vector<std::string>& texts = EdgeTexts();
  const ChunkKind kinds[] = {ChunkKind::kSystem, ChunkKind::kContext, ChunkKind::kQuery,
                             ChunkKind::kAssistant};
  int prompts = 0;
  for (size_t a = 0; a < texts.size(); ++a) {
    for (size_t b = 0; b < texts.size(); ++b) {
      const ChunkKind ka = kinds[a % 4], kb = kinds[(a + b) % 4];
      ExpectChunksEncodeLikeTheWholePrompt(*t,
                                           {{ka, texts[a]},
                                            {kb, texts[b]},
                                            {ChunkKind::kQuery, texts[(a * 7 + b) % texts.size()]},
                                            {ChunkKind::kGenerationPrompt, ""}});
      ++prompts;
    }
  }
  // A chat history: system, context, query, answer, query, generation prompt.
  ExpectChunksEncodeLikeTheWholePrompt(*t, {{ChunkKind::kSystem, "You are helpful. "},
                                            {ChunkKind::kContext, "Doc 1\n\nDoc 2\n"},
                                            {ChunkKind::kQuery, "What?  "},
                                            {ChunkKind::kAssistant, "That.\n"},
                                            {ChunkKind::kQuery, "和这个？"},
                                            {ChunkKind::kGenerationPrompt, ""}});
  EXPECT_EQ(prompts, static_cast<int>(texts.size() * texts.size()));
}

TEST(ChatTemplateTest, RawChunkBoundariesAreForcedAndMayDifferFromTheJoinedString) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  // RAW before a templated chunk is fenced by "<|im_start|>", so it still matches.
  ExpectChunksEncodeLikeTheWholePrompt(
      *t, {{ChunkKind::kRaw, "raw text ending in spaces  \n"}, {ChunkKind::kQuery, "q"}});
  // Two RAW chunks are not fenced: documented behaviour is that each is encoded alone.
  const std::vector<Chunk> chunks = {{ChunkKind::kRaw, "hel"}, {ChunkKind::kRaw, "lo"}};
  absl::StatusOr<std::vector<std::vector<int32_t>>> ids = EncodeChunks(*t, chunks);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0], *t->Encode("hel"));
  EXPECT_EQ((*ids)[1], *t->Encode("lo"));
  EXPECT_NE((*ids)[0].size() + (*ids)[1].size(), t->Encode("hello")->size());
}

}  // namespace
}  // namespace cascade::tokenizer
