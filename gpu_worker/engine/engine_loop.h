// Runs an Engine on its own thread: steps while there is work, sleeps when idle, and hands each
// sequence's outputs to the sink its caller registered. The gRPC worker service sits on top.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "gpu_worker/engine/engine.h"

namespace cascade::engine {

// Receives one sequence's outputs, in order, on the loop thread; the last one has `finished`.
// Must not block (queue and return).
using OutputSink = std::function<void(const SequenceOutput&)>;

class EngineLoop {
 public:
  // `after_step` (optional) runs on the loop thread after each step that did work, e.g. to
  // update metrics and forward chunk events.
  explicit EngineLoop(std::unique_ptr<Engine> engine, std::function<void()> after_step = nullptr);
  // Stops the loop; sequences still running get a final kCancelled output.
  ~EngineLoop();

  void Start();
  void Stop();

  // Queues a request; `sink` receives its outputs. Errors as Engine::AddRequest. Thread-safe.
  absl::StatusOr<uint64_t> Submit(Request request, OutputSink sink);
  // Cancels; the sink still receives the final (kCancelled) output. Thread-safe.
  void Cancel(uint64_t seq_id);
  // Wakes the loop (after an admin operation on the engine). Thread-safe.
  void Wake();

  Engine& engine() { return *engine_; }

 private:
  void Run();

  // Set at construction.
  const std::unique_ptr<Engine> engine_;
  const std::function<void()> after_step_;

  Mutex mu_;
  CondVar cv_;
  std::unordered_map<uint64_t, OutputSink> sinks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by Start (under mu_), joined by Stop
};

}  // namespace cascade::engine
