// The engine thread; see engine_loop.h.
#include "gpu_worker/engine/engine_loop.h"

#include <chrono>
#include <vector>

namespace cascade::engine {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, std::function<void()> after_step)
    : engine_(std::move(engine)), after_step_(std::move(after_step)) {}

EngineLoop::~EngineLoop() { Stop(); }

void EngineLoop::Start() {
  MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void EngineLoop::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  // Whoever still waits gets a final output, so no stream hangs.
  std::unordered_map<uint64_t, OutputSink> left;
  {
    MutexLock lock(&mu_);
    left.swap(sinks_);
  }
  for (auto& [id, sink] : left) {
    SequenceOutput out;
    out.seq_id = id;
    out.finished = true;
    out.finish_reason = FinishReason::kCancelled;
    out.status = absl::UnavailableError("the worker is shutting down");
    sink(out);
  }
}

absl::StatusOr<uint64_t> EngineLoop::Submit(Request request, OutputSink sink) {
  // Holding mu_ across AddRequest keeps the loop from stepping (and emitting outputs for this
  // id) before the sink is registered.
  MutexLock lock(&mu_);
  absl::StatusOr<uint64_t> id = engine_->AddRequest(std::move(request));
  if (!id.ok()) return id;
  sinks_.emplace(*id, std::move(sink));
  wake_ = true;
  cv_.SignalAll();
  return id;
}

void EngineLoop::Cancel(uint64_t seq_id) {
  engine_->Cancel(seq_id);
  Wake();
}

void EngineLoop::Wake() {
  {
    MutexLock lock(&mu_);
    wake_ = true;
  }
  cv_.SignalAll();
}

void EngineLoop::Run() {
  while (true) {
    {
      MutexLock lock(&mu_);
      // Idle: sleep until woken; the timeout also lets pins expire while nothing else happens.
      cv_.WaitFor(&mu_, std::chrono::milliseconds(200), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || wake_ || engine_->HasWork();
      });
      if (stop_) return;
      wake_ = false;
    }
    absl::StatusOr<std::vector<SequenceOutput>> outs = engine_->Step();
    if (!outs.ok()) continue;
    for (const SequenceOutput& o : *outs) {
      OutputSink sink;
      {
        MutexLock lock(&mu_);
        auto it = sinks_.find(o.seq_id);
        if (it == sinks_.end()) continue;
        sink = o.finished ? std::move(it->second) : it->second;
        if (o.finished) sinks_.erase(it);
      }
      sink(o);
    }
    if (after_step_) after_step_();
  }
}

}  // namespace cascade::engine
