// Test helper: scripted workers behind the WorkerClient seam (worker_client.h), no network.
// A fake worker "generates" a deterministic continuation of whatever prompt it is given: each
// token is a function of every token before it, like a seeded model drawing per position. So a
// stream resumed elsewhere with the emitted tokens in its prompt continues exactly as the
// uninterrupted one, and a resume that loses or repeats a token shows up as a different stream.
// Each call runs on its own thread (gRPC reports on its threads too); the deadline is enforced
// here, as the transport would.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "services/gateway/worker_client.h"
#include "services/gateway/worker_pool.h"

namespace cascade::gateway::testing {

// What one Generate call to a fake worker does.
struct FakeBehavior {
  enum Kind {
    kServe,   // start, one message per token up to max_tokens, finish LENGTH, OK
    kRefuse,  // `status` before any message (down, overloaded, bad request)
    kDie,     // start and `tokens` tokens, then `status` (the worker died mid-stream)
    kHang,    // start and `tokens` tokens (kHangSilent: nothing at all), then nothing until
              // the deadline (DEADLINE_EXCEEDED) or a cancel (CANCELLED)
    kHangSilent,
  };
  Kind kind = kServe;
  int tokens = 0;
  grpc::Status status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake worker died");
  // kServe: >= 0 ends the stream as a stop token would (finish STOP naming this id), not LENGTH.
  int32_t stop_token_id = -1;
};

// Token ids the fake model draws from; a test sets them to ids with plain text.
inline std::vector<int32_t>& FakeVocab() {
  static std::vector<int32_t> v;
  return v;
}

// FakeVocab() = `tok`'s tokens of the single letters a..z, so every token the fake model draws
// has text; false where a letter is not one token.
template <typename Tokenizer>
bool UseLetterVocab(const Tokenizer& tok) {
  std::vector<int32_t>& vocab = FakeVocab();
  vocab.clear();
  for (char c = 'a'; c <= 'z'; ++c) {
    auto ids = tok.Encode(std::string(1, c));
    if (!ids.ok() || ids->size() != 1u) return false;
    vocab.push_back((*ids)[0]);
  }
  return true;
}

// The fake model: the next token after `context`.
inline int32_t FakeNextToken(const std::vector<int32_t>& context) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over every token so far
  for (int32_t t : context) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ULL;
  }
  const std::vector<int32_t>& vocab = FakeVocab();
  return vocab[(h >> 17) % vocab.size()];
}

// `n` tokens the fake model generates after `prompt`.
inline std::vector<int32_t> FakeContinuation(std::vector<int32_t> prompt, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(FakeNextToken(prompt));
    prompt.push_back(out.back());
  }
  return out;
}

class FakeWorker;

class FakeCall final : public WorkerCall, public std::enable_shared_from_this<FakeCall> {
 public:
  FakeCall(FakeWorker* worker, FakeBehavior behavior,
           const cascade::v2::WorkerServiceGenerateRequest& r, WorkerCallOptions options,
           WorkerCallObserver* observer)
      : worker_(worker),
        behavior_(behavior),
        request_(r),
        options_(std::move(options)),
        observer_(observer) {}

  void Start() override;
  void Cancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
    cv_.SignalAll();
  }
  bool cancelled() {
    MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  void Run();
  // Sends one message; false when the stream is over (cancelled, or the observer said stop).
  bool Send(const cascade::v2::WorkerServiceGenerateResponse& m);
  void Done(const grpc::Status& s) { observer_->OnDone(s); }

  FakeWorker* const worker_;
  const FakeBehavior behavior_;
  const cascade::v2::WorkerServiceGenerateRequest& request_;
  const WorkerCallOptions options_;
  WorkerCallObserver* const observer_;
  Mutex mu_;
  CondVar cv_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// One fake worker: its script (behaviours of successive calls; serves once it runs out) and
// what it was asked.
class FakeWorker {
 public:
  explicit FakeWorker(std::string id) : id_(std::move(id)) {}
  ~FakeWorker() { JoinAll(); }

  const std::string& id() const { return id_; }
  void Script(std::vector<FakeBehavior> behaviors) {
    MutexLock lock(&mu_);
    script_.assign(behaviors.begin(), behaviors.end());
  }
  std::shared_ptr<FakeCall> NewCall(const cascade::v2::WorkerServiceGenerateRequest& r,
                                    const WorkerCallOptions& options,
                                    WorkerCallObserver* observer) {
    MutexLock lock(&mu_);
    FakeBehavior b;
    if (!script_.empty()) {
      b = script_.front();
      script_.pop_front();
    }
    requests_.push_back(r);
    options_.push_back(options);
    auto call = std::make_shared<FakeCall>(this, b, r, options, observer);
    calls_.push_back(call);
    return call;
  }
  void Spawn(std::thread t) {
    MutexLock lock(&mu_);
    threads_.push_back(std::move(t));
  }
  std::vector<cascade::v2::WorkerServiceGenerateRequest> requests() {
    MutexLock lock(&mu_);
    return requests_;
  }
  std::vector<WorkerCallOptions> options() {
    MutexLock lock(&mu_);
    return options_;
  }
  std::vector<std::shared_ptr<FakeCall>> calls() {
    MutexLock lock(&mu_);
    return calls_;
  }
  void JoinAll() {
    std::vector<std::thread> threads;
    {
      MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  const std::string id_;
  Mutex mu_;
  std::deque<FakeBehavior> script_ ABSL_GUARDED_BY(mu_);
  std::vector<cascade::v2::WorkerServiceGenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerCallOptions> options_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FakeCall>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

class FakeWorkerClient final : public WorkerClient {
 public:
  explicit FakeWorkerClient(FakeWorker* worker) : worker_(worker) {}
  std::shared_ptr<WorkerCall> Generate(const cascade::v2::WorkerServiceGenerateRequest& request,
                                       const WorkerCallOptions& options,
                                       WorkerCallObserver* observer) override {
    return worker_->NewCall(request, options, observer);
  }

 private:
  FakeWorker* const worker_;
};

inline void FakeCall::Start() {
  std::shared_ptr<FakeCall> self = shared_from_this();  // alive until Run returns
  worker_->Spawn(std::thread([self] { self->Run(); }));
}

inline bool FakeCall::Send(const cascade::v2::WorkerServiceGenerateResponse& m) {
  {
    MutexLock lock(&mu_);
    if (cancelled_) return false;
  }
  if (observer_->OnMessage(m)) return true;
  Cancel();  // what the gRPC client does when the observer stops reading
  return false;
}

inline void FakeCall::Run() {
  using cascade::v2::WorkerServiceGenerateResponse;
  const grpc::Status cancelled(grpc::StatusCode::CANCELLED, "cancelled");
  if (behavior_.kind == FakeBehavior::kRefuse) {
    Done(behavior_.status);
    return;
  }
  std::vector<int32_t> context;
  for (const auto& c : request_.chunks()) {
    context.insert(context.end(), c.token_ids().begin(), c.token_ids().end());
  }
  const int64_t prompt_tokens = static_cast<int64_t>(context.size());
  const int max_tokens = request_.sampling().max_tokens();
  if (behavior_.kind != FakeBehavior::kHangSilent) {
    WorkerServiceGenerateResponse start;
    start.mutable_start()->set_worker_id(worker_->id());
    start.mutable_start()->set_prompt_tokens(prompt_tokens);
    if (!Send(start)) return Done(cancelled);
    const int n = behavior_.kind == FakeBehavior::kServe ? max_tokens
                                                         : std::min(behavior_.tokens, max_tokens);
    for (int i = 0; i < n; ++i) {
      WorkerServiceGenerateResponse t;
      context.push_back(FakeNextToken(context));
      t.mutable_tokens()->add_token_ids(context.back());
      if (request_.sampling().logprobs() > 0) {  // made-up numbers; the first vocab ids as top
        auto* lp = t.mutable_tokens()->add_logprobs();
        lp->mutable_sampled()->set_token_id(context.back());
        lp->mutable_sampled()->set_logprob(-0.5f);
        for (int k = 0; k < request_.sampling().logprobs(); ++k) {
          auto* top = lp->add_top();
          top->set_token_id(FakeVocab()[static_cast<size_t>(k) % FakeVocab().size()]);
          top->set_logprob(-1.0f - static_cast<float>(k));
        }
      }
      if (!Send(t)) return Done(cancelled);
    }
    if (behavior_.kind == FakeBehavior::kServe) {
      WorkerServiceGenerateResponse f;
      if (behavior_.stop_token_id >= 0) {
        f.mutable_finish()->set_finish_reason(cascade::v2::FINISH_REASON_STOP);
        f.mutable_finish()->set_stop_token_id(behavior_.stop_token_id);
      } else {
        f.mutable_finish()->set_finish_reason(cascade::v2::FINISH_REASON_LENGTH);
      }
      f.mutable_finish()->mutable_usage()->set_prompt_tokens(prompt_tokens);
      f.mutable_finish()->mutable_usage()->set_completion_tokens(n);
      if (!Send(f)) return Done(cancelled);
      return Done(grpc::Status::OK);
    }
    if (behavior_.kind == FakeBehavior::kDie) return Done(behavior_.status);
  }
  // Hanging: only the deadline or a cancel ends it.
  bool was_cancelled = false;
  {
    MutexLock lock(&mu_);
    while (!cancelled_) {
      const auto left = options_.deadline - std::chrono::system_clock::now();
      if (left <= std::chrono::milliseconds(0)) break;
      cv_.WaitFor(&mu_, std::chrono::ceil<std::chrono::milliseconds>(left));
    }
    was_cancelled = cancelled_;
  }
  Done(was_cancelled ? cancelled
                     : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"));
}

// Fake workers by address, and a pool whose clients are theirs.
class FakeCluster {
 public:
  FakeWorker* Add(const std::string& address) {
    auto& w = workers_[address];
    w = std::make_unique<FakeWorker>("worker-" + address);
    return w.get();
  }
  FakeWorker* at(const std::string& address) { return workers_.at(address).get(); }
  std::unique_ptr<WorkerPool> NewPool() {
    return std::make_unique<WorkerPool>(
        [this](const std::string& address) -> std::unique_ptr<WorkerClient> {
          auto it = workers_.find(address);
          if (it == workers_.end()) return nullptr;
          return std::make_unique<FakeWorkerClient>(it->second.get());
        },
        std::vector<std::string>{});
  }
  // Waits for every call's thread (a test's last step before its fakes go away).
  void JoinAll() {
    for (auto& [a, w] : workers_) w->JoinAll();
  }

 private:
  std::map<std::string, std::unique_ptr<FakeWorker>> workers_;
};

}  // namespace cascade::gateway::testing
