// The gateway's request building (prompt.h) on the real Qwen3 tokenizer: each chunk gets its
// ChatML piece and is tokenized alone, the generation prompt comes last, token ids pass through
// within the model's vocabulary, every bad field is refused naming it, sampling defaults are the
// shared ones and the worker request carries exactly the prompt.
#include "services/gateway/prompt.h"

#include <gtest/gtest.h>

#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::gateway {
namespace {

using cascade::v2::Chunk;
using google::protobuf::RepeatedPtrField;

class PromptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = tokenizer::testutil::Qwen3();
    ASSERT_NE(tok_, nullptr);
    limits_.model_name = "tiny";
  }

  std::vector<int32_t> Encode(const std::string& text) {
    auto ids = tok_->Encode(text);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
  static Chunk Text(cascade::v2::ChunkKind kind, const std::string& text) {
    Chunk c;
    c.set_kind(kind);
    c.set_text(text);
    return c;
  }
  static Chunk Ids(cascade::v2::ChunkKind kind, std::vector<int32_t> ids) {
    Chunk c;
    c.set_kind(kind);
    c.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    return c;
  }
  absl::StatusOr<Prompt> Build(std::vector<Chunk> chunks,
                               const cascade::v2::SamplingParams& sampling = {},
                               bool generation_prompt = true) {
    RepeatedPtrField<Chunk> field(chunks.begin(), chunks.end());
    return BuildPrompt(field, sampling, "salt", generation_prompt, *tok_, limits_);
  }
  // Expects INVALID_ARGUMENT (or `code`) with `needle` in the message.
  void ExpectRefused(const absl::StatusOr<Prompt>& p, const std::string& needle,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    ASSERT_FALSE(p.ok()) << "accepted; expected a refusal mentioning " << needle;
    EXPECT_EQ(p.status().code(), code) << p.status();
    EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status();
  }

  const tokenizer::Tokenizer* tok_ = nullptr;
  PromptLimits limits_;
};

TEST_F(PromptTest, EachChunkGetsItsChatMLPieceAndTheGenerationPromptComesLast) {
  auto p = Build({Text(cascade::v2::CHUNK_KIND_SYSTEM, "You are terse."),
                  Text(cascade::v2::CHUNK_KIND_CONTEXT, "Paris is in France."),
                  Text(cascade::v2::CHUNK_KIND_QUERY, "Where is Paris?")});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->chunks.size(), 4u);
  EXPECT_EQ(p->chunks[0].tokens, Encode("<|im_start|>system\nYou are terse.<|im_end|>\n"));
  EXPECT_EQ(p->chunks[1].tokens, Encode("<|im_start|>user\nParis is in France.<|im_end|>\n"));
  EXPECT_EQ(p->chunks[2].tokens, Encode("<|im_start|>user\nWhere is Paris?<|im_end|>\n"));
  EXPECT_EQ(p->chunks[3].kind, cascade::v2::CHUNK_KIND_GENERATION_PROMPT);
  EXPECT_EQ(p->chunks[3].tokens, Encode("<|im_start|>assistant\n"));
  int64_t total = 0;
  for (const PromptChunk& c : p->chunks) total += static_cast<int64_t>(c.tokens.size());
  EXPECT_EQ(p->num_tokens, total);
  EXPECT_EQ(p->cache_salt, "salt");
}

// enable_thinking false: the generation prompt ends in Qwen3's empty think block (one more
// piece of the same last chunk), the client's chunks unchanged; without the generation prompt
// it changes nothing.
TEST_F(PromptTest, ThinkingOffEndsTheGenerationPromptInAnEmptyThinkBlock) {
  RepeatedPtrField<Chunk> field;
  *field.Add() = Text(cascade::v2::CHUNK_KIND_QUERY, "Where is Paris?");
  auto on = BuildPrompt(field, {}, "salt", true, *tok_, limits_);
  auto off = BuildPrompt(field, {}, "salt", true, *tok_, limits_, /*enable_thinking=*/false);
  ASSERT_TRUE(on.ok() && off.ok());
  ASSERT_EQ(off->chunks.size(), 2u);
  EXPECT_EQ(off->chunks[0].tokens, on->chunks[0].tokens);
  EXPECT_EQ(off->chunks[1].kind, cascade::v2::CHUNK_KIND_GENERATION_PROMPT);
  EXPECT_EQ(off->chunks[1].tokens, Encode("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_EQ(off->num_tokens, on->num_tokens + 4);
  auto raw = BuildPrompt(field, {}, "salt", false, *tok_, limits_, false);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->chunks.size(), 1u);
}

TEST_F(PromptTest, WithoutTheGenerationPromptTheClientsChunksAreAll) {
  auto p = Build({Text(cascade::v2::CHUNK_KIND_RAW, "plain text")}, {}, false);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->chunks.size(), 1u);
  EXPECT_EQ(p->chunks[0].tokens, Encode("plain text")) << "RAW chunks get no template";
}

TEST_F(PromptTest, TokenIdChunksPassThroughWithinTheModelsVocabulary) {
  const int64_t tokenizer_vocab = tok_->vocab_size();
  limits_.vocab_size = tokenizer_vocab + 100;  // the model's, larger than the tokenizer's
  const int32_t beyond_text = static_cast<int32_t>(tokenizer_vocab + 5);
  Chunk c = Ids(cascade::v2::CHUNK_KIND_RAW, {1, 2, beyond_text});
  c.set_cache_salt("tenant");
  auto p = Build({c}, {}, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->chunks[0].tokens, (std::vector<int32_t>{1, 2, beyond_text}));
  EXPECT_EQ(p->chunks[0].cache_salt, "tenant");

  const int32_t first_outside = static_cast<int32_t>(limits_.vocab_size);
  ExpectRefused(Build({Ids(cascade::v2::CHUNK_KIND_RAW, {1, first_outside})}),
                "chunks[0].token_ids[1]");
  ExpectRefused(Build({Ids(cascade::v2::CHUNK_KIND_RAW, {-1})}), "chunks[0].token_ids[0] = -1");
}

TEST_F(PromptTest, BadChunksAreRefusedNamingTheField) {
  ExpectRefused(Build({}), "chunks: at least one chunk");
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_UNSPECIFIED, "x")}), "chunks[0].kind");
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "x"),
                       Text(cascade::v2::CHUNK_KIND_GENERATION_PROMPT, "x")}),
                "chunks[1].kind: GENERATION_PROMPT is added by the gateway");
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "")}), "chunks[0].text is empty");
  ExpectRefused(Build({Ids(cascade::v2::CHUNK_KIND_RAW, {})}), "chunks[0].token_ids is empty");
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "ok"),
                       Text(cascade::v2::CHUNK_KIND_QUERY, std::string("\xc3\x28", 2))}),
                "chunks[1].text is not valid UTF-8");
  limits_.max_chunks = 2;
  ExpectRefused(
      Build({Text(cascade::v2::CHUNK_KIND_QUERY, "a"), Text(cascade::v2::CHUNK_KIND_QUERY, "b"),
             Text(cascade::v2::CHUNK_KIND_QUERY, "c")}),
      "3 chunks, at most 2");
}

TEST_F(PromptTest, SizesAreRefusedBeforeTokenizing) {
  limits_.max_prompt_bytes = 100;
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, std::string(101, 'a'))}),
                "at most 100 per request", absl::StatusCode::kResourceExhausted);
  // Ids count 4 bytes each.
  ExpectRefused(Build({Ids(cascade::v2::CHUNK_KIND_RAW, std::vector<int32_t>(26, 1))}), "104 bytes",
                absl::StatusCode::kResourceExhausted);
  limits_.max_prompt_bytes = 1 << 20;
  limits_.max_context = 64;
  ExpectRefused(Build({Ids(cascade::v2::CHUNK_KIND_RAW, std::vector<int32_t>(65, 1))}),
                "65 token ids, more than the model's context length (64 tokens)");
}

TEST_F(PromptTest, UnsetMaxTokensIsTheSharedDefaultAndIsSentExplicitly) {
  auto p = Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(worker::kDefaultMaxTokens, 256);
  EXPECT_TRUE(p->sampling.has_max_tokens());
  EXPECT_EQ(p->sampling.max_tokens(), worker::kDefaultMaxTokens);
  // What a worker called directly with the same unset field would use.
  EXPECT_EQ(worker::SamplingFromProto(cascade::v2::SamplingParams()).max_tokens,
            worker::kDefaultMaxTokens);

  limits_.default_max_tokens = 9;  // --default_max_tokens
  auto q = Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->sampling.max_tokens(), 9);
  cascade::v2::SamplingParams s;
  s.set_max_tokens(3);
  auto r = Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sampling.max_tokens(), 3);
}

TEST_F(PromptTest, TheGatewayPicksASeedWhenTheClientSetsNoneAndKeepsTheClients) {
  auto a = Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")});
  auto b = Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->sampling.has_seed());
  EXPECT_TRUE(b->sampling.has_seed());
  EXPECT_NE(a->sampling.seed(), b->sampling.seed());
  cascade::v2::SamplingParams s;
  s.set_seed(42);
  auto c = Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->sampling.seed(), 42u);
}

TEST_F(PromptTest, BadSamplingIsRefusedNamingTheField) {
  cascade::v2::SamplingParams s;
  s.set_temperature(-1);
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s), "sampling.temperature");
  s = {};
  s.set_max_tokens(0);
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s), "sampling.max_tokens");
  s = {};
  s.set_max_tokens(static_cast<int32_t>(limits_.max_context));
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s),
                "exceeds the model's context length");
  s = {};
  for (int i = 0; i <= limits_.max_stop_strings; ++i) s.add_stop("x");
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s), "sampling.stop: at most");
  s = {};
  s.add_stop("ok");
  s.add_stop("");
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s), "sampling.stop[1] is empty");
  s = {};
  s.add_stop(std::string(limits_.max_stop_string_bytes + 1, 'a'));
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s), "sampling.stop[0] must be");
  s = {};
  s.set_max_tokens(4);
  s.set_min_tokens(5);
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s),
                "sampling.min_tokens must be in [0, max_tokens (4)], got 5");
  s.set_min_tokens(-1);
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s), "sampling.min_tokens");
  s.set_min_tokens(4);
  EXPECT_TRUE(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s).ok());
}

TEST_F(PromptTest, StopTokenIdsAreBoundedLikeStopStrings) {
  // Every generated token is looked up in the list on the engine's thread, so a request with a
  // million of them (a few MB on the wire) would slow every step of everyone's batch.
  cascade::v2::SamplingParams s;
  for (int i = 0; i < 100000; ++i) s.add_stop_token_ids(1);
  ExpectRefused(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s),
                "sampling.stop_token_ids: 100000 ids, at most");
  s.mutable_stop_token_ids()->Truncate(64);
  EXPECT_TRUE(Build({Text(cascade::v2::CHUNK_KIND_QUERY, "Hi")}, s).ok());
}

TEST_F(PromptTest, TheWorkerRequestCarriesThePromptAndSamplingButNotStopStrings) {
  cascade::v2::SamplingParams s;
  s.set_temperature(0.5f);
  s.set_top_k(5);
  s.add_stop("END");
  s.add_stop_token_ids(7);
  Chunk salted = Text(cascade::v2::CHUNK_KIND_CONTEXT, "doc");
  salted.set_cache_salt("private");
  auto p = Build({Text(cascade::v2::CHUNK_KIND_SYSTEM, "sys"), salted}, s);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->stop, std::vector<std::string>{"END"});
  cascade::v2::WorkerServiceGenerateRequest r = ToWorkerRequest(*p, "req-9", "tiny");
  EXPECT_EQ(r.request_id(), "req-9");
  EXPECT_EQ(r.model(), "tiny");
  EXPECT_EQ(r.cache_salt(), "salt");
  ASSERT_EQ(r.chunks_size(), 3);
  for (int i = 0; i < r.chunks_size(); ++i) {
    EXPECT_EQ(r.chunks(i).kind(), p->chunks[i].kind);
    EXPECT_EQ(std::vector<int32_t>(r.chunks(i).token_ids().begin(), r.chunks(i).token_ids().end()),
              p->chunks[i].tokens);
    EXPECT_EQ(r.chunks(i).cache_salt(), p->chunks[i].cache_salt);
    EXPECT_TRUE(r.chunks(i).hash().empty()) << "hashes come from the registry (Route)";
  }
  EXPECT_EQ(r.chunks(1).cache_salt(), "private");
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_EQ(r.sampling().top_k(), 5);
  EXPECT_EQ(r.sampling().stop_token_ids_size(), 1);
  EXPECT_EQ(r.sampling().stop_size(), 0) << "the gateway matches stop strings itself";
  EXPECT_EQ(r.sampling().max_tokens(), worker::kDefaultMaxTokens);
  EXPECT_EQ(r.sampling().seed(), p->sampling.seed());
}

TEST_F(PromptTest, ChunkSpecsViewThePromptsChunks) {
  auto p = Build({Text(cascade::v2::CHUNK_KIND_SYSTEM, "sys")});
  ASSERT_TRUE(p.ok());
  const std::vector<hash::ChunkSpec> specs = ChunkSpecs(*p);
  ASSERT_EQ(specs.size(), p->chunks.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].kind, p->chunks[i].kind);
    EXPECT_EQ(specs[i].tokens.data(), p->chunks[i].tokens.data());
    EXPECT_EQ(specs[i].tokens.size(), p->chunks[i].tokens.size());
  }
}

TEST_F(PromptTest, CheckModelAcceptsOursOrNoneAndNamesBothOtherwise) {
  EXPECT_TRUE(CheckModel("", limits_).ok());
  EXPECT_TRUE(CheckModel("tiny", limits_).ok());
  absl::Status s = CheckModel("gpt-9", limits_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'gpt-9' is not served here"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'tiny'"), std::string::npos) << s;
}

TEST_F(PromptTest, MaxRequestBytesFitsTheLargestValidPrompt) {
  limits_.max_prompt_bytes = 4000;
  // The largest valid prompt by the byte rule: 1000 ids, each up to 5 bytes on the wire.
  cascade::v2::GenerateRequest req;
  auto* c = req.add_chunks();
  c->set_kind(cascade::v2::CHUNK_KIND_RAW);
  for (int i = 0; i < 1000; ++i) c->mutable_token_ids()->add_ids(150000);
  EXPECT_LE(req.ByteSizeLong(), MaxRequestBytes(limits_));
  PromptLimits bigger = limits_;
  bigger.max_prompt_bytes *= 2;
  EXPECT_GT(MaxRequestBytes(bigger), MaxRequestBytes(limits_));
}

}  // namespace
}  // namespace cascade::gateway
