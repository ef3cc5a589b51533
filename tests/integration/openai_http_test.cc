// The OpenAI-compatible HTTP front over a real stack: completions and chat, streamed as
// server-sent events and whole, cached tokens reported on a repeat, the same tokens as the gRPC
// Generate for the same prompt, and bad input answered in OpenAI's error shape with its status.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

struct Http {
  explicit Http(int port) : client("127.0.0.1", port) { client.set_read_timeout(60); }
  httplib::Result Post(const std::string& path, const json& body,
                       const httplib::Headers& headers = {}) {
    return client.Post(path.c_str(), headers, body.dump(), "application/json");
  }
  httplib::Client client;
};

// The `data:` payloads of an SSE body, in order.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

json ChatBody(const std::string& system, const std::string& user, int max_tokens) {
  return json{{"model", "tiny"},
              {"messages",
               {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}}},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true}};
}

TEST(OpenAiHttpTest, ChatReportsCachedTokensOnARepeatAndMatchesGrpc) {
  Stack stack({.workers = 1, .http_port = 0});
  const int port = stack.gateway_server().http_port();
  ASSERT_GT(port, 0);
  Http http(port);
  const std::string system = LongSystemPrompt();
  auto first = http.Post("/v1/chat/completions", ChatBody(system, "What is Cascade?", 8));
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  json a = json::parse(first->body);
  EXPECT_EQ(a["object"], "chat.completion");
  EXPECT_EQ(a["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(a["usage"]["completion_tokens"], 8);
  const int64_t prompt_tokens = a["usage"]["prompt_tokens"];
  EXPECT_GT(prompt_tokens, 100);

  ASSERT_TRUE(stack.WaitForIdleLoad());
  auto second = http.Post("/v1/chat/completions", ChatBody(system, "What is Cascade?", 8));
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200) << second->body;
  json b = json::parse(second->body);
  EXPECT_GT(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 64)
      << "the repeat should reuse the system prompt's blocks";
  EXPECT_EQ(b["choices"][0]["message"]["content"], a["choices"][0]["message"]["content"])
      << "cached and cold must give the same text";

  // The same prompt through gRPC: same tokens, so the same text.
  Reply g = Generate(stack.gateway(), Req(system, "What is Cascade?", 8));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.text, a["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(g.start.prompt_tokens(), prompt_tokens);
}

TEST(OpenAiHttpTest, StreamedCompletionIsServerSentEventsEndingInDone) {
  Stack stack({.workers = 1, .http_port = 0});
  Http http(stack.gateway_server().http_port());
  json body = {{"prompt", "Once upon a time"},
               {"max_tokens", 6},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  auto r = http.Post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_THAT(r->get_header_value("Content-Type"), HasSubstr("text/event-stream"));
  std::vector<std::string> events = SseData(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "text_completion");
    if (e.contains("usage")) usage = e["usage"];
    if (!e["choices"].empty()) {
      text += e["choices"][0]["text"].get<std::string>();
      if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
    }
  }
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 6);
  // Non-streamed, the same request gives the same text.
  body["stream"] = false;
  body.erase("stream_options");
  auto whole = http.Post("/v1/completions", body);
  ASSERT_TRUE(whole);
  EXPECT_EQ(json::parse(whole->body)["choices"][0]["text"], text);
}

TEST(OpenAiHttpTest, BadInputGetsOpenAiErrorsWithTheRightStatus) {
  Stack stack({.workers = 1, .auth_token = "sekret", .http_port = 0});
  Http http(stack.gateway_server().http_port());
  const httplib::Headers auth = {{"Authorization", "Bearer sekret"}};
  struct Case {
    std::string path;
    std::string body;
    httplib::Headers headers;
    int status;
    std::string message_part;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", auth, 400, "not valid JSON"},
      {"/v1/chat/completions", R"({"messages": []})", auth, 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "tool", "content": "x"}]})", auth, 400,
       "role"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi"}], "temperature": 7})", auth, 400,
       "temperature"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "n": 3})", auth,
       400, "n:"},
      {"/v1/completions", R"({"prompt": "hi", "frequency_penalty": 0.5})", auth, 400,
       "frequency_penalty"},
      {"/v1/completions", R"({"prompt": 17})", auth, 400, "prompt"},
      {"/v1/completions", R"({"prompt": "hi", "model": "gpt-4"})", auth, 404, "does not exist"},
      {"/v1/completions", R"({"prompt": "hi"})", {}, 401, "bearer"},
      {"/v1/completions", R"({"prompt": "hi", "stream": true})", {}, 401, "bearer"},
  };
  for (const Case& c : cases) {
    auto r = http.client.Post(c.path.c_str(), c.headers, c.body, "application/json");
    ASSERT_TRUE(r) << c.body;
    EXPECT_EQ(r->status, c.status) << c.body << " -> " << r->body;
    json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r->body;
    EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr(c.message_part)) << c.body;
    EXPECT_TRUE(e["error"].contains("type"));
  }
  // A good request still works, and /v1/models lists the model.
  auto ok = http.Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}}, auth);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto models = http.client.Get("/v1/models", auth);
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200) << models->body;
  EXPECT_EQ(json::parse(models->body)["data"][0]["object"], "model");
}

}  // namespace
}  // namespace cascade::testing
