// Capacity-aware admission; see admission.h.
#include "services/gateway/admission.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cascade::gateway {
namespace {

// At most one admission_limit_down line per worker this often (the rest are counted).
constexpr absl::Duration kDecreaseLogEvery = absl::Seconds(5);

}  // namespace

Admission::Admission(AdmissionOptions options, NowFn now)
    : options_(std::move(options)), now_(now ? std::move(now) : NowFn([] { return absl::Now(); })) {
  thread_ = std::thread([this] { Run(); });
}

Admission::~Admission() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    wake_.Signal();
  }
  thread_.join();
}

Admission::Worker& Admission::WorkerLocked(const std::string& address) {
  const absl::Time now = now_();
  ForgetIdleLocked(now);
  auto [it, inserted] = workers_.try_emplace(address);
  if (inserted) {
    it->second.limit = std::clamp(options_.initial_limit, std::max(1, options_.min_limit),
                                  std::max(1, options_.max_limit));
    it->second.window_start = now;
  }
  it->second.used = now;
  return it->second;
}

void Admission::ForgetIdleLocked(absl::Time now) {
  if (now - swept_ < absl::Minutes(1)) return;
  swept_ = now;
  for (auto it = workers_.begin(); it != workers_.end();) {
    const Worker& w = it->second;
    if (w.inflight == 0 && w.down_until <= now && now - w.used >= options_.forget_after) {
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<Grant> Admission::TryGrantLocked(const std::vector<Scored>& ranked) {
  if (ranked.empty()) return Grant{};  // nothing to wait for: the turn reports no worker
  const absl::Time now = now_();
  bool any_up = false;
  for (const Scored& c : ranked) any_up |= WorkerLocked(c.candidate.address).down_until <= now;
  for (size_t i = 0; i < ranked.size(); ++i) {
    Worker& w = WorkerLocked(ranked[i].candidate.address);
    // A worker marked down gets nothing while another candidate is up (if all are down, the
    // turn tries them anyway and reports what it finds).
    if (any_up && w.down_until > now) continue;
    if (w.inflight >= std::max(1, static_cast<int>(w.limit))) continue;
    ++w.inflight;
    w.peak = std::max(w.peak, w.inflight);
    Grant g;
    g.address = ranked[i].candidate.address;
    g.ranked.reserve(ranked.size());
    g.ranked.push_back(ranked[i]);
    for (size_t j = 0; j < ranked.size(); ++j) {
      if (j != i) g.ranked.push_back(ranked[j]);
    }
    return g;
  }
  return std::nullopt;
}

uint64_t Admission::Acquire(std::vector<Scored> ranked, absl::Time deadline, Callback done) {
  MutexLock lock(&mu_);
  const uint64_t ticket = next_ticket_++;
  if (stop_) {
    ready_.push_back({std::move(done), absl::UnavailableError("the gateway is shutting down")});
  } else if (pending_ >= options_.max_pending) {
    ready_.push_back({std::move(done), absl::ResourceExhaustedError(
                                           absl::StrCat("the gateway has ", pending_,
                                                        " requests admitted or queued, its limit "
                                                        "(--max_concurrent); retry later"))});
  } else {
    ++pending_;
    const absl::Time now = now_();
    if (queue_.empty()) last_empty_ = now;
    queue_.push_back({ticket, std::move(ranked), now,
                      std::min(deadline, now + options_.queue_timeout), std::move(done)});
  }
  KickLocked();
  return ticket;
}

bool Admission::Cancel(uint64_t ticket) {
  MutexLock lock(&mu_);
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const Waiter& w) { return w.ticket == ticket; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  --pending_;
  if (queue_.empty()) last_empty_ = now_();
  return true;
}

void Admission::Release(const std::string& address) {
  MutexLock lock(&mu_);
  --pending_;
  if (address.empty()) return;
  auto it = workers_.find(address);
  if (it == workers_.end() || it->second.inflight == 0) return;
  --it->second.inflight;
  it->second.used = now_();
  KickLocked();
}

void Admission::Transfer(const std::string& from, const std::string& to) {
  if (from == to) return;
  MutexLock lock(&mu_);
  if (auto it = workers_.find(from);
      !from.empty() && it != workers_.end() && it->second.inflight > 0) {
    --it->second.inflight;
  }
  if (!to.empty()) ++WorkerLocked(to).inflight;
  KickLocked();
}

void Admission::MarkDown(const std::string& address) {
  MutexLock lock(&mu_);
  WorkerLocked(address).down_until = now_() + options_.down_for;
  KickLocked();  // waiters may go to another worker now
}

void Admission::ObserveTokens(const std::string& address, int tokens, double seconds) {
  if (tokens <= 0 || seconds < 0) return;
  MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it == workers_.end()) return;
  Worker& w = it->second;
  w.down_until = absl::InfinitePast();  // it streams: it is up
  w.window.push_back(seconds / tokens);
  const absl::Time now = now_();
  w.used = now;
  if (static_cast<int>(w.window.size()) >= options_.window_samples &&
      now - w.window_start >= options_.window) {
    CloseWindowLocked(address, w, now);
  }
}

void Admission::CloseWindowLocked(const std::string& address, Worker& w, absl::Time now) {
  auto mid = w.window.begin() + static_cast<std::ptrdiff_t>(w.window.size() / 2);
  std::nth_element(w.window.begin(), mid, w.window.end());
  const double tpot = *mid;  // the window's median time per token
  w.recent = tpot;
  // The unloaded time per token is the best a window has shown: a worker does not get faster
  // with load, and every window averages several samples, so one lucky token cannot set it.
  if (w.baseline == 0 || tpot < w.baseline) w.baseline = tpot;
  if (options_.adaptive) {
    const int floor_limit = std::max(1, static_cast<int>(w.limit));
    const double slow = std::max(options_.latency_tolerance * w.baseline,
                                 absl::ToDoubleSeconds(options_.tpot_target));
    if (tpot > slow) {
      w.limit = std::max<double>(options_.min_limit, w.limit * options_.decrease_factor);
      ++w.unlogged_decreases;
      if (now - w.decrease_logged >= kDecreaseLogEvery) {
        common::LogInfo("admission_limit_down",
                        {{"worker", address},
                         {"limit", w.limit},
                         {"inflight", static_cast<long>(w.inflight)},
                         {"median_tpot_ms", tpot * 1e3},
                         {"unloaded_tpot_ms", w.baseline * 1e3},
                         {"tolerance", options_.latency_tolerance},
                         {"tpot_target_ms", absl::ToDoubleMilliseconds(options_.tpot_target)},
                         {"decreases", static_cast<long>(w.unlogged_decreases)}});
        w.unlogged_decreases = 0;
        w.decrease_logged = now;
      }
    } else if (w.peak >= floor_limit) {
      // Full and still fast enough: probe for more, in proportion, so that a worker that
      // batches well (a GPU) reaches its capacity in a few windows.
      w.limit = std::min<double>(options_.max_limit,
                                 w.limit + std::max(1.0, options_.increase_fraction * w.limit));
      KickLocked();
    }
  }
  w.window.clear();
  w.window_start = now;
  w.peak = w.inflight;
}

std::vector<Admission::WorkerView> Admission::Workers() const {
  MutexLock lock(&mu_);
  std::vector<WorkerView> out;
  for (const auto& [address, w] : workers_) {
    out.push_back({address, w.inflight, w.limit, w.baseline, w.recent});
  }
  return out;
}

int Admission::queued() const {
  MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

Admission::Hold Admission::TryHold() {
  MutexLock lock(&mu_);
  if (stop_ || pending_ + held_ >= options_.max_pending) return Hold();
  ++held_;
  return Hold(this);
}

void Admission::Hold::Release() {
  if (a_ == nullptr) return;
  MutexLock lock(&a_->mu_);
  --a_->held_;
  a_ = nullptr;
}

Admission::Hold& Admission::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    Release();
    a_ = std::exchange(o.a_, nullptr);
  }
  return *this;
}

bool Admission::overloaded() const {
  MutexLock lock(&mu_);
  return OverloadedLocked(now_());
}

bool Admission::OverloadedLocked(absl::Time now) const {
  return !queue_.empty() && now - last_empty_ >= options_.standing_queue;
}

void Admission::ServeQueueLocked(absl::Time now, std::vector<Outcome>* out) {
  const bool overloaded = OverloadedLocked(now);
  // Refusals first, so that a slot never goes to a request already past its wait.
  for (auto it = queue_.begin(); it != queue_.end();) {
    const absl::Time deadline =
        overloaded ? std::min(it->deadline, it->enqueued + options_.overload_queue_timeout)
                   : it->deadline;
    if (!stop_ && now < deadline) {
      ++it;
      continue;
    }
    --pending_;
    out->push_back({std::move(it->done),
                    stop_
                        ? absl::UnavailableError("the gateway is shutting down")
                        : absl::ResourceExhaustedError(absl::StrCat(
                              "no worker had room within ",
                              absl::FormatDuration(overloaded ? options_.overload_queue_timeout
                                                              : options_.queue_timeout),
                              overloaded ? " (the gateway is overloaded: --overload_queue_timeout)"
                                         : " (--queue_timeout)",
                              ": the workers are at capacity; retry later"))});
    it = queue_.erase(it);
  }
  auto grant = [&](auto first, auto last) {
    for (auto it = first; it != last;) {
      std::optional<Grant> g = TryGrantLocked(it->ranked);
      if (!g) {
        ++it;
        continue;
      }
      out->push_back({std::move(it->done), std::move(*g)});
      it->done = nullptr;  // served: removed below
      ++it;
    }
  };
  if (overloaded) {
    grant(queue_.rbegin(), queue_.rend());
  } else {
    grant(queue_.begin(), queue_.end());
  }
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [](const Waiter& w) { return w.done == nullptr; }),
               queue_.end());
  if (queue_.empty()) last_empty_ = now;
}

void Admission::Run() {
  // Waits for a change (an arrival, a release, a grown limit) or, while requests queue, polls
  // every few milliseconds for deadlines (the clock is injected, so no timed wait on it).
  constexpr std::chrono::milliseconds kPoll(5);
  for (;;) {
    std::vector<Outcome> out;
    {
      MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return kick_ || stop_ || !ready_.empty();
      };
      if (queue_.empty()) {
        while (!woken()) wake_.Wait(&mu_);
      } else {
        wake_.WaitFor(&mu_, kPoll, woken);
      }
      kick_ = false;
      ServeQueueLocked(now_(), &out);
      for (Outcome& o : ready_) out.push_back(std::move(o));
      ready_.clear();
      if (stop_ && out.empty()) return;
    }
    for (Outcome& o : out) o.done(std::move(o.result));
  }
}

}  // namespace cascade::gateway
