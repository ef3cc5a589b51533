// The OpenAI JSON mapping (openai_api.h): messages onto chunks, sampling fields, refusals of what
// Cascade does not implement, and the response objects built from Generate events.
#include "services/gateway/openai_api.h"

#include <gtest/gtest.h>

namespace cascade::gateway::openai {
namespace {

using nlohmann::json;

TEST(OpenAiApiTest, ChatMessagesBecomeChunksOfTheirKinds) {
  json body = {{"model", "m"},
               {"messages",
                {{{"role", "system"}, {"content", "be brief"}},
                 {{"role", "user"},
                  {"content", "a long document"},
                  {"chunk_kind", "context"},
                  {"cache_salt", "tenant-a"}},
                 {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "ok"}}}}},
                 {{"role", "user"}, {"content", "question"}}}},
               {"max_completion_tokens", 7},
               {"temperature", 0.5},
               {"seed", 3}};
  auto t = TranslateRequest(body, Endpoint::kChat, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  const auto& r = t->request;
  ASSERT_EQ(r.chunks_size(), 4);
  EXPECT_EQ(r.chunks(0).kind(), cascade::v2::CHUNK_KIND_SYSTEM);
  EXPECT_EQ(r.chunks(1).kind(), cascade::v2::CHUNK_KIND_CONTEXT);
  EXPECT_EQ(r.chunks(1).cache_salt(), "tenant-a");
  EXPECT_EQ(r.chunks(2).kind(), cascade::v2::CHUNK_KIND_ASSISTANT);
  EXPECT_EQ(r.chunks(2).text(), "ok");
  EXPECT_EQ(r.chunks(3).kind(), cascade::v2::CHUNK_KIND_QUERY);
  EXPECT_TRUE(r.add_generation_prompt());
  EXPECT_EQ(r.sampling().max_tokens(), 7);
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_EQ(r.sampling().seed(), 3u);
}

TEST(OpenAiApiTest, CompletionPromptsAreRawTextOrTokenIds) {
  auto text = TranslateRequest({{"prompt", "Hello"}}, Endpoint::kCompletions, "m");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->request.chunks(0).kind(), cascade::v2::CHUNK_KIND_RAW);
  EXPECT_EQ(text->request.chunks(0).text(), "Hello");
  EXPECT_FALSE(text->request.add_generation_prompt());
  auto ids = TranslateRequest({{"prompt", {1, 2, 3}}}, Endpoint::kCompletions, "m");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->request.chunks(0).token_ids().ids_size(), 3);
  auto chunks = TranslateRequest(
      {{"chunks", {{{"kind", "system"}, {"text", "s"}}, {{"kind", "query"}, {"text", "q"}}}}},
      Endpoint::kCompletions, "m");
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_EQ(chunks->request.chunks(0).kind(), cascade::v2::CHUNK_KIND_SYSTEM);
  EXPECT_EQ(chunks->request.chunks(1).kind(), cascade::v2::CHUNK_KIND_QUERY);
}

TEST(OpenAiApiTest, OutOfRangeMaxTokensIsRefusedNamingTheFieldAndBothBounds) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  struct Case {
    const char* key;
    json value;
  };
  for (const Case& c :
       {Case{"max_tokens", 10000000000LL}, Case{"max_tokens", -3}, Case{"max_completion_tokens", 0},
        Case{"max_tokens", 18446744073709551615ULL}}) {
    json body = chat;
    body[c.key] = c.value;
    auto t = TranslateRequest(body, Endpoint::kChat, "m");
    ASSERT_FALSE(t.ok()) << c.key << " " << c.value;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message(),
              std::string(c.key) + " must be at least 1 and at most the context length")
        << c.value;
  }
  json body = chat;
  body["max_tokens"] = 1e308;
  auto t = TranslateRequest(body, Endpoint::kChat, "m");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "max_tokens must be an integer");
}

TEST(OpenAiApiTest, WhatIsNotImplementedIsRefusedByName) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, json>>{{"best_of", 2},
                                                 {"presence_penalty", 2.5},
                                                 {"frequency_penalty", -3},
                                                 {"frequency_penalty", "1"},
                                                 {"logit_bias", {{"5", 101}}},
                                                 {"logit_bias", {{"5", "1"}}},
                                                 {"logit_bias", {{"-5", 1}}},
                                                 {"logit_bias", {{"x", 1}}},
                                                 {"logit_bias", {{"99999999999", 1}}},
                                                 {"logit_bias", json::array({1, 2})},
                                                 {"tools", {{{"type", "function"}}}},
                                                 {"prompt_logprobs", 21},
                                                 {"prompt_logprobs", -1},
                                                 {"prompt_logprobs", "2"},
                                                 {"guided_choice", json::array({"a"})},
                                                 {"truncate_prompt_tokens", 10},
                                                 {"skip_special_tokens", false},
                                                 {"spaces_between_special_tokens", false},
                                                 {"response_format", {{"type", "json_object"}}}}) {
    json body = chat;
    body[key] = value;
    auto t = TranslateRequest(body, Endpoint::kChat, "m");
    ASSERT_FALSE(t.ok()) << key;
    EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << key;
    EXPECT_NE(t.status().message().find(key), absl::string_view::npos) << t.status();
  }
  // Defaults that ask for nothing are fine.
  json fine = chat;
  fine["n"] = 1;
  fine["presence_penalty"] = 0;
  fine["logit_bias"] = json::object();
  fine["skip_special_tokens"] = true;
  fine["prompt_logprobs"] = nullptr;
  EXPECT_TRUE(TranslateRequest(fine, Endpoint::kChat, "m").ok());
}

// vLLM's include_stop_str_in_output reaches the request (false unless set); not a boolean: refused.
TEST(OpenAiApiTest, IncludeStopStrInOutputIsTranslated) {
  auto t =
      TranslateRequest(json{{"prompt", "hi"}, {"stop", "x"}, {"include_stop_str_in_output", true}},
                       Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->request.sampling().include_stop_str_in_output());
  auto plain = TranslateRequest(json{{"prompt", "hi"}}, Endpoint::kCompletions, "m");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->request.sampling().include_stop_str_in_output());
  EXPECT_FALSE(TranslateRequest(json{{"prompt", "hi"}, {"include_stop_str_in_output", 1}},
                                Endpoint::kCompletions, "m")
                   .ok());
}

// vLLM's min_tokens goes to the worker as it is; a negative or non-integer one is refused by
// name (the gateway checks it against max_tokens).
TEST(OpenAiApiTest, MinTokensIsTranslated) {
  auto t = TranslateRequest(json{{"prompt", "hi"}, {"min_tokens", 5}, {"max_tokens", 9}},
                            Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->request.sampling().min_tokens(), 5);
  for (const json& bad : {json(-1), json(2.5), json("3")}) {
    auto b =
        TranslateRequest(json{{"prompt", "hi"}, {"min_tokens", bad}}, Endpoint::kCompletions, "m");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("min_tokens"), absl::string_view::npos) << b.status();
  }
}

// vLLM's chat_template_kwargs: enable_thinking reaches the request (unset when not given);
// another key, a non-boolean value or the field on completions is refused by name.
TEST(OpenAiApiTest, ChatTemplateKwargsTakeEnableThinking) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto plain = TranslateRequest(chat, Endpoint::kChat, "m");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->request.has_enable_thinking());
  for (const bool on : {false, true}) {
    json body = chat;
    body["chat_template_kwargs"] = {{"enable_thinking", on}};
    auto t = TranslateRequest(body, Endpoint::kChat, "m");
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->request.has_enable_thinking());
    EXPECT_EQ(t->request.enable_thinking(), on);
  }
  for (const json& bad :
       {json{{"tools_mode", true}}, json{{"enable_thinking", "no"}}, json::array({1})}) {
    json body = chat;
    body["chat_template_kwargs"] = bad;
    auto t = TranslateRequest(body, Endpoint::kChat, "m");
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("chat_template_kwargs"), absl::string_view::npos)
        << t.status();
  }
  auto c = TranslateRequest(
      json{{"prompt", "hi"}, {"chat_template_kwargs", {{"enable_thinking", false}}}},
      Endpoint::kCompletions, "m");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("chat completions only"), absl::string_view::npos);
}

// OpenAI's logit_bias goes to the worker as a map of token ids to biases.
TEST(OpenAiApiTest, LogitBiasIsTranslated) {
  const json body = {{"prompt", "hi"},
                     {"logit_bias", {{"5", 1.5}, {"151000", -100}, {"0", 100}, {"7", 0}}}};
  auto t = TranslateRequest(body, Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  const auto& bias = t->request.sampling().logit_bias();
  ASSERT_EQ(bias.size(), 4u);
  EXPECT_FLOAT_EQ(bias.at(5), 1.5f);
  EXPECT_FLOAT_EQ(bias.at(151000), -100.0f);
  EXPECT_FLOAT_EQ(bias.at(0), 100.0f);
  EXPECT_FLOAT_EQ(bias.at(7), 0.0f);
}

// OpenAI's frequency and presence penalties go to the worker as they are (in [-2, 2]).
TEST(OpenAiApiTest, PenaltiesAreTranslated) {
  const json body = {{"prompt", "hi"}, {"frequency_penalty", -1.5}, {"presence_penalty", 2}};
  auto t = TranslateRequest(body, Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->request.sampling().frequency_penalty(), -1.5f);
  EXPECT_EQ(t->request.sampling().presence_penalty(), 2.0f);
  auto none = TranslateRequest(json{{"prompt", "hi"}}, Endpoint::kCompletions, "m");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->request.sampling().frequency_penalty(), 0.0f);
  EXPECT_EQ(none->request.sampling().presence_penalty(), 0.0f);
}

// n: 1 to kMaxChoices choices, each its own Generate request; with a seed, choice i samples
// with seed + i (choice 0 is the request alone), without one the gateway seeds each stream.
TEST(OpenAiApiTest, ChoicesAreCountedAndSeededApart) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"seed", 7}};
  for (const json& bad : {json(0), json(kMaxChoices + 1), json(2.5), json("2"), json(-1),
                          json(18446744073709551615ULL)}) {
    json body = chat;
    body["n"] = bad;
    auto t = TranslateRequest(body, Endpoint::kChat, "m");
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().message(), "n must be an integer from 1 to " + std::to_string(kMaxChoices))
        << bad;
  }
  json body = chat;
  body["n"] = 3;
  auto t = TranslateRequest(body, Endpoint::kChat, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->meta.n, 3);
  EXPECT_EQ(TranslateRequest(chat, Endpoint::kChat, "m")->meta.n, 1);
  EXPECT_EQ(ChoiceRequest(*t, 0).sampling().seed(), 7u);
  EXPECT_EQ(ChoiceRequest(*t, 2).sampling().seed(), 9u);
  EXPECT_EQ(ChoiceRequest(*t, 2).chunks(0).text(), "hi");  // the same prompt
  body.erase("seed");
  t = TranslateRequest(body, Endpoint::kChat, "m");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(ChoiceRequest(*t, 1).sampling().has_seed());
}

// A completions prompt list: one request a prompt (the rest of the body alike), n choices each,
// choice p n + s the prompt p's with its seed moved by s (so a listed prompt gives what it gives
// alone); at most kMaxPrompts prompts and kMaxChoicesInAll choices in all.
TEST(OpenAiApiTest, APromptListIsOneRequestAPrompt) {
  json body = {{"prompt", json::array({"a", "bb", json::array({5, 6})})},
               {"n", 2},
               {"seed", 10},
               {"max_tokens", 3}};
  auto t = TranslateRequest(body, Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->meta.prompts, 3);
  ASSERT_EQ(t->more_prompts.size(), 2u);
  EXPECT_EQ(t->request.chunks_size(), 1);
  EXPECT_EQ(t->request.chunks(0).text(), "a");
  EXPECT_EQ(t->more_prompts[0].chunks(0).text(), "bb");
  EXPECT_EQ(t->more_prompts[1].chunks(0).token_ids().ids_size(), 2);
  EXPECT_EQ(t->more_prompts[1].sampling().max_tokens(), 3);
  const std::vector<std::pair<std::string, uint64_t>> want = {{"a", 10},  {"a", 11}, {"bb", 10},
                                                              {"bb", 11}, {"", 10},  {"", 11}};
  for (int i = 0; i < 6; ++i) {
    const cascade::v2::GenerateRequest r = ChoiceRequest(*t, i);
    EXPECT_EQ(r.chunks(0).text(), want[i].first) << i;
    EXPECT_EQ(r.sampling().seed(), want[i].second) << i;
  }
  // One prompt in a list, and a token-id prompt, are one prompt.
  for (const json& one : {json::array({"a"}), json::array({1, 2, 3})}) {
    auto single = TranslateRequest({{"prompt", one}}, Endpoint::kCompletions, "m");
    ASSERT_TRUE(single.ok()) << one;
    EXPECT_EQ(single->meta.prompts, 1);
    EXPECT_TRUE(single->more_prompts.empty());
  }
  json too_many = {{"prompt", json::array()}};
  for (int i = 0; i <= kMaxPrompts; ++i) too_many["prompt"].push_back("x");
  EXPECT_EQ(TranslateRequest(too_many, Endpoint::kCompletions, "m").status().message(),
            "prompt lists at most " + std::to_string(kMaxPrompts) + " prompts");
  json over = {{"prompt", json::array({"a", "b", "c", "d", "e"})}, {"n", kMaxChoices}};
  EXPECT_TRUE(
      absl::IsInvalidArgument(TranslateRequest(over, Endpoint::kCompletions, "m").status()));
  for (const json& bad : {json::array({"a", 3}), json::array({json::array()}),
                          json::array({"a", json::array({1, "x"})}), json::array()}) {
    EXPECT_TRUE(absl::IsInvalidArgument(
        TranslateRequest({{"prompt", bad}}, Endpoint::kCompletions, "m").status()))
        << bad;
  }
}

TEST(OpenAiApiTest, WrongTypesAndUnknownModelsAreClearErrors) {
  EXPECT_TRUE(
      absl::IsInvalidArgument(TranslateRequest(json::array(), Endpoint::kChat, "m").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      TranslateRequest({{"messages", "hi"}}, Endpoint::kChat, "m").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      TranslateRequest({{"prompt", "x"}, {"temperature", "hot"}}, Endpoint::kCompletions, "m")
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      TranslateRequest({{"prompt", "x"}, {"stream", 1}}, Endpoint::kCompletions, "m").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      TranslateRequest({{"prompt", {1, "a"}}}, Endpoint::kCompletions, "m").status()));
  auto other = TranslateRequest({{"prompt", "x"}, {"model", std::string(5000, 'g')}},
                                Endpoint::kCompletions, "m");
  EXPECT_TRUE(absl::IsNotFound(other.status()));
  EXPECT_LT(other.status().message().size(), 200u) << "the echoed model is bounded";
  EXPECT_EQ(HttpStatusFor(other.status()), 404);
  EXPECT_EQ(ErrorBody(other.status())["error"]["code"], "model_not_found");
}

TEST(OpenAiApiTest, ChatLogprobsAskForTheSampledTokenAtLeast) {
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"logprobs", true}};
  auto t = TranslateRequest(body, Endpoint::kChat, "m");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->meta.logprobs);
  EXPECT_EQ(t->request.sampling().logprobs(), 1);
  body["top_logprobs"] = 5;
  t = TranslateRequest(body, Endpoint::kChat, "m");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->request.sampling().logprobs(), 5);
  body["logprobs"] = false;
  EXPECT_FALSE(TranslateRequest(body, Endpoint::kChat, "m").ok());
}

cascade::v2::GenerateResponse Start(int64_t prompt, int64_t cached) {
  cascade::v2::GenerateResponse e;
  e.mutable_start()->set_request_id("r1");
  e.mutable_start()->set_prompt_tokens(prompt);
  e.mutable_start()->set_cached_tokens(cached);
  return e;
}
cascade::v2::GenerateResponse Delta(const std::string& text) {
  cascade::v2::GenerateResponse e;
  e.mutable_delta()->set_text(text);
  e.mutable_delta()->add_token_ids(1);
  return e;
}
cascade::v2::GenerateResponse Finish(int64_t prompt, int64_t cached, int64_t completion) {
  cascade::v2::GenerateResponse e;
  e.mutable_finish()->set_finish_reason(cascade::v2::FINISH_REASON_STOP_STRING);
  e.mutable_finish()->mutable_usage()->set_prompt_tokens(prompt);
  e.mutable_finish()->mutable_usage()->set_cached_tokens(cached);
  e.mutable_finish()->mutable_usage()->set_completion_tokens(completion);
  return e;
}

TEST(OpenAiApiTest, AWholeChatResponseCarriesTextFinishAndCachedTokens) {
  RequestMeta meta{Endpoint::kChat, false, false, false};
  ResponseBuilder b(meta, "m", 1700000000);
  EXPECT_TRUE(b.OnEvent(Start(100, 96)).empty());
  EXPECT_TRUE(b.OnEvent(Delta("Hel")).empty());
  EXPECT_TRUE(b.OnEvent(Delta("lo")).empty());
  EXPECT_TRUE(b.OnEvent(Finish(100, 96, 2)).empty());
  json r = b.Final();
  EXPECT_EQ(r["id"], "chatcmpl-r1");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 102);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
}

// Qwen3's reasoning parser: a completion that starts with <think> splits at </think>; one that
// does not is all content; one cut off inside the block is all reasoning. Fed in pieces cut at
// every pair of byte positions, the parts add up to the whole text's split.
TEST(OpenAiApiTest, ReasoningSplitterSplitsAtThinkAlikeInAnyPieces) {
  struct Case {
    std::string text, reasoning, content;
  };
  const std::vector<Case> cases = {
      {"<think>\nLet me see.\n</think>\n\nParis.", "\nLet me see.\n", "\n\nParis."},
      {"<think>\n\n</think>\n\nHi", "\n\n", "\n\nHi"},
      {"Paris. <think>not at the start</think>", "", "Paris. <think>not at the start</think>"},
      {"<thin", "", "<thin"},
      {"<think>cut off </thi", "cut off </thi", ""},
      {"<think></think>", "", ""},
      {"", "", ""},
  };
  for (const Case& c : cases) {
    for (size_t i = 0; i <= c.text.size(); ++i) {
      for (size_t j = i; j <= c.text.size(); ++j) {
        ReasoningSplitter s;
        std::string reasoning, content;
        for (auto piece : {c.text.substr(0, i), c.text.substr(i, j - i), c.text.substr(j)}) {
          ReasoningSplitter::Parts p = s.Add(piece);
          reasoning += p.reasoning, content += p.content;
        }
        ReasoningSplitter::Parts p = s.Finish();
        reasoning += p.reasoning, content += p.content;
        ASSERT_EQ(reasoning, c.reasoning) << c.text << " cut at " << i << ", " << j;
        ASSERT_EQ(content, c.content) << c.text << " cut at " << i << ", " << j;
      }
    }
  }
}

// --reasoning_parser=qwen3 on a chat: the whole response's message has reasoning_content beside
// content; a stream sends each part as it is known (the block's end held back until it is
// complete), and without a think block reasoning_content is null.
TEST(OpenAiApiTest, ChatReasoningGoesToReasoningContent) {
  RequestMeta meta{Endpoint::kChat, false, false, false};
  meta.reasoning = true;
  ResponseBuilder whole(meta, "m", 1700000000);
  whole.OnEvent(Start(10, 0));
  for (const char* piece : {"<think>", "\nhmm\n</th", "ink>\n\nParis", "."}) {
    EXPECT_TRUE(whole.OnEvent(Delta(piece)).empty());
  }
  whole.OnEvent(Finish(10, 0, 4));
  json msg = whole.Final()["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "\nhmm\n");
  EXPECT_EQ(msg["content"], "\n\nParis.");

  meta.stream = true;
  ResponseBuilder stream(meta, "m", 1700000000);
  stream.OnEvent(Start(10, 0));  // the role chunk
  std::vector<json> deltas;
  for (const char* piece : {"<think>", "\nhmm\n</th", "ink>\n\nParis", "."}) {
    for (json& c : stream.OnEvent(Delta(piece))) deltas.push_back(c["choices"][0]["delta"]);
  }
  for (json& c : stream.OnEvent(Finish(10, 0, 4))) deltas.push_back(c["choices"][0]["delta"]);
  ASSERT_EQ(deltas.size(), 4u);  // "<think>" alone sends nothing
  EXPECT_EQ(deltas[0], json({{"reasoning_content", "\nhmm\n"}}));
  EXPECT_EQ(deltas[1], json({{"content", "\n\nParis"}}));
  EXPECT_EQ(deltas[2], json({{"content", "."}}));
  EXPECT_EQ(deltas[3], json::object());  // the finish chunk

  meta.stream = false;
  ResponseBuilder plain(meta, "m", 1700000000);
  plain.OnEvent(Start(10, 0));
  plain.OnEvent(Delta("Paris."));
  plain.OnEvent(Finish(10, 0, 1));
  msg = plain.Final()["choices"][0]["message"];
  EXPECT_TRUE(msg["reasoning_content"].is_null());
  EXPECT_EQ(msg["content"], "Paris.");
}

// vLLM's stop_reason: the stop string that ended a choice, the requested stop token id that did,
// or null (the model's EOS, the length limit), in the whole response and the stream's last chunk.
TEST(OpenAiApiTest, StopReasonNamesTheStopStringOrTheRequestedStopToken) {
  auto t = TranslateRequest(json{{"prompt", "hi"}, {"stop_token_ids", {7, 9}}},
                            Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->meta.stop_token_ids, (std::vector<int32_t>{7, 9}));
  auto finish = [](cascade::v2::FinishReason reason, const std::string& stop, int32_t id) {
    cascade::v2::GenerateResponse e = Finish(10, 0, 2);
    e.mutable_finish()->set_finish_reason(reason);
    e.mutable_finish()->set_stop_reason(stop);
    if (id >= 0) e.mutable_finish()->set_stop_token_id(id);
    return e;
  };
  struct Case {
    cascade::v2::GenerateResponse finish;
    json want;
  };
  const std::vector<Case> cases = {
      {finish(cascade::v2::FINISH_REASON_STOP_STRING, "END", -1), "END"},
      {finish(cascade::v2::FINISH_REASON_STOP, "x", 9), 9},
      {finish(cascade::v2::FINISH_REASON_STOP, "<|im_end|>", 151645), nullptr},  // EOS
      {finish(cascade::v2::FINISH_REASON_LENGTH, "", -1), nullptr},
  };
  for (const Case& c : cases) {
    for (const bool stream : {false, true}) {
      RequestMeta meta = t->meta;
      meta.stream = stream;
      ResponseBuilder b(meta, "m", 1700000000);
      b.OnEvent(Start(10, 0));
      b.OnEvent(Delta("ab"));
      std::vector<json> chunks = b.OnEvent(c.finish);
      const json choice = stream ? chunks.back()["choices"][0] : b.Final()["choices"][0];
      EXPECT_EQ(choice["stop_reason"], c.want) << c.finish.DebugString() << " stream " << stream;
    }
  }
}

// Chat logprobs carry each token's bytes, as OpenAI's do: a token's UTF-8 bytes, or for one that
// is not UTF-8 alone the bytes its text spells ("bytes:\xNN", the gateway's form for it).
TEST(OpenAiApiTest, ChatLogprobsCarryEachTokensBytes) {
  RequestMeta meta{Endpoint::kChat, false, false, true};
  ResponseBuilder b(meta, "m", 1700000000);
  EXPECT_TRUE(b.OnEvent(Start(10, 0)).empty());
  cascade::v2::GenerateResponse d = Delta("h\xc3\xa9");
  cascade::v2::LogprobEntry* e = d.mutable_delta()->add_logprobs();
  e->mutable_sampled()->set_text("h\xc3\xa9");  // "hé": 3 bytes
  e->mutable_sampled()->set_logprob(-0.5f);
  cascade::v2::TokenLogprob* alt = e->add_top();
  alt->set_text("bytes:\\xe4\\xb8");  // two bytes of a three-byte character
  alt->set_logprob(-2.f);
  cascade::v2::TokenLogprob* odd = e->add_top();
  odd->set_text("bytes:\\xZZ");  // not the escaped form: its own characters' bytes
  odd->set_logprob(-3.f);
  EXPECT_TRUE(b.OnEvent(d).empty());
  EXPECT_TRUE(b.OnEvent(Finish(10, 0, 1)).empty());
  json lp = b.Final()["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "h\xc3\xa9");
  EXPECT_EQ(lp["bytes"], json({0x68, 0xc3, 0xa9}));
  EXPECT_EQ(lp["top_logprobs"][0]["bytes"], json({0xe4, 0xb8}));
  EXPECT_EQ(lp["top_logprobs"][1]["bytes"].size(), std::string("bytes:\\xZZ").size());
}

// Completions logprobs carry text_offset: each token's start in the completion, in characters,
// across deltas, in the whole response and in each streamed chunk alike.
TEST(OpenAiApiTest, CompletionLogprobsCarryTextOffsets) {
  auto delta = [](const std::string& text, const std::vector<std::string>& tokens) {
    cascade::v2::GenerateResponse d = Delta(text);
    for (const std::string& t : tokens) {
      cascade::v2::LogprobEntry* e = d.mutable_delta()->add_logprobs();
      e->mutable_sampled()->set_text(t);
      e->mutable_sampled()->set_logprob(-1.f);
    }
    return d;
  };
  const std::vector<cascade::v2::GenerateResponse> deltas = {
      delta("Hel", {"He", "l"}),
      // "é" (c3 a9) split over two byte tokens: the second starts after the character.
      delta("lo \xc3\xa9", {"lo", " ", "bytes:\\xc3", "bytes:\\xa9"}),
      delta("\xe4\xb8\x80!", {"\xe4\xb8\x80", "!"}),  // a three-byte character, one token
  };
  const json want = {0, 2, 3, 5, 6, 7, 7, 8};
  for (bool stream : {false, true}) {
    RequestMeta meta{Endpoint::kCompletions, stream, false, true};
    ResponseBuilder b(meta, "m", 1700000000);
    b.OnEvent(Start(10, 0));
    json got = json::array();
    for (const auto& d : deltas) {
      for (const json& chunk : b.OnEvent(d)) {
        for (const json& o : chunk["choices"][0]["logprobs"]["text_offset"]) got.push_back(o);
      }
    }
    b.OnEvent(Finish(10, 0, 8));
    if (!stream) {
      json lp = b.Final()["choices"][0]["logprobs"];
      got = lp["text_offset"];
      EXPECT_EQ(lp["tokens"].size(), 8u);
    }
    EXPECT_EQ(got, want) << (stream ? "stream" : "whole");
  }
}

TEST(OpenAiApiTest, AChatStreamStartsWithTheRoleAndEndsWithTheFinishReason) {
  RequestMeta meta{Endpoint::kChat, true, true, false};
  ResponseBuilder b(meta, "m", 1700000000);
  auto first = b.OnEvent(Start(10, 0));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["choices"][0]["delta"]["role"], "assistant");
  auto mid = b.OnEvent(Delta("x"));
  ASSERT_EQ(mid.size(), 1u);
  EXPECT_EQ(mid[0]["choices"][0]["delta"]["content"], "x");
  EXPECT_TRUE(mid[0]["choices"][0]["finish_reason"].is_null());
  auto last = b.OnEvent(Finish(10, 0, 1));
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0]["choices"][0]["finish_reason"], "stop");
  json usage = b.UsageChunk();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 1);
}

// Completions' echo: each choice's text starts with its prompt's text (whole responses and
// streams, where the prompt is the choice's first chunk; a token-id prompt's as the tokenizer
// decodes it); refused on chat, for templated chunks, for token ids without a decoder or that
// do not decode, and for a value that is not a boolean.
TEST(OpenAiApiTest, EchoStartsEachChoiceWithItsPrompt) {
  auto t = TranslateRequest({{"prompt", {"Hello", "Bye"}}, {"n", 2}, {"echo", true}},
                            Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(t->meta.echo, nullptr);
  EXPECT_EQ(*t->meta.echo, (std::vector<std::string>{"Hello", "Bye"}));
  for (bool stream : {false, true}) {
    RequestMeta meta = t->meta;
    meta.stream = stream;
    ResponseBuilder b(meta, "m", 1700000000, /*index=*/3);  // prompt 1's second choice
    auto first = b.OnEvent(Start(3, 0));
    auto mid = b.OnEvent(Delta(" now"));
    b.OnEvent(Finish(3, 0, 1));
    if (stream) {
      ASSERT_EQ(first.size(), 1u);
      EXPECT_EQ(first[0]["choices"][0]["text"], "Bye");
      EXPECT_EQ(first[0]["choices"][0]["index"], 3);
      ASSERT_EQ(mid.size(), 1u);
      EXPECT_EQ(mid[0]["choices"][0]["text"], " now");
    } else {
      EXPECT_TRUE(first.empty());
      EXPECT_EQ(b.Final()["choices"][0]["text"], "Bye now");
    }
  }
  auto no_echo =
      TranslateRequest({{"prompt", "Hello"}, {"echo", false}}, Endpoint::kCompletions, "m");
  ASSERT_TRUE(no_echo.ok());
  EXPECT_EQ(no_echo->meta.echo, nullptr);
  // The chunks extension's raw text chunks are one prompt.
  auto chunks =
      TranslateRequest({{"chunks", {{{"text", "Hel"}}, {{"text", "lo"}}}}, {"echo", true}},
                       Endpoint::kCompletions, "m");
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_EQ(*chunks->meta.echo, (std::vector<std::string>{"Hello"}));
  const Detokenize decode = [](std::span<const int32_t> ids) -> absl::StatusOr<std::string> {
    std::string s;
    for (int32_t id : ids) {
      if (id > 100) return absl::InvalidArgumentError("no such token");
      s += "<" + std::to_string(id) + ">";
    }
    return s;
  };
  auto ids =
      TranslateRequest({{"prompt", json::array({json("a"), json::array({1, 2})})}, {"echo", true}},
                       Endpoint::kCompletions, "m", decode);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids->meta.echo, (std::vector<std::string>{"a", "<1><2>"}));
  auto undecodable =
      TranslateRequest({{"prompt", {7, 101}}, {"echo", true}}, Endpoint::kCompletions, "m", decode);
  ASSERT_FALSE(undecodable.ok());
  EXPECT_EQ(undecodable.status().message(), "echo: prompt does not decode (no such token)");
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"echo", true}},
       "echo is a /v1/completions option"},
      {{{"prompt", {1, 2, 3}}, {"echo", true}}, "echo of token ids (prompt) is not available here"},
      {{{"prompt", json::array({json("a"), json::array({1, 2})})}, {"echo", true}},
       "echo of token ids (prompt[1]) is not available here"},
      {{{"chunks", {{{"kind", "query"}, {"text", "hi"}}}}, {"echo", true}},
       "echo needs raw chunks (a templated chunk's text is not the prompt's)"},
      {{{"prompt", "hi"}, {"echo", 1}}, "echo must be true or false"},
  };
  for (const auto& [body, message] : refused) {
    const Endpoint e = body.contains("messages") ? Endpoint::kChat : Endpoint::kCompletions;
    auto r = TranslateRequest(body, e, "m");
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << body.dump();
    EXPECT_EQ(r.status().message(), message) << body.dump();
  }
}

// Completions' echo with logprobs asks every prompt for its prompt logprobs (as many top tokens
// as the completion's), and a choice's logprobs list the prompt's tokens first: the first (named
// in the start) with null logprobs, the others as the prompt_logprobs deltas score them, their
// text offsets from 0; then the completion's tokens, offset past the prompt. Streamed, the
// prompt's text and logprobs are one chunk before the first generated text.
TEST(OpenAiApiTest, EchoWithLogprobsListsThePromptsTokensFirst) {
  auto t = TranslateRequest({{"prompt", {"ab", "cd"}}, {"echo", true}, {"logprobs", 2}},
                            Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->meta.echo_logprobs);
  EXPECT_EQ(t->request.sampling().prompt_logprobs(), 2);
  ASSERT_EQ(t->more_prompts.size(), 1u);
  EXPECT_EQ(t->more_prompts[0].sampling().prompt_logprobs(), 2);
  auto plain = TranslateRequest({{"prompt", "ab"}, {"logprobs", 2}}, Endpoint::kCompletions, "m");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->request.sampling().has_prompt_logprobs());
  EXPECT_FALSE(plain->meta.echo_logprobs);
  auto entry = [](cascade::v2::LogprobEntry* e, int32_t id, const std::string& text, float lp) {
    e->mutable_sampled()->set_token_id(id);
    e->mutable_sampled()->set_text(text);
    e->mutable_sampled()->set_logprob(lp);
    auto* top = e->add_top();
    top->set_token_id(id + 100);
    top->set_text(text + "!");
    top->set_logprob(lp / 2);
  };
  cascade::v2::GenerateResponse start = Start(2, 0);
  start.mutable_start()->mutable_first_prompt_token()->set_token_id(5);
  start.mutable_start()->mutable_first_prompt_token()->set_text("a");
  cascade::v2::GenerateResponse prompt_lp;
  entry(prompt_lp.mutable_delta()->add_prompt_logprobs(), 6, "b", -3.0f);
  cascade::v2::GenerateResponse gen = Delta("X");
  entry(gen.mutable_delta()->add_logprobs(), 7, "X", -1.0f);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    RequestMeta meta = t->meta;
    meta.stream = stream;
    ResponseBuilder b(meta, "m", 1700000000);
    std::vector<json> chunks;
    for (const auto* ev : {&start, &prompt_lp, &gen}) {
      for (json& c : b.OnEvent(*ev)) chunks.push_back(std::move(c));
    }
    b.OnEvent(Finish(2, 0, 1));
    const json want = {{"tokens", {"a", "b", "X"}},
                       {"token_logprobs", {nullptr, -3.0, -1.0}},
                       {"top_logprobs", {nullptr, {{"b!", -1.5}}, {{"X!", -0.5}}}},
                       {"text_offset", {0, 1, 2}}};
    if (!stream) {
      EXPECT_TRUE(chunks.empty());
      const json c = b.Final()["choices"][0];
      EXPECT_EQ(c["text"], "abX");
      EXPECT_EQ(c["logprobs"], want);
      continue;
    }
    ASSERT_EQ(chunks.size(), 2u);
    EXPECT_EQ(chunks[0]["choices"][0]["text"], "ab");
    EXPECT_EQ(chunks[1]["choices"][0]["text"], "X");
    const json& p = chunks[0]["choices"][0]["logprobs"];
    const json& g = chunks[1]["choices"][0]["logprobs"];
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      json both = p[k];
      for (const auto& v : g[k]) both.push_back(v);
      EXPECT_EQ(both, want[k]) << k;
    }
  }
}

// vLLM's prompt_logprobs: asked of the worker (0-20; not streamed, as vLLM), and the whole
// response lists, per prompt token from the second, {"<id>": {logprob, rank, decoded_token}} with
// the prompt token first (its rank the worker's) and the asked number of top tokens ranked 1, 2,
// ...; a completion choice carries its prompt's, a chat response its own. With echo and logprobs
// the worker sends the larger count and each list takes its own.
TEST(OpenAiApiTest, PromptLogprobsAreVllmsPerTokenEntries) {
  auto t =
      TranslateRequest({{"prompt", "ab"}, {"prompt_logprobs", 1}}, Endpoint::kCompletions, "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->request.sampling().prompt_logprobs(), 1);
  EXPECT_EQ(t->meta.prompt_logprobs, 1);
  EXPECT_FALSE(t->meta.echo_logprobs);
  auto streamed = TranslateRequest({{"prompt", "ab"}, {"prompt_logprobs", 0}, {"stream", true}},
                                   Endpoint::kCompletions, "m");
  ASSERT_FALSE(streamed.ok());
  EXPECT_NE(streamed.status().message().find("prompt_logprobs"), absl::string_view::npos);
  auto both =
      TranslateRequest({{"prompt", "ab"}, {"prompt_logprobs", 3}, {"echo", true}, {"logprobs", 1}},
                       Endpoint::kCompletions, "m");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->request.sampling().prompt_logprobs(), 3);
  EXPECT_EQ(both->meta.echo_top, 1);
  auto chat = TranslateRequest(
      {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"prompt_logprobs", 2}},
      Endpoint::kChat, "m");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->request.sampling().prompt_logprobs(), 2);

  cascade::v2::GenerateResponse start = Start(3, 0);
  start.mutable_start()->mutable_first_prompt_token()->set_token_id(5);
  start.mutable_start()->mutable_first_prompt_token()->set_text("a");
  cascade::v2::GenerateResponse prompt_lp;
  auto entry = [&](int32_t id, const std::string& text, float lp, int32_t rank) {
    auto* e = prompt_lp.mutable_delta()->add_prompt_logprobs();
    e->mutable_sampled()->set_token_id(id);
    e->mutable_sampled()->set_text(text);
    e->mutable_sampled()->set_logprob(lp);
    e->set_rank(rank);
    for (int j = 0; j < 3; ++j) {  // the worker's larger count of top tokens
      auto* top = e->add_top();
      top->set_token_id(j == 0 && rank == 1 ? id : 100 + j);
      top->set_text(j == 0 && rank == 1 ? text : "t" + std::to_string(j));
      top->set_logprob(-0.5f - static_cast<float>(j));
    }
  };
  entry(6, "b", -0.5f, 1);  // the argmax: its own top entry (rank 1)
  entry(7, "c", -4.0f, 9);
  const json want =
      json::array({nullptr,
                   {{"6", {{"logprob", -0.5}, {"rank", 1}, {"decoded_token", "b"}}},
                    {"101", {{"logprob", -1.5}, {"rank", 2}, {"decoded_token", "t1"}}}},
                   {{"7", {{"logprob", -4.0}, {"rank", 9}, {"decoded_token", "c"}}},
                    {"100", {{"logprob", -0.5}, {"rank", 1}, {"decoded_token", "t0"}}},
                    {"101", {{"logprob", -1.5}, {"rank", 2}, {"decoded_token", "t1"}}}}});
  for (const Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    RequestMeta meta;
    meta.endpoint = endpoint;
    meta.prompt_logprobs = 2;
    ResponseBuilder b(meta, "m", 1700000000);
    for (const auto* ev : {&start, &prompt_lp}) EXPECT_TRUE(b.OnEvent(*ev).empty());
    b.OnEvent(Delta("X"));
    b.OnEvent(Finish(3, 0, 1));
    const json r = b.Final();
    if (endpoint == Endpoint::kChat) {
      EXPECT_EQ(r["prompt_logprobs"], want);
      EXPECT_FALSE(r["choices"][0].contains("prompt_logprobs"));
    } else {
      EXPECT_EQ(r["choices"][0]["prompt_logprobs"], want);
      EXPECT_FALSE(r.contains("prompt_logprobs"));
    }
  }
  // Echo with logprobs 1 beside prompt_logprobs 3: the echo's lists keep 1 top token.
  ResponseBuilder e(both->meta, "m", 1700000000);
  for (const auto* ev : {&start, &prompt_lp}) e.OnEvent(*ev);
  e.OnEvent(Delta("X"));
  e.OnEvent(Finish(3, 0, 1));
  const json r = e.Final()["choices"][0];
  ASSERT_EQ(r["logprobs"]["top_logprobs"].size(), 3u);  // a, b, c (X came without logprobs)
  EXPECT_EQ(r["logprobs"]["top_logprobs"][1], json({{"b", -0.5}}));
  EXPECT_EQ(r["logprobs"]["top_logprobs"][2], json({{"t0", -0.5}}));
  EXPECT_EQ(r["prompt_logprobs"].size(), 3u);
  EXPECT_EQ(r["prompt_logprobs"][2].size(), 4u);
}

// The choices of one request: one id (the first to start names it), their own indices in every
// chunk, and a whole response (or a stream's usage chunk) with the choices side by side, the
// prompt counted once and every choice's completion tokens.
TEST(OpenAiApiTest, ChoicesShareAnIdAndAreCombinedInOrder) {
  for (bool stream : {false, true}) {
    RequestMeta meta{Endpoint::kChat, stream, true, false, 2};
    auto id = std::make_shared<std::string>();
    ResponseBuilder a(meta, "m", 1700000000, 0, id), b(meta, "m", 1700000000, 1, id);
    cascade::v2::GenerateResponse second_start = Start(100, 0);
    second_start.mutable_start()->set_request_id("r2");
    std::vector<json> chunks = b.OnEvent(second_start);  // choice 1 starts first
    for (const json& c : a.OnEvent(Start(100, 96))) chunks.push_back(c);
    for (const json& c : a.OnEvent(Delta("x"))) chunks.push_back(c);
    for (const json& c : b.OnEvent(Delta("yz"))) chunks.push_back(c);
    for (const json& c : b.OnEvent(Finish(100, 0, 2))) chunks.push_back(c);
    for (const json& c : a.OnEvent(Finish(100, 96, 1))) chunks.push_back(c);
    if (stream) {
      ASSERT_EQ(chunks.size(), 6u);  // a role chunk, a delta and a finish per choice
      for (const json& c : chunks) EXPECT_EQ(c["id"], "chatcmpl-r2");
      EXPECT_EQ(chunks[0]["choices"][0]["index"], 1);
      EXPECT_EQ(chunks[2]["choices"][0]["index"], 0);
      EXPECT_EQ(chunks[3]["choices"][0]["delta"]["content"], "yz");
      EXPECT_EQ(chunks[3]["choices"][0]["index"], 1);
      json usage = CombinedUsageChunk({&a, &b}, 2);
      EXPECT_EQ(usage["id"], "chatcmpl-r2");
      EXPECT_TRUE(usage["choices"].empty());
      EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
      continue;
    }
    EXPECT_TRUE(chunks.empty());
    json r = CombinedFinal({&a, &b}, 2);
    EXPECT_EQ(r["id"], "chatcmpl-r2");
    ASSERT_EQ(r["choices"].size(), 2u);
    EXPECT_EQ(r["choices"][0]["index"], 0);
    EXPECT_EQ(r["choices"][0]["message"]["content"], "x");
    EXPECT_EQ(r["choices"][1]["index"], 1);
    EXPECT_EQ(r["choices"][1]["message"]["content"], "yz");
    EXPECT_EQ(r["usage"]["prompt_tokens"], 100);
    EXPECT_EQ(r["usage"]["completion_tokens"], 3);
    EXPECT_EQ(r["usage"]["total_tokens"], 103);
    EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 96);  // choice 0's
    EXPECT_EQ(CombinedFinal({&a}, 1), a.Final());  // one choice: its own response
    // Two prompts of one choice each: both prompts counted, each with its cached tokens.
    json two = CombinedFinal({&a, &b}, 1);
    EXPECT_EQ(two["usage"]["prompt_tokens"], 200);
    EXPECT_EQ(two["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
  }
}

}  // namespace
}  // namespace cascade::gateway::openai
