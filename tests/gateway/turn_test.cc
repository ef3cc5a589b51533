// Turn's failover and exact resume against scripted fake workers (fake_worker.h), no network:
// a worker that dies after N tokens is replaced by the next candidate, which gets the prompt
// plus an ASSISTANT chunk of the tokens already emitted (counted in resumed_tokens) and the
// remaining max_tokens, and the client's stream equals the uninterrupted one; refusals fail
// over; a silent worker ends at the deadline; with no candidate left the client gets an error
// finish with the usage so far.
#include "services/gateway/turn.h"

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "common/metrics.h"
#include "services/gateway/gateway_metrics.h"
#include "services/gateway/recent_routes.h"
#include "tests/gateway/fake_worker.h"
#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::gateway {
namespace {

using cascade::v2::GenerateResponse;
using testing::FakeBehavior;

constexpr int kMaxTokens = 12;

// Records what a turn tells its client.
class RecordingSink final : public TurnSink {
 public:
  void Emit(GenerateResponse ev) override {
    MutexLock lock(&mu_);
    events_.push_back(std::move(ev));
  }
  void TurnDone(const grpc::Status& status, const TurnResult& result) override {
    MutexLock lock(&mu_);
    ++done_calls_;
    status_ = status;
    result_ = result;
    cv_.SignalAll();
  }
  bool WaitDone(std::chrono::milliseconds timeout) {
    MutexLock lock(&mu_);
    return cv_.WaitFor(&mu_, timeout,
                       [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_calls_ > 0; });
  }
  int done_calls() {
    MutexLock lock(&mu_);
    return done_calls_;
  }
  grpc::Status status() {
    MutexLock lock(&mu_);
    return status_;
  }
  TurnResult result() {
    MutexLock lock(&mu_);
    return result_;
  }
  std::vector<GenerateResponse> events() {
    MutexLock lock(&mu_);
    return events_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::vector<GenerateResponse> events_ ABSL_GUARDED_BY(mu_);
  int done_calls_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  TurnResult result_ ABSL_GUARDED_BY(mu_);
};

// What the client saw, summed up.
struct Stream {
  int starts = 0;
  std::vector<int32_t> tokens;
  std::string text;
  int finishes = 0;
  cascade::v2::GenerateFinish finish;
  grpc::StatusCode code = grpc::StatusCode::OK;
};

Stream Summarize(RecordingSink& sink) {
  Stream s;
  for (const GenerateResponse& ev : sink.events()) {
    if (ev.has_start()) ++s.starts;
    if (ev.has_delta()) {
      s.tokens.insert(s.tokens.end(), ev.delta().token_ids().begin(), ev.delta().token_ids().end());
      s.text += ev.delta().text();
    }
    if (ev.has_finish()) {
      ++s.finishes;
      s.finish = ev.finish();
    }
  }
  s.code = sink.status().error_code();
  return s;
}

class TurnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = tokenizer::testutil::Qwen3();
    ASSERT_NE(tok_, nullptr);
    ASSERT_TRUE(testing::UseLetterVocab(*tok_));  // every token the fake model draws has text
    for (const char* a : {"clean", "w1", "w2", "w3"}) cluster_.Add(a);
    pool_ = cluster_.NewPool();
  }
  void TearDown() override { cluster_.JoinAll(); }

  TurnParams Params(std::vector<std::string> addresses,
                    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    TurnParams p;
    p.request_id = "req-1";
    p.request.set_request_id("req-1");
    p.request.set_model("tiny");
    auto add = [&](cascade::v2::ChunkKind kind, const std::string& text) {
      auto ids = tok_->Encode(text);
      EXPECT_TRUE(ids.ok());
      auto* c = p.request.add_chunks();
      c->set_kind(kind);
      c->mutable_token_ids()->Assign(ids->begin(), ids->end());
      prompt_.insert(prompt_.end(), ids->begin(), ids->end());
    };
    prompt_.clear();
    add(cascade::v2::CHUNK_KIND_SYSTEM, "<|im_start|>system\nYou are terse.<|im_end|>\n");
    add(cascade::v2::CHUNK_KIND_QUERY, "<|im_start|>user\nName a color.<|im_end|>\n");
    add(cascade::v2::CHUNK_KIND_GENERATION_PROMPT, "<|im_start|>assistant\n");
    p.request.mutable_sampling()->set_max_tokens(kMaxTokens);
    p.request.mutable_sampling()->set_seed(7);
    for (const std::string& a : addresses) p.workers.push_back(Scored{Candidate{"id-" + a, a}, 0});
    p.deadline = std::chrono::system_clock::now() + timeout;
    return p;
  }

  // Runs a turn to its end and returns what the client saw.
  Stream Run(TurnParams p, RecordingSink* sink = nullptr) {
    RecordingSink local;
    if (sink == nullptr) sink = &local;
    std::shared_ptr<Turn> t = Turn::Start(std::move(p), pool_.get(), *tok_, sink, &metrics_);
    EXPECT_TRUE(sink->WaitDone(std::chrono::seconds(30))) << "the turn never ended";
    cluster_.JoinAll();
    EXPECT_EQ(sink->done_calls(), 1);
    return Summarize(*sink);
  }

  // The stream of one healthy worker: what every failover and resume must reproduce.
  Stream Uninterrupted() {
    Stream s = Run(Params({"clean"}));
    EXPECT_EQ(cluster_.at("clean")->requests().size(), 1u);
    return s;
  }

  const tokenizer::Tokenizer* tok_ = nullptr;
  testing::FakeCluster cluster_;
  std::unique_ptr<WorkerPool> pool_;
  common::MetricsRegistry registry_;
  TurnMetrics metrics_{registry_};
  std::vector<int32_t> prompt_;  // the last Params' prompt tokens
};

TEST_F(TurnTest, UninterruptedStreamIsTheWorkersTokensWithTheirText) {
  const Stream s = Uninterrupted();
  EXPECT_EQ(s.code, grpc::StatusCode::OK);
  EXPECT_EQ(s.starts, 1);
  EXPECT_EQ(s.tokens, testing::FakeContinuation(prompt_, kMaxTokens));
  auto text = tok_->Decode(s.tokens);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(s.text, *text);
  EXPECT_EQ(s.finishes, 1);
  EXPECT_EQ(s.finish.finish_reason(), cascade::v2::FINISH_REASON_LENGTH);
  EXPECT_EQ(s.finish.usage().completion_tokens(), kMaxTokens);
  EXPECT_EQ(s.finish.usage().prompt_tokens(), static_cast<int64_t>(prompt_.size()));
}

// The worker the prompt is sent to is noted for routing under the registry's chunk hashes, so
// requests routed next count the prompt as held there; chunks without a hash (no registry
// answer) end what is noted. A worker that refused it is noted too, and so is the next one.
TEST_F(TurnTest, TheWorkerThePromptGoesToIsNotedForRouting) {
  RecentRoutes recent(/*ttl_ms=*/60000, /*capacity=*/100);
  cluster_.at("w1")->Script({{FakeBehavior::kRefuse}});
  TurnParams p = Params({"w1", "w2"});
  std::vector<RoutedChunk> chunks;
  int64_t end = 0;
  for (int i = 0; i + 1 < p.request.chunks_size(); ++i) {  // the last chunk has no hash
    const hash::Hash128 h{7, static_cast<uint64_t>(i)};
    p.request.mutable_chunks(i)->set_hash(h.ToHex());
    chunks.push_back({h, end += p.request.chunks(i).token_ids_size()});
  }
  p.recent = &recent;
  EXPECT_EQ(Run(std::move(p)).code, grpc::StatusCode::OK);
  EXPECT_EQ(recent.size(), chunks.size());
  std::vector<Candidate> c = {Candidate{"id-w1", "w1"}, Candidate{"id-w2", "w2"},
                              Candidate{"id-w3", "w3"}};
  EXPECT_EQ(recent.Apply(chunks, RecentRoutes::NowMs(), &c), 2);
  EXPECT_EQ(c[0].routed_tokens, end);
  EXPECT_EQ(c[1].routed_tokens, end);
  EXPECT_EQ(c[2].routed_tokens, 0);
}

TEST_F(TurnTest, WorkerDyingAfterNTokensResumesOnTheNextWithTheEmittedTokensAndTheRest) {
  const Stream clean = Uninterrupted();
  cluster_.at("w1")->Script({{FakeBehavior::kDie, 5}});
  TurnParams p = Params({"w1", "w2"});
  p.request.mutable_sampling()->set_min_tokens(8);
  const cascade::v2::WorkerServiceGenerateRequest original = p.request;
  const Stream s = Run(std::move(p));

  EXPECT_EQ(s.code, grpc::StatusCode::OK);
  EXPECT_EQ(s.starts, 1) << "the client gets one start, not one per worker";
  EXPECT_EQ(s.tokens, clean.tokens);
  EXPECT_EQ(s.text, clean.text);
  EXPECT_EQ(s.finishes, 1);
  EXPECT_EQ(s.finish.finish_reason(), clean.finish.finish_reason());
  EXPECT_EQ(s.finish.usage().completion_tokens(), kMaxTokens);
  EXPECT_EQ(s.finish.usage().prompt_tokens(), clean.finish.usage().prompt_tokens());

  // The replacement got the prompt, then an ASSISTANT chunk of the 5 tokens emitted, and was
  // asked for the 7 left, with the same seed.
  auto asked = cluster_.at("w2")->requests();
  ASSERT_EQ(asked.size(), 1u);
  const auto& r = asked[0];
  ASSERT_EQ(r.chunks_size(), original.chunks_size() + 1);
  for (int i = 0; i < original.chunks_size(); ++i) {
    EXPECT_EQ(r.chunks(i).SerializeAsString(), original.chunks(i).SerializeAsString());
  }
  const auto& tail = r.chunks(original.chunks_size());
  EXPECT_EQ(tail.kind(), cascade::v2::CHUNK_KIND_ASSISTANT);
  EXPECT_EQ(std::vector<int32_t>(tail.token_ids().begin(), tail.token_ids().end()),
            std::vector<int32_t>(clean.tokens.begin(), clean.tokens.begin() + 5));
  EXPECT_EQ(r.sampling().max_tokens(), kMaxTokens - 5);
  EXPECT_EQ(r.sampling().min_tokens(), 3) << "min_tokens counts the attempt's tokens too";
  EXPECT_EQ(r.resumed_tokens(), 5) << "the penalties count those 5 as generated";
  EXPECT_EQ(r.sampling().seed(), 7u);
  EXPECT_EQ(metrics_.resumes->Value(), 1);
  EXPECT_EQ(metrics_.running->Value(), 0);
}

// A worker whose stream fails after the last token the client asked for (its finish message
// lost: scale_test's drained worker showed it, "failed after 6 tokens: Broken pipe", once in a
// few CI runs) leaves the output whole: the turn ends as the worker would have ended it (LENGTH,
// the usage), with no resume (nothing is left to ask for) and no error, with resume on or off
// and with no other worker to go to.
TEST_F(TurnTest, WorkerFailingAfterItsLastTokenEndsTheTurnWholeNotFailed) {
  const Stream clean = Uninterrupted();
  for (bool resume : {true, false}) {
    for (std::vector<std::string> workers :
         {std::vector<std::string>{"w1", "w2"}, std::vector<std::string>{"w1"}}) {
      cluster_.at("w1")->Script({{FakeBehavior::kDie, kMaxTokens}});
      TurnParams p = Params(workers);
      p.resume_mid_stream = resume;
      RecordingSink sink;
      const Stream s = Run(std::move(p), &sink);
      const std::string what =
          std::string(resume ? "resume on, " : "resume off, ") + std::to_string(workers.size());
      EXPECT_EQ(s.code, grpc::StatusCode::OK) << what << ": " << sink.status().error_message();
      EXPECT_EQ(s.starts, 1) << what;
      EXPECT_EQ(s.tokens, clean.tokens) << what;
      EXPECT_EQ(s.text, clean.text) << what;
      ASSERT_EQ(s.finishes, 1) << what;
      EXPECT_EQ(s.finish.finish_reason(), cascade::v2::FINISH_REASON_LENGTH) << what;
      EXPECT_EQ(s.finish.usage().completion_tokens(), kMaxTokens) << what;
      EXPECT_EQ(s.finish.usage().prompt_tokens(), clean.finish.usage().prompt_tokens()) << what;
      EXPECT_EQ(sink.result().finish_reason, cascade::v2::FINISH_REASON_LENGTH) << what;
      EXPECT_TRUE(cluster_.at("w2")->requests().empty()) << what;
    }
  }
  EXPECT_EQ(metrics_.resumes->Value(), 0);
  EXPECT_EQ(metrics_.running->Value(), 0);
}

TEST_F(TurnTest, TwoWorkersFailingInTurnStillGiveTheUninterruptedStream) {
  const Stream clean = Uninterrupted();
  cluster_.at("w1")->Script({{FakeBehavior::kDie, 3}});
  cluster_.at("w2")->Script({{FakeBehavior::kDie, 4}});
  TurnParams p = Params({"w1", "w2", "w3"});
  const int prompt_chunks = p.request.chunks_size();
  const Stream s = Run(std::move(p));

  EXPECT_EQ(s.code, grpc::StatusCode::OK);
  EXPECT_EQ(s.starts, 1);
  EXPECT_EQ(s.tokens, clean.tokens);
  EXPECT_EQ(s.text, clean.text);
  EXPECT_EQ(s.finish.usage().completion_tokens(), kMaxTokens);
  // The third worker's prompt holds all 7 tokens emitted, as one ASSISTANT chunk.
  auto asked = cluster_.at("w3")->requests();
  ASSERT_EQ(asked.size(), 1u);
  ASSERT_EQ(asked[0].chunks_size(), prompt_chunks + 1);
  const auto& tail = asked[0].chunks(prompt_chunks);
  EXPECT_EQ(tail.kind(), cascade::v2::CHUNK_KIND_ASSISTANT);
  EXPECT_EQ(tail.token_ids_size(), 7);
  EXPECT_EQ(asked[0].sampling().max_tokens(), kMaxTokens - 7);
  EXPECT_EQ(asked[0].resumed_tokens(), 7);
  EXPECT_EQ(metrics_.resumes->Value(), 2);
}

TEST_F(TurnTest, WorkerRefusingBeforeItsFirstMessageFailsOverWithTheSameRequest) {
  const Stream clean = Uninterrupted();
  cluster_.at("w1")->Script({{FakeBehavior::kRefuse}});
  cluster_.at("w2")->Script(
      {{FakeBehavior::kRefuse, 0, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "full")}});
  TurnParams p = Params({"w1", "w2", "w3"});
  const std::string sent = p.request.SerializeAsString();
  const Stream s = Run(std::move(p));

  EXPECT_EQ(s.code, grpc::StatusCode::OK);
  EXPECT_EQ(s.tokens, clean.tokens);
  EXPECT_EQ(s.text, clean.text);
  for (const char* a : {"w1", "w2", "w3"}) {
    auto asked = cluster_.at(a)->requests();
    ASSERT_EQ(asked.size(), 1u) << a;
    EXPECT_EQ(asked[0].SerializeAsString(), sent) << a << " got a different request";
  }
  EXPECT_EQ(metrics_.failovers->Value(), 2);
  EXPECT_EQ(metrics_.resumes->Value(), 0);
}

TEST_F(TurnTest, WorkerRefusingAsInvalidArgumentIsNotRetriedElsewhere) {
  cluster_.at("w1")->Script(
      {{FakeBehavior::kRefuse, 0, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad")}});
  const Stream s = Run(Params({"w1", "w2"}));
  EXPECT_EQ(s.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(cluster_.at("w2")->requests().empty());
  EXPECT_EQ(s.finishes, 0);
}

TEST_F(TurnTest, WorkerThatNeverAnswersEndsAtTheDeadlineWithoutTryingOthers) {
  cluster_.at("w1")->Script({{FakeBehavior::kHangSilent}});
  TurnParams p = Params({"w1", "w2"}, std::chrono::milliseconds(300));
  const auto deadline = p.deadline;
  const auto began = std::chrono::system_clock::now();
  const Stream s = Run(std::move(p));
  // The request's deadline travels with the call: it is the whole request's, so none is left
  // for another worker.
  ASSERT_EQ(cluster_.at("w1")->options().size(), 1u);
  EXPECT_EQ(cluster_.at("w1")->options()[0].deadline, deadline);
  EXPECT_EQ(cluster_.at("w1")->options()[0].request_id, "req-1");
  EXPECT_EQ(s.code, grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GE(std::chrono::system_clock::now() - began, std::chrono::milliseconds(250));
  EXPECT_TRUE(cluster_.at("w2")->requests().empty());
  EXPECT_EQ(s.starts, 0);
  EXPECT_EQ(s.finishes, 0);
  EXPECT_EQ(metrics_.running->Value(), 0);
}

TEST_F(TurnTest, WorkerStallingMidStreamEndsAtTheDeadlineWithAnErrorFinishAndUsage) {
  cluster_.at("w1")->Script({{FakeBehavior::kHang, 4}});
  const Stream s = Run(Params({"w1", "w2"}, std::chrono::milliseconds(300)));
  EXPECT_EQ(s.code, grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(s.tokens.size(), 4u);
  ASSERT_EQ(s.finishes, 1);
  EXPECT_EQ(s.finish.finish_reason(), cascade::v2::FINISH_REASON_ERROR);
  EXPECT_EQ(s.finish.usage().completion_tokens(), 4);
  EXPECT_EQ(s.finish.usage().prompt_tokens(), static_cast<int64_t>(prompt_.size()));
  EXPECT_TRUE(cluster_.at("w2")->requests().empty());
}

TEST_F(TurnTest, NoCandidateLeftGivesAnErrorFinishWithTheUsageSoFarThenUnavailable) {
  const Stream clean = Uninterrupted();
  cluster_.at("w1")->Script({{FakeBehavior::kDie, 4}});
  cluster_.at("w2")->Script({{FakeBehavior::kDie, 3}});
  TurnParams p = Params({"w1", "w2", "w3"});
  p.max_attempts = 2;  // w3 is a candidate but past the attempts allowed
  RecordingSink sink;
  const Stream s = Run(std::move(p), &sink);

  EXPECT_EQ(s.code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(sink.status().error_message().find("failed after 7 tokens"), std::string::npos)
      << sink.status().error_message();
  EXPECT_EQ(s.tokens, std::vector<int32_t>(clean.tokens.begin(), clean.tokens.begin() + 7));
  ASSERT_EQ(s.finishes, 1);
  EXPECT_EQ(s.finish.finish_reason(), cascade::v2::FINISH_REASON_ERROR);
  EXPECT_EQ(s.finish.usage().completion_tokens(), 7);
  EXPECT_EQ(s.finish.usage().prompt_tokens(), static_cast<int64_t>(prompt_.size()));
  EXPECT_TRUE(cluster_.at("w3")->requests().empty());
  EXPECT_EQ(sink.result().finish_reason, cascade::v2::FINISH_REASON_ERROR);
}

TEST_F(TurnTest, EveryCandidateRefusingGivesTheLastRefusalAndNoEvents) {
  cluster_.at("w1")->Script({{FakeBehavior::kRefuse}});
  cluster_.at("w2")->Script(
      {{FakeBehavior::kRefuse, 0, grpc::Status(grpc::StatusCode::UNAVAILABLE, "w2 is down")}});
  RecordingSink sink;
  const Stream s = Run(Params({"w1", "w2"}), &sink);
  EXPECT_EQ(s.code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(sink.status().error_message(), "w2 is down");
  EXPECT_EQ(cluster_.at("w1")->requests().size(), 1u);
  EXPECT_EQ(cluster_.at("w2")->requests().size(), 1u);
  EXPECT_TRUE(sink.events().empty());
}

TEST_F(TurnTest, CandidatesThatCannotBeDialledAreSkipped) {
  RecordingSink sink;
  const Stream s = Run(Params({"nowhere", "w1"}), &sink);  // the pool has no client for "nowhere"
  EXPECT_EQ(s.code, grpc::StatusCode::OK);
  EXPECT_EQ(s.tokens.size(), static_cast<size_t>(kMaxTokens));
  EXPECT_EQ(sink.result().worker_address, "w1");
}

TEST_F(TurnTest, NoCandidateThatCanBeDialledGivesUnavailable) {
  RecordingSink sink;
  const Stream s = Run(Params({"nowhere"}), &sink);
  EXPECT_EQ(s.code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(sink.status().error_message().find("every candidate worker failed"), std::string::npos)
      << sink.status().error_message();
}

TEST_F(TurnTest, NoCandidatesAtAllGivesUnavailableAtOnce) {
  RecordingSink sink;
  const Stream s = Run(Params({}), &sink);
  EXPECT_EQ(s.code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(sink.status().error_message().find("no worker serves this model"), std::string::npos);
}

TEST_F(TurnTest, ResumeTurnedOffEndsWithAnErrorFinishInsteadOfContinuing) {
  cluster_.at("w1")->Script({{FakeBehavior::kDie, 5}});
  TurnParams p = Params({"w1", "w2"});
  p.resume_mid_stream = false;
  const Stream s = Run(std::move(p));
  EXPECT_EQ(s.code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.finish.finish_reason(), cascade::v2::FINISH_REASON_ERROR);
  EXPECT_EQ(s.finish.usage().completion_tokens(), 5);
  EXPECT_TRUE(cluster_.at("w2")->requests().empty());
}

TEST_F(TurnTest, ClientCancelCancelsTheWorkerCallAndEndsCancelled) {
  cluster_.at("w1")->Script({{FakeBehavior::kHang, 2}});
  RecordingSink sink;
  std::shared_ptr<Turn> t = Turn::Start(Params({"w1", "w2"}), pool_.get(), *tok_, &sink, &metrics_);
  // Cancel once the worker is streaming (its two tokens arrived).
  for (int i = 0; i < 2000 && Summarize(sink).tokens.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  t->Cancel();
  ASSERT_TRUE(sink.WaitDone(std::chrono::seconds(10)));
  cluster_.JoinAll();
  EXPECT_EQ(sink.status().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_EQ(cluster_.at("w1")->calls().size(), 1u);
  EXPECT_TRUE(cluster_.at("w1")->calls()[0]->cancelled());
  EXPECT_TRUE(cluster_.at("w2")->requests().empty()) << "a cancelled turn must not resume";
}

TEST_F(TurnTest, StopStringEndsTheTurnAndCancelsTheWorkerStream) {
  const Stream clean = Uninterrupted();
  // A stop string taken from the middle of the clean text: the client gets the text before its
  // first occurrence, never the stop string itself.
  const std::string stop = clean.text.substr(6, 2);
  const std::string before = clean.text.substr(0, clean.text.find(stop));
  TurnParams p = Params({"w1"});
  p.stop = {stop};
  const Stream s = Run(std::move(p));
  EXPECT_EQ(s.code, grpc::StatusCode::OK);
  EXPECT_EQ(s.text, before);
  EXPECT_EQ(s.finish.finish_reason(), cascade::v2::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(s.finish.stop_reason(), stop);
  ASSERT_EQ(cluster_.at("w1")->calls().size(), 1u);
  EXPECT_TRUE(cluster_.at("w1")->calls()[0]->cancelled()) << "the worker kept generating";
}

TEST_F(TurnTest, AStopTokenOfPartialUtf8IsNamedAsValidUtf8) {
  // A byte-level token that is part of a code point (a stop_token_ids entry may be any id): its
  // bytes alone are not UTF-8, and a proto3 string holding them makes the client's parse fail.
  int32_t partial = -1;
  for (int32_t id = 0; id < tok_->vocab_size() && partial < 0; ++id) {
    auto bytes = tok_->TokenBytes(id);
    if (bytes.ok() && !tok_->IsSpecial(id) && !tokenizer::IsValidUtf8(*bytes)) partial = id;
  }
  ASSERT_GE(partial, 0) << "the tokenizer has no partial-UTF-8 token";
  cluster_.at("w1")->Script({{FakeBehavior::kServe, 0, grpc::Status::OK, partial}});
  const Stream s = Run(Params({"w1"}));
  EXPECT_EQ(s.code, grpc::StatusCode::OK);
  EXPECT_EQ(s.finish.finish_reason(), cascade::v2::FINISH_REASON_STOP);
  EXPECT_FALSE(s.finish.stop_reason().empty());
  EXPECT_TRUE(tokenizer::IsValidUtf8(s.finish.stop_reason()))
      << "stop_reason holds bytes that are not UTF-8 for token " << partial;
  // What a client does with the event: it must parse.
  cascade::v2::GenerateFinish parsed;
  EXPECT_TRUE(parsed.ParseFromString(s.finish.SerializeAsString()));
}

TEST_F(TurnTest, LogprobsCarryTheirTokensText) {
  // TokenLogprob.text is what the OpenAI front shows as each token (and keys top_logprobs by):
  // empty, every alternative collapsed into one "" entry.
  TurnParams p = Params({"w1"});
  p.request.mutable_sampling()->set_logprobs(3);
  RecordingSink sink;
  const Stream s = Run(std::move(p), &sink);
  ASSERT_EQ(s.code, grpc::StatusCode::OK);
  int entries = 0;
  for (const GenerateResponse& ev : sink.events()) {
    if (!ev.has_delta()) continue;
    for (const cascade::v2::LogprobEntry& e : ev.delta().logprobs()) {
      ++entries;
      EXPECT_EQ(e.sampled().text(), *tok_->Decode(std::vector<int32_t>{e.sampled().token_id()}));
      ASSERT_EQ(e.top_size(), 3);
      for (const auto& t : e.top()) {
        EXPECT_EQ(t.text(), *tok_->Decode(std::vector<int32_t>{t.token_id()}));
      }
    }
  }
  EXPECT_EQ(entries, kMaxTokens);
}

TEST_F(TurnTest, TheTextOfATokenThatIsNotUtf8AloneIsItsBytesEscaped) {
  int32_t partial = -1;
  for (int32_t id = 0; id < tok_->vocab_size() && partial < 0; ++id) {
    auto bytes = tok_->TokenBytes(id);
    if (bytes.ok() && bytes->size() == 1 && !tokenizer::IsValidUtf8(*bytes)) partial = id;
  }
  ASSERT_GE(partial, 0);
  testing::FakeVocab() = {partial};
  TurnParams p = Params({"w1"});
  p.request.mutable_sampling()->set_logprobs(1);
  RecordingSink sink;
  ASSERT_EQ(Run(std::move(p), &sink).code, grpc::StatusCode::OK);
  const std::string want =
      absl::StrFormat("bytes:\\x%02x", static_cast<unsigned char>((*tok_->TokenBytes(partial))[0]));
  int entries = 0;
  for (const GenerateResponse& ev : sink.events()) {
    for (const cascade::v2::LogprobEntry& e : ev.delta().logprobs()) {
      ++entries;
      EXPECT_EQ(e.sampled().text(), want);
      EXPECT_TRUE(tokenizer::IsValidUtf8(e.sampled().text()));
    }
  }
  EXPECT_GT(entries, 0);
}

}  // namespace
}  // namespace cascade::gateway
