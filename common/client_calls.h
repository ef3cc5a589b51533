// The live client calls (gRPC callback API) of one owner, so the owner can outlive them.
//
// Why: gRPC 1.51 (Debian's) corrupts memory when a channel's last reference is dropped inside one
// of that channel's own callbacks: a refcount underflow ("ref_counted.h: assertion failed:
// prior > 0") or a double free, upstream grpc/grpc#37858 ("do not destroy the channel inside of
// an application callback"). A client reactor that deletes itself in OnDone drops its
// ClientContext's channel reference right there, so it is the last one whenever the owner of the
// channel let go first. An owner that keeps the channel, counts its calls here and waits for them
// before letting go drops the last reference on its own thread.
//
// A call takes a Token when it is made and keeps it as its FIRST member, so the token goes after
// the ClientContext (members are destroyed in reverse order). Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string_view>

#include "common/log.h"
#include "common/mutex.h"

// Under AddressSanitizer, WaitOrKeep's deliberate keep is marked for LeakSanitizer.
#if defined(__SANITIZE_ADDRESS__)
#define CASCADE_CLIENT_CALLS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CASCADE_CLIENT_CALLS_LSAN 1
#endif
#endif
#ifdef CASCADE_CLIENT_CALLS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace cascade::common {

class ClientCalls {
  struct State {
    Mutex mu;
    CondVar cv;
    int live ABSL_GUARDED_BY(mu) = 0;
  };

 public:
  class Token {
   public:
    Token() = default;
    Token(Token&& o) noexcept : state_(std::move(o.state_)) {}
    Token& operator=(Token&& o) noexcept {
      Release();
      state_ = std::move(o.state_);
      return *this;
    }
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;
    ~Token() { Release(); }

   private:
    friend class ClientCalls;
    explicit Token(std::shared_ptr<State> s) : state_(std::move(s)) {}
    void Release() {
      if (state_ == nullptr) return;
      {
        MutexLock lock(&state_->mu);
        if (--state_->live == 0) state_->cv.SignalAll();
      }
      state_.reset();
    }
    std::shared_ptr<State> state_;  // outlives the ClientCalls if the owner is gone
  };

  // One more live call, until the token is destroyed.
  Token Add() {
    MutexLock lock(&state_->mu);
    ++state_->live;
    return Token(state_);
  }

  int live() const {
    MutexLock lock(&state_->mu);
    return state_->live;
  }

  // Blocks until no call is live or `timeout` passed; returns whether none is. Must not run on
  // one of the calls' own callback threads (it would wait for itself).
  bool WaitForNone(std::chrono::milliseconds timeout) {
    State* s = state_.get();
    MutexLock lock(&s->mu);
    return s->cv.WaitFor(&s->mu, timeout,
                         [s]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->live == 0; });
  }

  // What an owner runs before letting go of `channel` (whatever holds the channel its calls
  // use): waits for the calls; if some still live after `timeout`, logs that (`owner` names it)
  // and keeps `channel` alive for good. At shutdown a kept channel is better than gRPC's
  // corruption. Same rule as WaitForNone about threads.
  void WaitOrKeep(std::shared_ptr<void> channel, std::string_view owner,
                  std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    if (WaitForNone(timeout)) return;
    LogError("client_calls_linger", {{"owner", owner}, {"live", static_cast<long>(live())}});
    auto* kept = new std::shared_ptr<void>(std::move(channel));  // deliberately never freed
#ifdef CASCADE_CLIENT_CALLS_LSAN
    __lsan_ignore_object(kept);  // a keep, not a leak: LeakSanitizer must not report it
#else
    (void)kept;
#endif
  }

 private:
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace cascade::common
