// The OpenAI HTTP front (openai_http.h) over a real GatewayService whose workers are scripted
// fakes (fake_worker.h), so no model runs: what an HTTP client can send that the front itself
// must refuse, and what the client gets back in the stream's last events.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/metrics.h"
#include "services/gateway/gateway_metrics.h"
#include "services/gateway/gateway_service.h"
#include "services/gateway/openai_http.h"
#include "tests/gateway/fake_worker.h"
#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::gateway {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// One HTTP exchange on a raw socket: `raw` sent as is, the answer read until the server closes
// or `ms` pass (requests say "Connection: close").
std::string Exchange(int port, const std::string& raw, int ms = 10000) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      send(fd, raw.data(), raw.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(raw.size())) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return got;
}

std::string Post(const std::string& path, const std::string& body,
                 const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n" + extra_headers +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

class OpenAiHttpFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = tokenizer::testutil::Qwen3();
    ASSERT_NE(tok_, nullptr);
    ASSERT_TRUE(testing::UseLetterVocab(*tok_));  // every token the fake model draws has text
    cluster_.Add("w1");
    pool_ = std::make_unique<WorkerPool>(
        [this](const std::string& address) -> std::unique_ptr<WorkerClient> {
          return std::make_unique<testing::FakeWorkerClient>(cluster_.at(address));
        },
        std::vector<std::string>{"w1"});
    GatewayOptions options;
    options.limits.model_name = "tiny";
    service_ = std::make_unique<GatewayService>(options, tok_, nullptr, pool_.get(), &metrics_);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    OpenAiHttpOptions ho;
    ho.host = "127.0.0.1";
    ho.threads = 1;
    ho.model_name = "tiny";
    ho.detokenize = [this](std::span<const int32_t> ids) { return tok_->DecodeText(ids); };
    auto http = OpenAiHttpServer::Start(ho, server_->InProcessChannel(grpc::ChannelArguments()));
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = std::move(*http);
  }
  void TearDown() override {
    if (http_) http_->Shutdown(absl::Seconds(5));
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    cluster_.JoinAll();
  }

  // A small completion that must succeed: the front still serves.
  void ExpectServing() {
    const std::string r =
        Exchange(http_->port(), Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 3})"));
    EXPECT_THAT(r, HasSubstr("HTTP/1.1 200")) << r;
  }

  const tokenizer::Tokenizer* tok_ = nullptr;
  testing::FakeCluster cluster_;
  std::unique_ptr<WorkerPool> pool_;
  common::MetricsRegistry registry_;
  TurnMetrics metrics_{registry_};
  std::unique_ptr<GatewayService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<OpenAiHttpServer> http_;
};

// The Authorization header travels on as gRPC metadata, whose values gRPC aborts the process on
// unless they are printable ASCII: a header with a control or non-ASCII byte must be refused here.
TEST_F(OpenAiHttpFrontTest, AnAuthorizationHeaderThatCannotBeMetadataIsRefusedAndTheFrontLivesOn) {
  ExpectServing();
  for (const std::string& value : {std::string("Bearer \x01token"), std::string("Bearer t\xc3\xa9"),
                                   std::string("Bearer a\tb")}) {
    const std::string header = "Authorization: " + value + "\r\n";
    const std::string r = Exchange(
        http_->port(), Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 3})", header));
    EXPECT_THAT(r, HasSubstr("HTTP/1.1 401")) << r;
    EXPECT_THAT(r, HasSubstr("Authorization")) << r;
    const std::string models =
        Exchange(http_->port(), "GET /v1/models HTTP/1.1\r\nHost: test\r\nConnection: close\r\n" +
                                    header + "\r\n");
    EXPECT_THAT(models, HasSubstr("HTTP/1.1 401")) << models;
  }
  ExpectServing();
}

// n > 1: one Generate stream a choice; the whole response holds the choices side by side
// (indices 0..n-1, the prompt counted once in usage), and a stream interleaves the choices'
// chunks under one id, each choice finishing once, then one usage chunk and one [DONE].
TEST_F(OpenAiHttpFrontTest, ChoicesComeBackSideBySideWholeAndStreamed) {
  const std::string whole = Exchange(
      http_->port(), Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 4, "n": 3})"));
  ASSERT_THAT(whole, HasSubstr("HTTP/1.1 200")) << whole;
  const json r = json::parse(whole.substr(whole.find("\r\n\r\n") + 4), nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << whole;
  ASSERT_EQ(r["choices"].size(), 3u) << r;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["finish_reason"], "length");
    EXPECT_FALSE(r["choices"][i]["text"].get<std::string>().empty());
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], 12);
  EXPECT_EQ(r["usage"]["total_tokens"], r["usage"]["prompt_tokens"].get<int64_t>() + 12);

  const std::string streamed =
      Exchange(http_->port(),
               Post("/v1/chat/completions",
                    R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2,
               "stream": true, "stream_options": {"include_usage": true}})"));
  ASSERT_THAT(streamed, HasSubstr("HTTP/1.1 200")) << streamed;
  std::vector<std::string> ids;
  int finishes[2] = {0, 0}, contents[2] = {0, 0}, usages = 0, done = 0;
  size_t at = 0;
  while ((at = streamed.find("data: ", at)) != std::string::npos) {
    const size_t end = streamed.find("\n", at);
    const std::string line = streamed.substr(at + 6, end - at - 6);
    at = end;
    if (line == "[DONE]") {
      ++done;
      continue;
    }
    const json c = json::parse(line, nullptr, false);
    ASSERT_FALSE(c.is_discarded()) << line;
    ids.push_back(c["id"]);
    if (c["choices"].empty()) {
      ++usages;
      EXPECT_EQ(c["usage"]["completion_tokens"], 6) << line;
      continue;
    }
    const int i = c["choices"][0]["index"];
    ASSERT_TRUE(i == 0 || i == 1) << line;
    if (!c["choices"][0]["finish_reason"].is_null()) ++finishes[i];
    if (c["choices"][0]["delta"].contains("content") &&
        !c["choices"][0]["delta"]["content"].get<std::string>().empty()) {
      ++contents[i];
    }
  }
  EXPECT_EQ(finishes[0], 1) << streamed;
  EXPECT_EQ(finishes[1], 1) << streamed;
  EXPECT_GT(contents[0], 0) << streamed;
  EXPECT_GT(contents[1], 0) << streamed;
  EXPECT_EQ(usages, 1);
  EXPECT_EQ(done, 1);
  ASSERT_FALSE(ids.empty());
  for (const std::string& id : ids) EXPECT_EQ(id, ids[0]);
  ExpectServing();
}

// A completions prompt list: n choices a prompt, in OpenAI's order (prompt p's choice s at index
// p n + s); usage counts each prompt once. The fake model's tokens follow the context, so each
// prompt's choices share their text and the two prompts' texts differ.
TEST_F(OpenAiHttpFrontTest, APromptListGetsNChoicesAPromptInOrder) {
  const std::string whole =
      Exchange(http_->port(), Post("/v1/completions",
                                   R"({"prompt": ["hi", "a longer prompt"], "max_tokens": 3,
                                       "n": 2})"));
  ASSERT_THAT(whole, HasSubstr("HTTP/1.1 200")) << whole;
  const json r = json::parse(whole.substr(whole.find("\r\n\r\n") + 4), nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << whole;
  ASSERT_EQ(r["choices"].size(), 4u) << r;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r["choices"][i]["index"], i);
  EXPECT_EQ(r["choices"][0]["text"], r["choices"][1]["text"]);
  EXPECT_EQ(r["choices"][2]["text"], r["choices"][3]["text"]);
  EXPECT_NE(r["choices"][0]["text"], r["choices"][2]["text"]);
  EXPECT_EQ(r["usage"]["completion_tokens"], 12);
  const std::vector<cascade::v2::WorkerServiceGenerateRequest> sent = cluster_.at("w1")->requests();
  ASSERT_EQ(sent.size(), 4u);
  int64_t prompt_tokens = 0;
  for (int p : {0, 1}) {  // each prompt's first request (its first choice) starts first
    int64_t n = 0;
    for (const auto& c : sent[static_cast<size_t>(p)].chunks()) n += c.token_ids_size();
    prompt_tokens += n;
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt_tokens);
  ExpectServing();
}

// Completions' echo over HTTP: each choice's text starts with its prompt, in a whole response
// and as a stream's first chunk; with logprobs the prompt's first token leads the logprobs (the
// scripted worker scores no prompt token: a real one's are in the integration test).
TEST_F(OpenAiHttpFrontTest, EchoPutsThePromptBeforeEachChoicesText) {
  const std::string whole =
      Exchange(http_->port(),
               Post("/v1/completions",
                    R"({"prompt": ["hi", "a longer prompt"], "max_tokens": 3, "echo": true})"));
  ASSERT_THAT(whole, HasSubstr("HTTP/1.1 200")) << whole;
  const json r = json::parse(whole.substr(whole.find("\r\n\r\n") + 4), nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << whole;
  ASSERT_EQ(r["choices"].size(), 2u) << r;
  const std::string t0 = r["choices"][0]["text"], t1 = r["choices"][1]["text"];
  EXPECT_EQ(t0.rfind("hi", 0), 0u) << t0;
  EXPECT_GT(t0.size(), 2u) << "the completion follows the prompt: " << t0;
  EXPECT_EQ(t1.rfind("a longer prompt", 0), 0u) << t1;
  EXPECT_GT(t1.size(), 15u) << t1;
  const std::string sse = Exchange(
      http_->port(), Post("/v1/completions",
                          R"({"prompt": "hi", "max_tokens": 3, "echo": true, "stream": true})"));
  ASSERT_THAT(sse, HasSubstr("HTTP/1.1 200")) << sse;
  const size_t at = sse.find("data: ");
  ASSERT_NE(at, std::string::npos) << sse;
  const json first = json::parse(sse.substr(at + 6, sse.find('\n', at) - at - 6), nullptr, false);
  ASSERT_FALSE(first.is_discarded()) << sse;
  EXPECT_EQ(first["choices"][0]["text"], "hi") << sse;
  // A token-id prompt is echoed as the tokenizer decodes it.
  const std::vector<int32_t> ids = *tok_->Encode("hello there");
  const std::string decoded = *tok_->Decode(ids);
  const std::string by_ids = Exchange(
      http_->port(),
      Post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 2}, {"echo", true}}.dump()));
  ASSERT_THAT(by_ids, HasSubstr("HTTP/1.1 200")) << by_ids;
  const json ri = json::parse(by_ids.substr(by_ids.find("\r\n\r\n") + 4), nullptr, false);
  ASSERT_FALSE(ri.is_discarded()) << by_ids;
  const std::string ti = ri["choices"][0]["text"];
  EXPECT_EQ(ti.rfind(decoded, 0), 0u) << ti;
  const std::string with_lp = Exchange(
      http_->port(), Post("/v1/completions", R"({"prompt": "hi", "echo": true, "logprobs": 1})"));
  ASSERT_THAT(with_lp, HasSubstr("HTTP/1.1 200")) << with_lp;
  const json rl = json::parse(with_lp.substr(with_lp.find("\r\n\r\n") + 4), nullptr, false);
  ASSERT_FALSE(rl.is_discarded()) << with_lp;
  const json& lp = rl["choices"][0]["logprobs"];
  ASSERT_FALSE(lp["tokens"].empty()) << rl;
  EXPECT_EQ(lp["tokens"][0], "hi") << rl;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << rl;
  ExpectServing();
}

// Choice 0 starts alone and the others once its first token is there (its prompt then sits in
// the worker's prefix cache). A first choice that never produces one keeps the others from
// starting, and a client that gives up cancels it; one that produces a token starts them.
TEST_F(OpenAiHttpFrontTest, LaterChoicesStartAfterTheFirstChoicesFirstToken) {
  testing::FakeWorker* w = cluster_.at("w1");
  auto wait_for = [](const std::function<bool()>& done) {
    for (int i = 0; i < 500 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return done();
  };
  const std::string body = R"({"prompt": "hi", "max_tokens": 4, "n": 3})";
  w->Script({{testing::FakeBehavior::kHangSilent}});
  Exchange(http_->port(), Post("/v1/completions", body), /*ms=*/800);  // the client gives up
  ASSERT_TRUE(wait_for([&] { return !w->calls().empty() && w->calls()[0]->cancelled(); }))
      << "the hung first choice was not cancelled after its client left";
  EXPECT_EQ(w->requests().size(), 1u) << "choices started before the first one's first token";

  w->Script({{testing::FakeBehavior::kHang, 1}});  // one token, then nothing
  Exchange(http_->port(), Post("/v1/completions", body), /*ms=*/800);
  EXPECT_TRUE(wait_for([&] { return w->requests().size() == 4; }))
      << w->requests().size() << " requests: the later choices did not start";
  ASSERT_TRUE(wait_for([&] { return w->calls().size() >= 2 && w->calls()[1]->cancelled(); }));
  ExpectServing();
}

}  // namespace
}  // namespace cascade::gateway
