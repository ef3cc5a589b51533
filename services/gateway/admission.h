// Capacity-aware admission: a request is admitted only when a worker it may run on has room,
// otherwise it waits in a FIFO queue until one does or its queue deadline passes
// (RESOURCE_EXHAUSTED). A worker's room is an adaptive concurrency limit, set from what it
// serves: the limit grows while the worker's median time per output token stays within
// `latency_tolerance` times its unloaded time or under `tpot_target`, and shrinks when it goes
// beyond both (AIMD on latency, the idea of Envoy's adaptive concurrency filter). The median, not
// the mean: a prefill in the batch delays one step for everyone, a spike that says nothing about
// the decode rate (on a GPU the mean of a window with prefills is often 2x its median while decode
// barely slows). A fixed count of open streams admits far more than a worker can serve at a useful
// speed; this admits what the workers can actually serve, so admitted requests keep their latency
// under overload and the rest are refused quickly.
//
// Plain C++ (no gRPC): the clock is injected and grants are delivered on the controller's own
// thread, so callers never get a callback inline while holding their locks.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "services/gateway/router.h"

namespace cascade::gateway {

struct AdmissionOptions {
  int max_pending = 256;  // admitted + queued requests at most; beyond: refused at once
  // Longest wait for a worker's room while the queue drains now and then (a burst).
  absl::Duration queue_timeout = absl::Seconds(2);
  // Under overload a FIFO queue makes every admitted request wait the whole queue_timeout. So
  // once the queue has not been empty for `standing_queue` (CoDel's test for a standing queue),
  // a request waits at most `overload_queue_timeout` and the newest waiter is served first
  // (adaptive LIFO): admitted requests keep their latency, the rest are refused quickly.
  absl::Duration standing_queue = absl::Milliseconds(500);
  absl::Duration overload_queue_timeout = absl::Milliseconds(50);
  int initial_limit = 16;  // a worker's concurrency limit before anything is measured
  int min_limit = 1;
  int max_limit = 256;  // per worker (its engine's max_num_seqs bounds it anyway)
  // Time per output token allowed over the worker's unloaded time before its limit shrinks...
  double latency_tolerance = 2.0;
  // ... and never below this: a worker streaming each request's tokens faster than this is
  // serving well, whatever its unloaded time. A GPU's time per token rises with its batch and
  // with the prefill chunks mixed into its steps long before it is full (measured on two H100s,
  // qwen3-0.6b, prompts of ~7k tokens: 2.8 ms unloaded, 6-7 ms at 8 requests a worker, so a
  // tolerance alone held each worker to ~6 requests and refused half the load at 3% of its
  // throughput). Zero: the tolerance alone.
  absl::Duration tpot_target = absl::Milliseconds(50);
  // A latency window closes after this long and at least `window_samples` samples.
  absl::Duration window = absl::Milliseconds(100);
  int window_samples = 8;
  double decrease_factor = 0.75;    // multiplicative decrease when a window is too slow
  double increase_fraction = 0.25;  // growth per full, fast window: max(1, this x the limit)
  bool adaptive = true;             // false: each worker's limit stays at initial_limit
  absl::Duration down_for = absl::Seconds(2);  // MarkDown's length (a restart takes ~2 s)
  // A worker no request has touched for this long, with none in flight, is forgotten (its limit
  // and times are learned again if it returns): worker pods come back under new addresses, and
  // the table would otherwise keep every address ever seen.
  absl::Duration forget_after = absl::Minutes(10);
};

// A granted slot: the request runs on `ranked[0]` (the best-ranked candidate with room; the
// others follow in rank order for failover). Release it when the request ends.
struct Grant {
  std::vector<Scored> ranked;
  std::string address;  // the worker the slot is charged to ("" when there was no candidate)
};

class Admission {
 public:
  using Callback = std::function<void(absl::StatusOr<Grant>)>;
  using NowFn = std::function<absl::Time()>;

  // `now` defaults to absl::Now. Starts the dispatcher thread.
  explicit Admission(AdmissionOptions options, NowFn now = nullptr);
  ~Admission();  // queued requests get UNAVAILABLE
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Asks for a slot on one of `ranked` (best first). `done` runs exactly once, on the
  // controller's thread (never inline): with a Grant, with RESOURCE_EXHAUSTED (over max_pending,
  // or no room before `deadline`, which is capped at now + queue_timeout), or UNAVAILABLE at
  // shutdown. Returns a ticket for Cancel. Thread-safe.
  uint64_t Acquire(std::vector<Scored> ranked, absl::Time deadline, Callback done);
  // Withdraws a queued request: true if it was still queued (its callback will not run);
  // false if it was granted or refused already (its callback has run or is about to).
  bool Cancel(uint64_t ticket);
  // The request holding a slot on `address` ended (pass Grant::address, or where Transfer
  // moved it).
  void Release(const std::string& address);
  // A request's slot moves with it from `from` to `to` (failover, resume): `to` may go over its
  // limit for a while, and gets no new grants until it is back under.
  void Transfer(const std::string& from, const std::string& to);
  // A worker produced `tokens` output tokens `seconds` after its previous message for the same
  // request (the inter-token latency the client saw).
  void ObserveTokens(const std::string& address, int tokens, double seconds);
  // A worker failed a request before answering (dead, restarting): no grants go to it for
  // `options.down_for`, or until it streams tokens again. Its requests fail over to other
  // workers outside their limits, so without this a dead worker's room would be handed out
  // and land, unaccounted, on the survivors.
  void MarkDown(const std::string& address);

  struct WorkerView {
    std::string address;
    int inflight = 0;
    double limit = 0;
    double baseline_tpot = 0;  // seconds per token, unloaded (0: not measured yet)
    double recent_tpot = 0;    // last closed window
  };
  std::vector<WorkerView> Workers() const;
  int queued() const;
  // A request being prepared (tokenized, resolved with the registry) before its Acquire, counted
  // against max_pending with the admitted and queued ones: without it a burst put any number of
  // requests in front of the registry, each refused only once it had been resolved. Release it
  // (or let it go) just before the Acquire. Empty (false) from TryHold when there was no room.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& o) noexcept : a_(std::exchange(o.a_, nullptr)) {}
    Hold& operator=(Hold&& o) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { Release(); }
    void Release();
    explicit operator bool() const { return a_ != nullptr; }

   private:
    friend class Admission;
    explicit Hold(Admission* a) : a_(a) {}
    Admission* a_ = nullptr;
  };
  // A hold while admitted + queued + held requests are below max_pending (and not shutting
  // down), else an empty one: the caller refuses the request at once. Thread-safe.
  Hold TryHold();
  // True while a standing queue has put admission in its overload mode.
  bool overloaded() const;

 private:
  struct Worker {
    int inflight = 0;
    double limit = 0;
    int peak = 0;  // most in flight during the open window
    double baseline = 0, recent = 0;
    std::vector<double> window;  // seconds per token of each sample in the open window
    absl::Time window_start;
    absl::Time down_until = absl::InfinitePast();
    // Limit decreases not yet logged, and when the last log line for them went out (one line
    // per worker per kDecreaseLogEvery at most).
    int unlogged_decreases = 0;
    absl::Time decrease_logged = absl::InfinitePast();
    absl::Time used;  // last asked for (granted, released, observed, marked down)
  };
  struct Waiter {
    uint64_t ticket;
    std::vector<Scored> ranked;
    absl::Time enqueued;
    absl::Time deadline;  // the request's own, capped at enqueued + queue_timeout
    Callback done;
  };
  struct Outcome {
    Callback done;
    absl::StatusOr<Grant> result;
  };

  Worker& WorkerLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the workers idle past forget_after (at most one sweep a minute).
  void ForgetIdleLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A grant if some candidate has room (the slot is taken), else nullopt.
  std::optional<Grant> TryGrantLocked(const std::vector<Scored>& ranked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes `w`'s latency window: updates its limit; a decrease is logged (admission_limit_down,
  // at most one line per worker per 5 s, with the count since the last line) so that an operator
  // can see why requests are refused.
  void CloseWindowLocked(const std::string& address, Worker& w, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OverloadedLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants and refusals due now, in queue order (FIFO, or newest first when overloaded).
  void ServeQueueLocked(absl::Time now, std::vector<Outcome>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Something changed that the admission thread should look at.
  void KickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    kick_ = true;
    wake_.Signal();
  }
  void Run();

  const AdmissionOptions options_;
  const NowFn now_;

  mutable Mutex mu_;
  CondVar wake_;  // signalled with kick_ or stop_ set (the admission thread waits on it)
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiter> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Outcome> ready_ ABSL_GUARDED_BY(mu_);  // to deliver on the thread
  int pending_ ABSL_GUARDED_BY(mu_) = 0;             // granted (not released) + queued
  int held_ ABSL_GUARDED_BY(mu_) = 0;                // Holds not released (being prepared)
  absl::Time last_empty_ ABSL_GUARDED_BY(mu_);       // when the queue was last seen empty
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  bool kick_ ABSL_GUARDED_BY(mu_) = false;  // something changed: the thread looks again
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time swept_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // last ForgetIdleLocked
  std::thread thread_;
};

}  // namespace cascade::gateway
