// The serving path end to end over real gRPC on loopback: registry, two CPU workers and the
// gateway on the tiny model. Cache hits with identical output and routing to the holder,
// registry outage, cancellation and deadlines freeing KV, admission control, worker death,
// failover, stop strings, UTF-8-safe streaming, auth, and chat sessions reusing their KV.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "services/tokenizer/tokenizer.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/test_util.h"
#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

using ::testing::HasSubstr;

TEST(ServingTest, SecondRequestWithSameSystemChunkHitsCacheOnTheHolderWithSameTokens) {
  Stack stack;
  auto req = Req(LongSystemPrompt(), "What is rule 3?", 12);
  Reply cold = Generate(stack.gateway(), req);
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.start.cached_tokens(), 0);
  ASSERT_EQ(cold.tokens.size(), 12u);
  const int holder = stack.WorkerIndex(cold.start.worker_id());
  ASSERT_GE(holder, 0);
  // The registry learns what the holder stored (events flow after each engine step).
  ASSERT_TRUE(WaitFor([&] {
    std::vector<int32_t> dummy;
    return stack.registry()->ListChunks(100, cold.start.worker_id(), nullptr)->size() > 0;
  })) << "the registry never heard about the stored chunks";
  // Equal loads (the cold request is over and the holder said so), so the prefix decides.
  ASSERT_TRUE(stack.WaitForIdleLoad()) << "a heartbeat still reports load after the request ended";

  auto req2 = Req(LongSystemPrompt(), "What is rule 3?", 12);
  Reply hot = Generate(stack.gateway(), req2);
  ASSERT_TRUE(hot.status.ok());
  EXPECT_GT(hot.start.cached_tokens(), 0);
  EXPECT_EQ(hot.start.worker_id(), cold.start.worker_id()) << "routing ignored the cached prefix";
  EXPECT_EQ(hot.tokens, cold.tokens) << "cached and cold outputs differ";
  EXPECT_EQ(hot.text, cold.text);
  EXPECT_EQ(hot.finish.usage().cached_tokens(), hot.start.cached_tokens());
  // Per-chunk report: the system chunk was served (mostly) from cache.
  ASSERT_GE(hot.start.chunks_size(), 2);
  EXPECT_GT(hot.start.chunks(0).cached_tokens(), 0);

  // Same prompt forced cold with another salt on the other worker: still identical tokens.
  auto salted = req;
  salted.set_cache_salt("another-tenant");
  Reply other = Generate(stack.gateway(), salted);
  ASSERT_TRUE(other.status.ok());
  EXPECT_EQ(other.start.cached_tokens(), 0);
  EXPECT_EQ(other.tokens, cold.tokens);
}

// A worker started with --overlap_schedule (step n+1 scheduled while step n runs) streams the
// same tokens as one without, for concurrent greedy and seeded requests over real gRPC.
TEST(ServingTest, OverlappedScheduleWorkerStreamsThePlainWorkersTokens) {
  auto run = [](bool overlap) {
    Stack stack({.workers = 1, .tweak_worker = [overlap](int, worker::WorkerConfig* w) {
                   w->overlap_schedule = overlap;
                 }});
    std::vector<cascade::v2::GenerateRequest> reqs;
    for (int i = 0; i < 6; ++i) {
      auto r = Req(LongSystemPrompt(), "Question " + std::to_string(i), 10 + i);
      r.mutable_sampling()->set_ignore_eos(true);
      if (i % 2 == 1) {
        r.mutable_sampling()->set_temperature(0.8f);
        r.mutable_sampling()->set_seed(100 + i);
      }
      reqs.push_back(r);
    }
    std::vector<Reply> replies(reqs.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < reqs.size(); ++i) {
      threads.emplace_back([&, i] { replies[i] = Generate(stack.gateway(), reqs[i]); });
    }
    for (std::thread& t : threads) t.join();
    std::vector<std::vector<int32_t>> tokens;
    for (const Reply& r : replies) {
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      tokens.push_back(r.tokens);
    }
    return tokens;
  };
  const auto plain = run(false);
  const auto overlap = run(true);
  ASSERT_EQ(plain.size(), overlap.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].size(), 10 + i);
    EXPECT_EQ(overlap[i], plain[i]) << "request " << i;
  }
}

TEST(ServingTest, ListModelsCountsRegisteredWorkersBeforeAnyRequest) {
  Stack stack({.workers = 2, .static_workers = false});  // only the registry knows them
  ASSERT_TRUE(WaitFor([&] { return stack.registry()->ListWorkers().size() == 2; }));
  grpc::ClientContext ctx;
  cascade::v2::ListModelsRequest req;
  cascade::v2::ListModelsResponse resp;
  ASSERT_TRUE(stack.gateway().ListModels(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.models_size(), 1);
  EXPECT_EQ(resp.models(0).workers(), 2);
  EXPECT_EQ(resp.models(0).vocab_size(), 151669);
}

TEST(ServingTest, RequestsStillSucceedWithTheRegistryDown) {
  Stack stack;
  Reply first = Generate(stack.gateway(), Req("sys", "hello"));
  ASSERT_TRUE(first.status.ok());
  stack.StopRegistry();
  for (int i = 0; i < 3; ++i) {
    Reply r = Generate(stack.gateway(), Req("sys", "hello again " + std::to_string(i)));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_TRUE(r.has_finish);
  }
}

TEST(ServingTest, CancelMidStreamFreesTheWorkersKv) {
  Stack stack({.workers = 1});
  auto req = Req("sys", "talk forever", 3000);
  grpc::ClientContext ctx;
  auto reader = stack.gateway().Generate(&ctx, req);
  cascade::v2::GenerateResponse m;
  int deltas = 0;
  while (deltas < 3 && reader->Read(&m)) deltas += m.has_delta();
  ASSERT_EQ(deltas, 3);
  EXPECT_GT(stack.WorkerStats(0).used_kv_blocks(), 0);
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitFor([&] { return stack.WorkerStats(0).used_kv_blocks() == 0; }))
      << "the cancelled sequence still holds KV blocks";
  EXPECT_EQ(stack.WorkerStats(0).running(), 0);
}

TEST(ServingTest, DeadlineExpiryFreesTheWorkersKv) {
  Stack stack({.workers = 1});
  Reply r = Generate(stack.gateway(), Req("sys", "talk forever", 3000), /*timeout_ms=*/400);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitFor([&] { return stack.WorkerStats(0).used_kv_blocks() == 0; }));
}

TEST(ServingTest, AdmissionControlRejectsBeyondTheBoundAtOnce) {
  Stack stack({.workers = 1, .max_concurrent = 1});
  grpc::ClientContext ctx;
  auto reader = stack.gateway().Generate(&ctx, Req("sys", "long", 3000));
  cascade::v2::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));  // the first stream is open
  auto t0 = std::chrono::steady_clock::now();
  Reply second = Generate(stack.gateway(), Req("sys", "short"));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.status.error_message(), HasSubstr("max_concurrent"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  reader->Finish();
  // The slot comes back.
  EXPECT_TRUE(WaitFor([&] { return Generate(stack.gateway(), Req("sys", "again")).status.ok(); }));
}

TEST(ServingTest, KillingAWorkerMidStreamEndsThatStreamUnavailableAndOthersFlow) {
  Stack stack({.workers = 2, .resume = false});
  grpc::ClientContext ctx;
  auto reader = stack.gateway().Generate(&ctx, Req("doomed", "long answer", 3000));
  cascade::v2::GenerateResponse m;
  std::string victim;
  int deltas = 0;
  while (reader->Read(&m)) {
    if (m.has_start()) victim = m.start().worker_id();
    if (m.has_delta() && ++deltas == 2) break;
  }
  const int vi = stack.WorkerIndex(victim);
  ASSERT_GE(vi, 0);
  // Another stream on the surviving worker, started before the kill.
  auto survivor_req = Req("other", "short answer", 40);
  std::thread killer([&] { stack.worker(vi).Shutdown(absl::ZeroDuration()); });
  int64_t tokens_seen = deltas;
  cascade::v2::GenerateFinish finish;
  while (reader->Read(&m)) {
    if (m.has_delta()) tokens_seen += m.delta().token_ids_size();
    if (m.has_finish()) finish = m.finish();
  }
  grpc::Status st = reader->Finish();
  killer.join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_EQ(finish.finish_reason(), cascade::v2::FINISH_REASON_ERROR);
  EXPECT_GT(finish.usage().completion_tokens(), 0) << "tokens so far are counted";
  for (int i = 0; i < 3; ++i) {
    Reply r = Generate(stack.gateway(), survivor_req);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_NE(r.start.worker_id(), victim);
  }
}

// The stretch goal of failover: the stream continues on the other worker, which re-prefills the
// prompt plus the tokens emitted so far; greedy and seeded sampling continue exactly, so the
// client receives the tokens of an uninterrupted run.
TEST(ServingTest, StreamResumesOnAnotherWorkerWithIdenticalTokens) {
  for (bool seeded : {false, true}) {
    Stack stack({.workers = 2});
    auto req = Req(LongSystemPrompt(), "tell a long story", 150);
    if (seeded) {
      req.mutable_sampling()->set_temperature(0.9f);
      req.mutable_sampling()->set_seed(4242);
    }
    Reply want = Generate(stack.gateway(), req);
    ASSERT_TRUE(want.status.ok());
    ASSERT_TRUE(stack.WaitForIdleLoad());

    grpc::ClientContext ctx;
    auto reader = stack.gateway().Generate(&ctx, req);
    cascade::v2::GenerateResponse m;
    std::string victim;
    std::vector<int32_t> tokens;
    std::string text;
    int starts = 0;
    cascade::v2::GenerateFinish finish;
    std::thread killer;
    while (reader->Read(&m)) {
      if (m.has_start()) {
        ++starts;
        victim = m.start().worker_id();
      }
      if (m.has_delta()) {
        tokens.insert(tokens.end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
        text += m.delta().text();
        if (tokens.size() >= 10 && !killer.joinable()) {
          const int vi = stack.WorkerIndex(victim);
          killer = std::thread([&stack, vi] { stack.worker(vi).Shutdown(absl::ZeroDuration()); });
        }
      }
      if (m.has_finish()) finish = m.finish();
    }
    grpc::Status st = reader->Finish();
    if (killer.joinable()) killer.join();
    ASSERT_TRUE(st.ok()) << (seeded ? "seeded: " : "greedy: ") << st.error_message();
    EXPECT_EQ(starts, 1);
    EXPECT_EQ(tokens, want.tokens) << (seeded ? "seeded" : "greedy") << " continuation differs";
    EXPECT_EQ(text, want.text);
    EXPECT_EQ(finish.finish_reason(), cascade::v2::FINISH_REASON_LENGTH);
    EXPECT_EQ(finish.usage().completion_tokens(), 150);
  }
}

// An admin pin in the registry reaches the holder with its heartbeats and keeps the chunk
// cached under pressure that evicts it otherwise.
TEST(ServingTest, RegistryPinKeepsAChunkOnItsHolderUnderPressure) {
  for (bool pin : {false, true}) {
    // GPU tier only: with a host tier the unpinned chunk would come back from host memory.
    Stack stack({.workers = 1, .kv_blocks = 24, .host_kv_bytes = 0});
    auto req = Req(LongSystemPrompt(), "q", 2);
    Reply first = Generate(stack.gateway(), req);
    ASSERT_TRUE(first.status.ok());
    auto sys_hash = hash::Hash128::FromHex(first.start.chunks(0).hash());
    ASSERT_TRUE(sys_hash.has_value());
    ASSERT_TRUE(WaitFor([&] {
      auto c = stack.registry()->GetChunk(*sys_hash);
      return c.ok() && !c->holders.empty();
    }));
    if (pin) {
      ASSERT_TRUE(stack.registry()->PinChunk(*sys_hash, 60, std::nullopt).ok());
      ASSERT_TRUE(WaitFor([&] { return stack.WorkerStats(0).used_kv_blocks() > 0; }))
          << "the worker never pinned the chunk the registry listed";
    }
    for (int i = 0; i < 4; ++i) {  // each needs about 8 of the 24 blocks
      std::string filler;
      for (int w = 0; w < 20; ++w) filler += "word" + std::to_string(i * 1000 + w) + " ";
      Reply f = Generate(stack.gateway(), Req(filler, "x", 2));
      ASSERT_TRUE(f.status.ok()) << f.status.error_message() << " (prompt "
                                 << f.start.prompt_tokens() << ")";
    }
    Reply again = Generate(stack.gateway(), req);
    ASSERT_TRUE(again.status.ok());
    if (pin) {
      EXPECT_GT(again.start.cached_tokens(), 0) << "the pinned chunk was evicted";
    } else {
      EXPECT_EQ(again.start.cached_tokens(), 0)
          << "the pressure does not evict: the test proves nothing";
    }
    EXPECT_EQ(again.tokens, first.tokens);
  }
}

TEST(ServingTest, FailsOverToAnotherWorkerBeforeTheFirstToken) {
  Stack stack({.workers = 2});
  stack.worker(0).Shutdown(absl::ZeroDuration());  // the registry still lists it for a lease
  for (int i = 0; i < 4; ++i) {
    Reply r = Generate(stack.gateway(), Req("sys", "q" + std::to_string(i)));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.start.worker_id(), "w1");
  }
}

TEST(ServingTest, StopStringSpanningTokensIsFoundAndNeverEmitted) {
  Stack stack({.workers = 1});
  Reply full = Generate(stack.gateway(), Req("sys", "write", 30));
  ASSERT_TRUE(full.status.ok());
  // Pick a stop string that straddles the boundary between two deltas' texts.
  std::string stop;
  size_t pos = 0;
  for (size_t i = 0; i + 1 < full.texts.size(); ++i) {
    pos += full.texts[i].size();
    const std::string& a = full.texts[i];
    const std::string& b = full.texts[i + 1];
    if (a.size() >= 1 && b.size() >= 1 && tokenizer::IsValidUtf8(a.substr(a.size() - 1)) &&
        tokenizer::IsValidUtf8(b.substr(0, 1))) {
      stop = a.substr(a.size() - 1) + b.substr(0, 1);
      pos -= 1;
      break;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no ASCII token boundary in: " << full.text;
  const size_t first = full.text.find(stop);
  auto req = Req("sys", "write", 30);
  req.mutable_sampling()->add_stop(stop);
  Reply r = Generate(stack.gateway(), req);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.finish.finish_reason(), cascade::v2::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(r.finish.stop_reason(), stop);
  EXPECT_EQ(r.text, full.text.substr(0, first));
  EXPECT_EQ(r.text.find(stop), std::string::npos);
}

TEST(ServingTest, StreamedTextNeverSplitsACodePoint) {
  Stack stack({.workers = 1});
  for (int i = 0; i < 4; ++i) {
    auto req =
        Req("系统提示：请用中文回答。🙂", "你好，世界！" + std::to_string(i), 24);
    req.mutable_sampling()->set_temperature(1.0f);
    req.mutable_sampling()->set_seed(100 + i);
    Reply r = Generate(stack.gateway(), req);
    ASSERT_TRUE(r.status.ok());
    for (const std::string& t : r.texts)
      EXPECT_TRUE(tokenizer::IsValidUtf8(t)) << "split code point";
  }
}

TEST(ServingTest, BearerTokenIsRequiredWhenConfigured) {
  Stack stack({.workers = 1, .auth_token = "s3cret"});
  EXPECT_EQ(Generate(stack.gateway(), Req("s", "q")).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Wrong tokens of the same length, shorter (a prefix) and longer (the token and more): the
  // constant-time compare checks the length as well as the bytes.
  for (const char* wrong : {"Bearer nope", "Bearer s3creT", "Bearer s3cre", "Bearer s3cretX",
                            "s3cret", "Bearer  s3cret"}) {
    EXPECT_EQ(Generate(stack.gateway(), Req("s", "q"), 60000, {{"authorization", wrong}})
                  .status.error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << wrong;
  }
  EXPECT_TRUE(Generate(stack.gateway(), Req("s", "q"), 60000, {{"authorization", "Bearer s3cret"}})
                  .status.ok());
}

// Turn 2 also asks for no thinking (Qwen3's enable_thinking): its new tokens are its query and the
// generation prompt with the empty think block, as Tokenize gives them with the same flag.
TEST(ServingTest, ChatTurnsPrefillOnlyTheirNewTokens) {
  Stack stack({.workers = 2});
  grpc::ClientContext ctx;
  auto stream = stack.gateway().Chat(&ctx);
  const char* queries[] = {"Hello there, who are you?", "Tell me more.", "And finally?"};
  auto turn_tokens = [&](const char* query, bool thinking) {  // QUERY + generation prompt
    cascade::v2::TokenizeRequest t;
    auto* c = t.add_chunks();
    c->set_kind(cascade::v2::CHUNK_KIND_QUERY);
    c->set_text(query);
    if (!thinking) t.set_enable_thinking(false);
    cascade::v2::TokenizeResponse r;
    grpc::ClientContext tc;
    EXPECT_TRUE(stack.gateway().Tokenize(&tc, t, &r).ok());
    return static_cast<int64_t>(r.token_ids_size());
  };
  EXPECT_EQ(turn_tokens(queries[2], false), turn_tokens(queries[2], true) + 4);
  int64_t prev_total = 0;
  std::string worker;
  for (int turn = 0; turn < 3; ++turn) {
    cascade::v2::ChatRequest req;
    if (turn == 2) req.set_enable_thinking(false);
    if (turn == 0) {
      auto* s = req.add_chunks();
      s->set_kind(cascade::v2::CHUNK_KIND_SYSTEM);
      s->set_text(LongSystemPrompt());
    }
    auto* q = req.add_chunks();
    q->set_kind(cascade::v2::CHUNK_KIND_QUERY);
    q->set_text(queries[turn]);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(10);
    req.mutable_sampling()->set_ignore_eos(true);
    ASSERT_TRUE(stream->Write(req));
    cascade::v2::ChatResponse resp;
    cascade::v2::GenerateStart start;
    int64_t completion = 0;
    while (stream->Read(&resp)) {
      EXPECT_EQ(resp.turn(), turn);
      if (resp.event().has_start()) start = resp.event().start();
      if (resp.event().has_finish()) {
        completion = resp.event().finish().usage().completion_tokens();
        break;
      }
    }
    const int64_t prefilled = start.prompt_tokens() - start.cached_tokens();
    if (turn > 0) {
      // Everything up to the previous turn's answer came from the cache, but the blocks that
      // end in the new tokens (at most one block of old tokens, 16 here).
      const int64_t new_tokens = start.prompt_tokens() - prev_total;
      EXPECT_LE(prefilled, new_tokens + 16) << "turn " << turn << " re-prefilled old tokens";
      // The previous answer's closing "<|im_end|>\n" (2 tokens), the query, the generation prompt.
      EXPECT_EQ(new_tokens, 2 + turn_tokens(queries[turn], turn != 2)) << "turn " << turn;
      EXPECT_EQ(start.worker_id(), worker) << "the session moved off its KV";
    }
    worker = start.worker_id();
    prev_total = start.prompt_tokens() + completion;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(ServingTest, RegistryRestartRestoresRoutingToTheHolder) {
  Stack stack;
  auto req = Req(LongSystemPrompt(), "Which rule is last?", 6);
  Reply cold = Generate(stack.gateway(), req);
  ASSERT_TRUE(cold.status.ok());
  const std::string holder = cold.start.worker_id();
  auto knows = [&] {
    auto l = stack.registry()->ListChunks(100, holder, nullptr);
    return l.ok() && !l->empty();
  };
  ASSERT_TRUE(WaitFor(knows));
  stack.RestartRegistry();  // soft state gone: it knows nothing now
  EXPECT_FALSE(knows());
  // Workers see NOT_FOUND or a new epoch, re-register and resync what they hold.
  ASSERT_TRUE(WaitFor(knows, 10000)) << "the holder never resynced its chunks";
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(stack.WaitForIdleLoad());
    Reply hot = Generate(stack.gateway(), req);
    ASSERT_TRUE(hot.status.ok()) << hot.status.error_message();
    EXPECT_EQ(hot.start.worker_id(), holder);
    EXPECT_GT(hot.start.cached_tokens(), 0);
    EXPECT_EQ(hot.tokens, cold.tokens);
  }
}

TEST(ServingTest, SlowReaderGetsCoalescedMessagesAndAFastOneGetsEveryToken) {
  Stack stack({.workers = 1});
  // A small HTTP/2 receive window, so the client's slowness reaches the gateway as
  // backpressure after about a kilobyte instead of after the default 64 KB.
  grpc::ChannelArguments args;
  args.SetInt("grpc.http2.lookahead_bytes", 1024);
  args.SetInt("grpc.http2.bdp_probe", 0);
  auto small_window = cascade::v2::GatewayService::NewStub(grpc::CreateCustomChannel(
      stack.gateway_server().address(), grpc::InsecureChannelCredentials(), args));
  auto count = [&](bool slow, int64_t* tokens) {
    const int64_t generated_before = stack.WorkerStats(0).generation_tokens();
    grpc::ClientContext ctx;
    auto reader = small_window->Generate(&ctx, Req("sys", "stream please", 120));
    cascade::v2::GenerateResponse m;
    int messages = 0;
    *tokens = 0;
    bool first = true;
    while (reader->Read(&m)) {
      if (!m.has_delta()) continue;
      ++messages;
      *tokens += m.delta().token_ids_size();
      if (slow && first) {
        // Fall behind until the worker has generated every token (however slow the machine),
        // so what is left can only reach this reader coalesced.
        const int64_t before = generated_before;
        EXPECT_TRUE(WaitFor(
            [&] { return stack.WorkerStats(0).generation_tokens() >= before + 120; }, 30000))
            << "the worker never finished generating";
      }
      first = false;
    }
    EXPECT_TRUE(reader->Finish().ok());
    std::cerr << (slow ? "slow" : "fast") << " reader: " << messages << " delta messages for "
              << *tokens << " tokens\n";
    return messages;
  };
  int64_t slow_tokens = 0, fast_tokens = 0;
  const int slow_msgs = count(true, &slow_tokens);
  const int fast_msgs = count(false, &fast_tokens);
  EXPECT_EQ(slow_tokens, 120);
  EXPECT_EQ(fast_tokens, 120);
  // The slow reader's first ~1 KB (its receive window, some 40-55 one-token messages) was in
  // flight before it fell behind; everything generated after that must come coalesced.
  EXPECT_LT(slow_msgs, 90) << "a reader that fell behind still got one message per token";
  EXPECT_GT(fast_msgs, slow_msgs);
}

TEST(ServingTest, MetricsUseVllmStyleNames) {
  Stack stack({.workers = 1, .metrics = true});
  ASSERT_TRUE(Generate(stack.gateway(), Req(LongSystemPrompt(), "q", 4)).status.ok());
  ASSERT_TRUE(Generate(stack.gateway(), Req(LongSystemPrompt(), "q", 4)).status.ok());
  const std::string worker =
      common::testing::HttpGet(stack.worker(0).runner().metrics_port(), "/metrics");
  for (const char* name :
       {"cascade:num_requests_running{worker=\"w0\"}", "cascade:num_requests_waiting",
        "cascade:kv_cache_usage_perc", "cascade:prefix_cache_queries_total",
        "cascade:prefix_cache_hits_total", "cascade:num_preemptions_total",
        "cascade:generation_tokens_total", "cascade:kv_cache_pinned_blocks",
        "cascade:pins_refused_total", "cascade:held_chunks", "cascade:held_chunks_displaced_total",
        "cascade:engine_overlapped_steps_total", "cascade:engine_speculated_steps_total",
        "cascade:engine_speculated_rows_dropped_total"}) {
    EXPECT_NE(worker.find(name), std::string::npos)
        << name << " missing from the worker's /metrics";
  }
  // Two requests of 4 tokens, one after the other, took at least 8 steps (a prefill step that
  // samples the first token and three decode steps each).
  const std::string steps = "cascade:engine_steps_total{worker=\"w0\"} ";
  const size_t at = worker.find(steps);
  ASSERT_NE(at, std::string::npos) << worker;
  EXPECT_GE(std::stod(worker.substr(at + steps.size())), 8.0) << worker.substr(at, 60);
  const std::string gw =
      common::testing::HttpGet(stack.gateway_server().runner().metrics_port(), "/metrics");
  for (const char* name :
       {"cascade:time_to_first_token_seconds_bucket", "cascade:inter_token_latency_seconds_bucket",
        "cascade:request_success_total{finished_reason=\"FINISH_REASON_LENGTH\"}",
        "cascade:gateway_prefix_cache_hits_total"}) {
    EXPECT_NE(gw.find(name), std::string::npos) << name << " missing from the gateway's /metrics";
  }
}

// The exposition is what Prometheus itself accepts: `promtool check metrics` (Debian's
// prometheus package, installed by scripts/setup.sh) parses and lints the page of a stack that
// has served requests (gateway and worker metrics share this process's registry). One lint
// finding is accepted by design: names carry the `cascade:` prefix as vLLM's carry `vllm:`, so
// dashboards built for vLLM map onto ours, and promtool reserves colons for recording rules.
// A parse error or any other finding fails the test.
TEST(ServingTest, MetricsPassPromtoolCheck) {
  const char* promtool = "/usr/bin/promtool";
  ASSERT_EQ(access(promtool, X_OK), 0) << "promtool is missing: run scripts/setup.sh";
  Stack stack({.workers = 1, .metrics = true});
  ASSERT_TRUE(Generate(stack.gateway(), Req(LongSystemPrompt(), "q", 4)).status.ok());
  ASSERT_TRUE(Generate(stack.gateway(), Req(LongSystemPrompt(), "q", 4)).status.ok());
  const test_support::ScratchDir scratch("cascade_metrics");
  for (int port :
       {stack.worker(0).runner().metrics_port(), stack.gateway_server().runner().metrics_port()}) {
    const std::string page = common::testing::HttpGet(port, "/metrics");
    const size_t body = page.find("\r\n\r\n");
    ASSERT_NE(body, std::string::npos) << page;
    const std::string path = scratch.path() + "/metrics_" + std::to_string(port) + ".txt";
    {
      std::ofstream out(path);
      out << page.substr(body + 4);
    }
    const std::string cmd = std::string(promtool) + " check metrics < " + path + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string report;
    char buf[512];
    while (fgets(buf, sizeof(buf), p) != nullptr) report += buf;
    const int rc = pclose(p);
    int findings = 0, other = 0;
    for (absl::string_view line : absl::StrSplit(report, '\n', absl::SkipEmpty())) {
      ++findings;
      if (!absl::StartsWith(line, "cascade:") ||
          !absl::EndsWith(line, "metric names should not contain ':'")) {
        ++other;
      }
    }
    EXPECT_EQ(other, 0) << "promtool check metrics on " << port << ":\n" << report;
    EXPECT_GT(findings, 10) << report;  // the accepted lint proves promtool read the page
    EXPECT_TRUE(rc == 0 || findings > 0) << report;
  }
}

}  // namespace
}  // namespace cascade::testing
