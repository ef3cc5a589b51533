// Bad input through the gateway: each case gets INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for
// size) with a message naming the field, and a good request right after still succeeds.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

struct BadCase {
  std::string name;
  std::function<void(cascade::v2::GenerateRequest&)> mutate;
  grpc::StatusCode code;
  std::string message_part;
};

TEST(BadInputTest, EachBadRequestGetsAClearStatusAndNothingElseIsDisturbed) {
  Stack stack({.workers = 1});
  // A long stream runs through all the bad requests; it must finish normally.
  grpc::ClientContext bg_ctx;
  auto bg = stack.gateway().Generate(&bg_ctx, Req("sys", "background", 60));

  const std::vector<BadCase> cases = {
      {"no chunks", [](auto& r) { r.clear_chunks(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "chunks"},
      {"empty text", [](auto& r) { r.mutable_chunks(0)->set_text(""); },
       grpc::StatusCode::INVALID_ARGUMENT, "chunks[0].text"},
      {"kind unset",
       [](auto& r) { r.mutable_chunks(0)->set_kind(cascade::v2::CHUNK_KIND_UNSPECIFIED); },
       grpc::StatusCode::INVALID_ARGUMENT, "chunks[0].kind"},
      {"unknown model", [](auto& r) { r.set_model("no-such-model"); },
       grpc::StatusCode::INVALID_ARGUMENT, "model"},
      {"max_tokens 0", [](auto& r) { r.mutable_sampling()->set_max_tokens(0); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.max_tokens"},
      {"max_tokens huge", [](auto& r) { r.mutable_sampling()->set_max_tokens(1 << 30); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.max_tokens"},
      {"over the context", [](auto& r) { r.mutable_sampling()->set_max_tokens(4090); },
       grpc::StatusCode::INVALID_ARGUMENT, "context length"},
      {"temperature high", [](auto& r) { r.mutable_sampling()->set_temperature(2.5f); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.temperature"},
      {"temperature negative", [](auto& r) { r.mutable_sampling()->set_temperature(-0.1f); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.temperature"},
      {"top_p zero", [](auto& r) { r.mutable_sampling()->set_top_p(0.0f); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_p"},
      {"top_p above one", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_p"},
      {"top_k negative", [](auto& r) { r.mutable_sampling()->set_top_k(-5); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_k"},
      {"repetition penalty zero",
       [](auto& r) { r.mutable_sampling()->set_repetition_penalty(0.0f); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.repetition_penalty"},
      {"frequency penalty above two",
       [](auto& r) { r.mutable_sampling()->set_frequency_penalty(2.5f); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.frequency_penalty"},
      {"presence penalty NaN",
       [](auto& r) { r.mutable_sampling()->set_presence_penalty(std::nanf("")); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.presence_penalty"},
      {"logit bias outside the vocabulary",
       [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[99999999] = 1.0f; },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.logit_bias: token 99999999"},
      {"logit bias above 100",
       [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[5] = 150.0f; },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.logit_bias: the bias of token 5"},
      {"empty stop string", [](auto& r) { r.mutable_sampling()->add_stop(""); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.stop[0]"},
      {"token id out of vocabulary",
       [](auto& r) {
         auto* c = r.add_chunks();
         c->set_kind(cascade::v2::CHUNK_KIND_RAW);
         c->mutable_token_ids()->add_ids(5);
         c->mutable_token_ids()->add_ids(99999999);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "token_ids[1]"},
      {"negative token id",
       [](auto& r) {
         auto* c = r.add_chunks();
         c->set_kind(cascade::v2::CHUNK_KIND_RAW);
         c->mutable_token_ids()->add_ids(-1);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "token_ids[0]"},
      {"10 MB of text", [](auto& r) { r.mutable_chunks(0)->set_text(std::string(10 << 20, 'a')); },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "bytes"},
      {"generation prompt from the client",
       [](auto& r) { r.mutable_chunks(0)->set_kind(cascade::v2::CHUNK_KIND_GENERATION_PROMPT); },
       grpc::StatusCode::INVALID_ARGUMENT, "GENERATION_PROMPT"},
      {"logprobs too many", [](auto& r) { r.mutable_sampling()->set_logprobs(50); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.logprobs"},
      {"prompt logprobs too many", [](auto& r) { r.mutable_sampling()->set_prompt_logprobs(21); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.prompt_logprobs must be in [0, 20]"},
      {"prompt logprobs negative", [](auto& r) { r.mutable_sampling()->set_prompt_logprobs(-1); },
       grpc::StatusCode::INVALID_ARGUMENT, "sampling.prompt_logprobs must be in [0, 20]"},
  };
  for (const BadCase& c : cases) {
    auto req = Req("system text", "a question");
    c.mutate(req);
    Reply r = Generate(stack.gateway(), req);
    EXPECT_EQ(r.status.error_code(), c.code) << c.name << ": " << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), ::testing::HasSubstr(c.message_part)) << c.name;
  }
  // Invalid UTF-8 in a text field: protobuf refuses to parse a proto3 string that is not UTF-8,
  // so the request is sent as raw bytes (a serialized request with the text's bytes patched).
  {
    auto req = Req("system text", "QQQQ");
    std::string wire = req.SerializeAsString();
    const size_t at = wire.find("QQQQ");
    ASSERT_NE(at, std::string::npos);
    wire.replace(at, 4, "\xff\xfe\xc3\x28");
    grpc::GenericStub generic(
        grpc::CreateChannel(stack.gateway_server().address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(wire);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::Status st;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    generic.UnaryCall(&ctx, "/cascade.v2.GatewayService/Generate", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        st = s;
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr("chunks[1].text is not valid UTF-8"));
  }
  Reply ok = Generate(stack.gateway(), Req("system text", "a question"));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();

  cascade::v2::GenerateResponse m;
  cascade::v2::GenerateFinish finish;
  while (bg->Read(&m)) {
    if (m.has_finish()) finish = m.finish();
  }
  EXPECT_TRUE(bg->Finish().ok());
  EXPECT_EQ(finish.usage().completion_tokens(), 60);
}

// Every public RPC that carries text checks UTF-8 itself (the typed C++ client serializes
// invalid UTF-8 with a logged warning, so it can send it).
TEST(BadInputTest, InvalidUtf8IsNamedOnEveryRpc) {
  Stack stack({.workers = 1});
  const std::string bad = "ok \xff\xfe bytes";
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(10); };
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    cascade::v2::TokenizeRequest req;
    req.set_text(bad);
    cascade::v2::TokenizeResponse resp;
    grpc::Status st = stack.gateway().Tokenize(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr("text is not valid UTF-8"));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    cascade::v2::RegisterChunkRequest req;
    auto* c = req.add_chunks();
    c->set_kind(cascade::v2::CHUNK_KIND_SYSTEM);
    c->set_text(bad);
    cascade::v2::RegisterChunkResponse resp;
    grpc::Status st = stack.gateway().RegisterChunk(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr("chunks[0].text is not valid UTF-8"));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    auto stream = stack.gateway().Chat(&ctx);
    cascade::v2::ChatRequest req;
    auto* c = req.add_chunks();
    c->set_kind(cascade::v2::CHUNK_KIND_QUERY);
    c->set_text("fine");
    req.mutable_sampling()->add_stop(bad);
    ASSERT_TRUE(stream->Write(req));
    stream->WritesDone();
    cascade::v2::ChatResponse resp;
    while (stream->Read(&resp)) {
    }
    grpc::Status st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr("sampling.stop[0] is not valid UTF-8"));
  }
  {
    auto req = Req("system", "q");
    req.mutable_chunks(0)->set_cache_salt(bad);
    Reply r = Generate(stack.gateway(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(r.status.error_message(),
                ::testing::HasSubstr("chunks[0].cache_salt is not valid UTF-8"));
  }
  // The good paths still work after all that.
  grpc::ClientContext ctx;
  cascade::v2::TokenizeRequest ok;
  ok.set_text("Hello");
  cascade::v2::TokenizeResponse resp;
  EXPECT_TRUE(stack.gateway().Tokenize(&ctx, ok, &resp).ok());
  EXPECT_FALSE(resp.token_ids().empty());
}

// A greedy request whose prompt is one RAW chunk of four token ids, without a generation prompt.
cascade::v2::GenerateRequest GreedyTokenIdsRequest(int max_tokens) {
  cascade::v2::GenerateRequest r;
  auto* c = r.add_chunks();
  c->set_kind(cascade::v2::CHUNK_KIND_RAW);
  for (int id : {9707, 11, 1879, 0}) c->mutable_token_ids()->add_ids(id);
  r.set_add_generation_prompt(false);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

TEST(BadInputTest, TokenIdsChunksAreUsedAsGiven) {
  Stack stack({.workers = 1});
  const cascade::v2::GenerateRequest r = GreedyTokenIdsRequest(3);
  Reply rep = Generate(stack.gateway(), r);
  ASSERT_TRUE(rep.status.ok()) << rep.status.error_message();
  EXPECT_EQ(rep.start.prompt_tokens(), 4);
}

// A logit_bias crosses the gateway to the worker's sampler: +100 on a token makes every greedy
// token that one; -100 on the token generated first keeps it out.
TEST(BadInputTest, LogitBiasReachesTheSampler) {
  Stack stack({.workers = 1});
  cascade::v2::GenerateRequest r = GreedyTokenIdsRequest(4);
  r.mutable_sampling()->set_ignore_eos(true);
  const Reply plain = Generate(stack.gateway(), r);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  ASSERT_EQ(plain.tokens.size(), 4u);
  cascade::v2::GenerateRequest banned = r;
  (*banned.mutable_sampling()->mutable_logit_bias())[plain.tokens[0]] = -100.0f;
  const Reply b = Generate(stack.gateway(), banned);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  for (int32_t t : b.tokens) EXPECT_NE(t, plain.tokens[0]);
  cascade::v2::GenerateRequest forced = r;
  (*forced.mutable_sampling()->mutable_logit_bias())[1234] = 100.0f;
  const Reply f = Generate(stack.gateway(), forced);
  ASSERT_TRUE(f.status.ok()) << f.status.error_message();
  EXPECT_EQ(f.tokens, std::vector<int32_t>(4, 1234));
}

}  // namespace
}  // namespace cascade::testing
