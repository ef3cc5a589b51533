// The OpenAI-compatible HTTP front over a real stack: completions and chat, streamed as
// server-sent events and whole, cached tokens reported on a repeat, the same tokens as the gRPC
// Generate for the same prompt, bad input answered in OpenAI's error shape with its status, many
// open streams on one loop thread, and a closed connection ending its generation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
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

// A streaming request on a raw socket, so a test decides when to read and when to hang up.
class RawStream {
 public:
  RawStream(int port, const json& body)
      : RawStream(port, PostHead(body.dump().size()) + body.dump()) {}
  // `raw`: the bytes to send, as they are.
  RawStream(int port, const std::string& raw) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (connected_) {
      connected_ =
          send(fd_, raw.data(), raw.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(raw.size());
    }
  }
  static std::string PostHead(size_t content_length) {
    return "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(content_length) + "\r\n\r\n";
  }
  ~RawStream() { Close(); }
  // Reads until `what` arrived or `ms` passed.
  bool ReadUntil(const std::string& what, int ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (connected_ && got_.find(what) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      got_.append(buf, static_cast<size_t>(n));
    }
    return connected_;
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  const std::string& got() const { return got_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string got_;
};

// Waits until worker 0 runs nothing and holds no KV block for a live sequence.
bool WaitForDrained(Stack& stack, int ms) {
  return WaitFor(
      [&] {
        auto st = stack.WorkerStats(0);
        return st.running() == 0 && st.used_kv_blocks() == 0;
      },
      ms);
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

// --reasoning_parser=qwen3 over a real stack: a chat whose tokens are all "<think>" (a logit bias
// forces id 151667) is all reasoning after the first; a plain chat has no reasoning_content and
// the same content as with the parser off.
TEST(OpenAiHttpTest, ReasoningParserSplitsChatsThatThink) {
  Stack stack({.workers = 1, .http_port = 0, .tweak_gateway = [](gateway::GatewayConfig* g) {
                 g->reasoning_parser = "qwen3";
               }});
  Http http(stack.gateway_server().http_port());
  json think = ChatBody("You are terse.", "Think.", 3);
  think["logit_bias"] = {{"151667", 100}};
  auto r = http.Post("/v1/chat/completions", think);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json msg = json::parse(r->body)["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "<think><think>");
  EXPECT_EQ(msg["content"], "");
  think["stream"] = true;
  r = http.Post("/v1/chat/completions", think);
  ASSERT_TRUE(r);
  std::string reasoning;
  for (const std::string& d : SseData(r->body)) {
    if (d == "[DONE]") continue;
    json delta = json::parse(d)["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"];
    EXPECT_TRUE(!delta.contains("content") || delta["content"] == "") << d;
  }
  EXPECT_EQ(reasoning, "<think><think>");

  const json plain = ChatBody("You are terse.", "Answer.", 4);
  auto p = http.Post("/v1/chat/completions", plain);
  ASSERT_TRUE(p);
  json pm = json::parse(p->body)["choices"][0]["message"];
  EXPECT_TRUE(pm["reasoning_content"].is_null()) << p->body;
  Stack off({.workers = 1, .http_port = 0});
  Http http_off(off.gateway_server().http_port());
  auto q = http_off.Post("/v1/chat/completions", plain);
  ASSERT_TRUE(q);
  json qm = json::parse(q->body)["choices"][0]["message"];
  EXPECT_FALSE(qm.contains("reasoning_content"));
  EXPECT_EQ(pm["content"], qm["content"]) << "greedy, the same tiny model";
}

// Prompt logprobs over a real stack. gRPC: a prompt extended by the tokens a request generated
// scores those tokens with the logprobs (and top tokens) their generation reported, bitwise (a
// prompt-logprob row is the logits row a decode step samples from), cold and again with the
// prompt cached (its rows are computed, so cached_tokens stays 0); every prompt token from the
// second has an entry, with the token's id, and the first is named in the start. HTTP:
// completions' echo with logprobs lists the prompt's tokens first (the first with a null
// logprob), then the completion's, whole and streamed alike; vLLM's prompt_logprobs (completions
// and chat) scores the same tokens with the same logprobs, their ranks and top tokens.
TEST(OpenAiHttpTest, PromptLogprobsAreTheGeneratedTokensLogprobs) {
  Stack stack({.workers = 1, .http_port = 0});
  cascade::v2::GenerateRequest gen = Req("", "Tell me about prefix caching.", 3);
  gen.mutable_sampling()->set_logprobs(2);
  gen.mutable_sampling()->set_ignore_eos(true);
  gen.set_add_generation_prompt(false);
  const Reply a = Generate(stack.gateway(), gen);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.tokens.size(), 3u);
  ASSERT_EQ(a.logprobs.size(), 3u);
  const int64_t prompt_len = a.start.prompt_tokens();
  // The same prompt, the generated tokens after it (an ASSISTANT chunk of their ids, untemplated).
  cascade::v2::GenerateRequest score = gen;
  auto* tail = score.add_chunks();
  tail->set_kind(cascade::v2::CHUNK_KIND_RAW);
  tail->mutable_token_ids()->mutable_ids()->Assign(a.tokens.begin(), a.tokens.end());
  score.mutable_sampling()->set_prompt_logprobs(2);
  score.mutable_sampling()->set_max_tokens(1);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "cold" : "cached");
    const Reply b = Generate(stack.gateway(), score);
    ASSERT_TRUE(b.status.ok()) << b.status.error_message();
    ASSERT_EQ(b.start.prompt_tokens(), prompt_len + 3);
    EXPECT_EQ(b.start.cached_tokens(), 0);
    EXPECT_TRUE(b.start.has_first_prompt_token());
    ASSERT_EQ(static_cast<int64_t>(b.prompt_logprobs.size()), prompt_len + 2);
    for (int i = 0; i < 3; ++i) {
      const auto& want = a.logprobs[i];
      const auto& got = b.prompt_logprobs[prompt_len - 1 + i];
      EXPECT_EQ(got.sampled().token_id(), a.tokens[i]);
      EXPECT_EQ(got.sampled().logprob(), want.sampled().logprob()) << "token " << i;
      EXPECT_EQ(got.sampled().text(), want.sampled().text());
      ASSERT_EQ(got.top_size(), 2);
      for (int j = 0; j < 2; ++j) {
        EXPECT_EQ(got.top(j).token_id(), want.top(j).token_id());
        EXPECT_EQ(got.top(j).logprob(), want.top(j).logprob());
      }
    }
    for (const auto& e : b.prompt_logprobs) EXPECT_LE(e.sampled().logprob(), 0.0f);
  }
  // A prompt of hundreds of tokens: every entry, in deltas of at most 128 (a worker step scores
  // up to 4096 rows; the gateway splits them), each with a rank.
  std::string long_text;
  for (int i = 0; i < 60; ++i) long_text += "Tell me about prefix caching. ";
  cascade::v2::GenerateRequest long_req = Req("", long_text, 1);
  long_req.set_add_generation_prompt(false);
  long_req.mutable_sampling()->set_prompt_logprobs(1);
  const Reply l = Generate(stack.gateway(), long_req);
  ASSERT_TRUE(l.status.ok()) << l.status.error_message();
  ASSERT_GT(l.start.prompt_tokens(), 256);
  ASSERT_EQ(static_cast<int64_t>(l.prompt_logprobs.size()), l.start.prompt_tokens() - 1);
  EXPECT_LE(l.most_prompt_logprobs_a_delta, 128);
  EXPECT_GE(l.prompt_logprob_deltas, 3);
  for (const auto& e : l.prompt_logprobs) {
    EXPECT_GE(e.rank(), 1);
    EXPECT_LE(e.sampled().logprob(), 0.0f);
    EXPECT_EQ(e.top_size(), 1);
  }

  Http http(stack.gateway_server().http_port());
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"temperature", 0},
               {"ignore_eos", true},           {"logprobs", 1},   {"echo", true}};
  auto whole = http.Post("/v1/completions", body);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json c = json::parse(whole->body)["choices"][0];
  const json& lp = c["logprobs"];
  const int64_t prompt_tokens = json::parse(whole->body)["usage"]["prompt_tokens"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(prompt_tokens + 3)) << lp;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  // The prompt's tokens spell it (ASCII: offsets in characters are bytes); the tiny model's
  // random tokens after it need not be whole characters.
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    if (i > 0) {
      EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
      EXPECT_EQ(lp["top_logprobs"][i].size(), 1u);
    }
    if (static_cast<int64_t>(i) >= prompt_tokens) continue;
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), static_cast<int64_t>(joined.size()));
    joined += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined, "Once upon a time");
  EXPECT_EQ(c["text"].get<std::string>().rfind("Once upon a time", 0), 0u);
  body["stream"] = true;
  auto streamed = http.Post("/v1/completions", body);
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  json tokens = json::array(), logprobs = json::array();
  std::string text;
  for (const std::string& d : SseData(streamed->body)) {
    if (d == "[DONE]") continue;
    const json e = json::parse(d);
    if (e["choices"].empty()) continue;
    text += e["choices"][0]["text"].get<std::string>();
    const json& l = e["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const auto& t : l["tokens"]) tokens.push_back(t);
    for (const auto& t : l["token_logprobs"]) logprobs.push_back(t);
  }
  EXPECT_EQ(text, c["text"].get<std::string>());
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(logprobs, lp["token_logprobs"]);

  // vLLM's prompt_logprobs beside the echo: one entry a prompt token (the first null), each
  // holding the prompt token (its text and logprob the echo's, bitwise, a rank >= 1) and the two
  // top tokens ranked 1 and 2, whose first is the prompt token where it ranks first.
  body.erase("stream");
  body["prompt_logprobs"] = 2;
  auto scored = http.Post("/v1/completions", body);
  ASSERT_TRUE(scored);
  ASSERT_EQ(scored->status, 200) << scored->body;
  const json sc = json::parse(scored->body)["choices"][0];
  EXPECT_EQ(sc["logprobs"], lp);  // the echo's lists keep their one top token
  const json& pl = sc["prompt_logprobs"];
  ASSERT_EQ(pl.size(), static_cast<size_t>(prompt_tokens)) << pl;
  EXPECT_TRUE(pl[0].is_null());
  for (size_t i = 1; i < pl.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("prompt token ", i));
    int prompt_entries = 0;
    std::vector<int64_t> ranks;
    for (const auto& [id, v] : pl[i].items()) {
      if (v["decoded_token"] == lp["tokens"][i] && v["logprob"] == lp["token_logprobs"][i]) {
        ++prompt_entries;
        EXPECT_GE(v["rank"].get<int64_t>(), 1);
      }
      ranks.push_back(v["rank"].get<int64_t>());
    }
    EXPECT_EQ(prompt_entries, 1) << pl[i];
    EXPECT_TRUE(pl[i].size() == 2 || pl[i].size() == 3) << pl[i];
    std::sort(ranks.begin(), ranks.end());
    EXPECT_EQ(ranks[0], 1) << pl[i];
    EXPECT_EQ(ranks[1], 2) << pl[i];
  }
  body["stream"] = true;
  auto refused = http.Post("/v1/completions", body);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
               {"max_tokens", 2},
               {"prompt_logprobs", 0}};
  auto chat_scored = http.Post("/v1/chat/completions", chat);
  ASSERT_TRUE(chat_scored);
  ASSERT_EQ(chat_scored->status, 200) << chat_scored->body;
  const json cr = json::parse(chat_scored->body);
  ASSERT_EQ(cr["prompt_logprobs"].size(), cr["usage"]["prompt_tokens"].get<size_t>());
  EXPECT_TRUE(cr["prompt_logprobs"][0].is_null());
  for (size_t i = 1; i < cr["prompt_logprobs"].size(); ++i) {
    ASSERT_EQ(cr["prompt_logprobs"][i].size(), 1u);  // the prompt token alone
    EXPECT_LE(cr["prompt_logprobs"][i].begin().value()["logprob"].get<double>(), 0.0);
  }
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
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "n": 17})",
       auth, 400, "n must be an integer from 1 to 16"},
      {"/v1/completions", R"({"prompt": "hi", "frequency_penalty": 2.5})", auth, 400,
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

TEST(OpenAiHttpTest, OneLoopThreadKeepsManyStreamsOpenAndAHangUpEndsItsGeneration) {
  // One event-loop thread: a thread-per-stream front would serve the first stream only, the
  // others waiting for its 3000 tokens.
  constexpr int kStreams = 12;
  Stack stack({.workers = 1, .http_port = 0, .tweak_gateway = [](gateway::GatewayConfig* g) {
                 g->http_threads = 1;
                 // Admission must not queue any of them (a slow CI machine's time per token
                 // could shrink the worker's limit while they arrive).
                 g->gateway.admission.min_limit = kStreams;
               }});
  const int port = stack.gateway_server().http_port();
  const json body = {{"prompt", "talk forever"},
                     {"max_tokens", 3000},
                     {"ignore_eos", true},
                     {"temperature", 0},
                     {"stream", true}};
  std::vector<std::unique_ptr<RawStream>> streams;
  for (int i = 0; i < kStreams; ++i) streams.push_back(std::make_unique<RawStream>(port, body));
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(streams[i]->ReadUntil("data: ", 30000))
        << "stream " << i << " got no event while the others are open: " << streams[i]->got();
    EXPECT_THAT(streams[i]->got(), HasSubstr("200 OK"));
    EXPECT_THAT(streams[i]->got(), ::testing::Not(HasSubstr("[DONE]")));
  }
  // All of them generate at once (a front with a thread per stream would have one at a time).
  auto st = stack.WorkerStats(0);
  EXPECT_EQ(st.running() + st.waiting(), kStreams);
  // Hang up: every generation ends and gives its KV blocks back (it would run for 3000 tokens).
  for (auto& s : streams) s->Close();
  EXPECT_TRUE(WaitForDrained(stack, 15000)) << "closed HTTP connections left generations running";
  // The front serves on.
  Http http(port);
  auto ok = http.Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST(OpenAiHttpTest, AHangUpBeforeTheAnswerEndsTheGeneration) {
  // A non-streamed request gets no byte until its generation ends, so no write can fail: the
  // front has to notice the closed socket itself.
  Stack stack({.workers = 1, .http_port = 0});
  const int port = stack.gateway_server().http_port();
  constexpr int kMaxTokens = 3000;
  const int64_t before = stack.WorkerStats(0).generation_tokens();
  auto client = std::make_unique<RawStream>(port, json{{"prompt", "talk forever"},
                                                       {"max_tokens", kMaxTokens},
                                                       {"ignore_eos", true},
                                                       {"temperature", 0}});
  ASSERT_TRUE(WaitFor([&] { return stack.WorkerStats(0).running() == 1; }, 10000));
  client->Close();
  EXPECT_TRUE(WaitForDrained(stack, 30000)) << "the generation of a closed connection kept running";
  const int64_t generated = stack.WorkerStats(0).generation_tokens() - before;
  std::cerr << "generated " << generated << " of " << kMaxTokens << " tokens before the cancel\n";
  EXPECT_LT(generated, kMaxTokens) << "the generation ran to its end: the hang-up went unseen";
  // The front serves on.
  Http http(port);
  auto ok = http.Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST(OpenAiHttpTest, UnknownRoutesWrongMethodsAndHugeBodiesGetHttpErrors) {
  // A 256 KiB prompt limit makes the HTTP body limit about 0.5 MiB (JSON escapes may double it).
  Stack stack({.workers = 1, .http_port = 0, .tweak_gateway = [](gateway::GatewayConfig* g) {
                 g->gateway.limits.max_prompt_bytes = 256 << 10;
               }});
  Http http(stack.gateway_server().http_port());
  auto missing = http.client.Get("/v2/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(json::parse(missing->body)["error"]["message"].get<std::string>(), HasSubstr("/v1"));
  auto wrong = http.client.Get("/v1/completions");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->get_header_value("Allow"), "POST");
  EXPECT_TRUE(json::parse(wrong->body).contains("error"));
  auto health = http.client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // A body a little over the limit (1 MiB) is read and refused with an OpenAI error (JSON).
  auto over =
      http.Post("/v1/completions", {{"prompt", std::string(1 << 20, 'a')}, {"max_tokens", 2}});
  ASSERT_TRUE(over);
  EXPECT_EQ(over->status, 413);
  EXPECT_THAT(json::parse(over->body)["error"]["message"].get<std::string>(),
              HasSubstr("the limit is"));
  // Announcing a body far over it is refused before the body is read (libevent's own page).
  RawStream big(stack.gateway_server().http_port(), RawStream::PostHead(4 << 20) + "{\"prompt\"");
  EXPECT_TRUE(big.ReadUntil("\r\n\r\n", 10000)) << big.got();
  EXPECT_THAT(big.got(), HasSubstr("HTTP/1.1 413"));
  auto after = http.Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
}

}  // namespace
}  // namespace cascade::testing
