// grpc.health.v1.Health on the callback API: see health.h.
#include "common/health.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"

namespace cascade::common {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch stream. Status changes may arrive while a write is in flight; only the latest one is
// kept, since a watcher cares about the current state, not every transition. Finish is issued
// only when no write is outstanding.
//
// gRPC may run a reaction (even OnDone) inline inside StartWrite/Finish, so those are never
// called with a lock held. HealthService calls Prepare() under its mu_ and Run() after releasing
// it; the reactor stays alive in between because OnDone cannot happen before the operation that
// Prepare() reserved (a write, or the one Finish) has been issued.
class HealthWatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  enum class Step { kNone, kWrite, kFinish };

  HealthWatchReactor(HealthService* service, std::string name)
      : service_(service), name_(std::move(name)) {}

  // Records the new status; returns the operation the caller must pass to Run().
  Step Prepare(HealthService::ServingStatus status, bool finish_after) {
    absl::MutexLock lock(&mu_);
    // Watch sends changes only: a status equal to the last one queued is not sent again.
    if (status != latest_) {
      pending_ = status;
      latest_ = status;
    }
    if (finish_after && !finish_status_.has_value()) {
      finish_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down");
    }
    return NextLocked();
  }

  void Run(Step step) {
    if (step == Step::kWrite) StartWrite(&response_);
    if (step == Step::kFinish) Finish(*finish_status_);  // immutable once finished_ is set
  }

  void OnWriteDone(bool ok) override {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      // A failed write means the stream is broken (client gone, server cancelling).
      if (!ok && !finish_status_.has_value()) finish_status_ = grpc::Status::CANCELLED;
      step = NextLocked();
    }
    Run(step);
  }

  void OnCancel() override {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      if (!finish_status_.has_value()) finish_status_ = grpc::Status::CANCELLED;
      pending_.reset();
      step = NextLocked();
    }
    Run(step);
  }

  void OnDone() override {
    service_->Unregister(this);
    delete this;
  }

  const std::string& name() const { return name_; }

 private:
  // Decides the next operation; gRPC calls happen outside mu_ (in Run) so that a reaction run
  // inline cannot deadlock on it.
  Step NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (write_in_flight_ || finished_) return Step::kNone;
    if (pending_.has_value()) {
      response_.set_status(*pending_);
      pending_.reset();
      write_in_flight_ = true;
      return Step::kWrite;
    }
    if (finish_status_.has_value()) {
      finished_ = true;
      return Step::kFinish;
    }
    return Step::kNone;
  }

  // Set at construction.
  HealthService* const service_;
  const std::string name_;

  absl::Mutex mu_;
  HealthCheckResponse response_;  // owned by gRPC while write_in_flight_
  std::optional<HealthService::ServingStatus> pending_ ABSL_GUARDED_BY(mu_);
  // The last status queued; UNKNOWN (never sent by us) before the first.
  HealthService::ServingStatus latest_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  std::optional<grpc::Status> finish_status_;  // written under mu_, read after finished_ is set
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

namespace {

using Pending = std::vector<std::pair<HealthWatchReactor*, HealthWatchReactor::Step>>;

void RunAll(const Pending& pending) {
  // kNone entries may name reactors that have finished since; they must not be touched.
  for (const auto& [reactor, step] : pending) {
    if (step != HealthWatchReactor::Step::kNone) reactor->Run(step);
  }
}

}  // namespace

HealthService::HealthService() { statuses_[""] = HealthCheckResponse::NOT_SERVING; }

HealthService::~HealthService() = default;

HealthService::ServingStatus HealthService::StatusOf(std::string_view service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::SetServingStatus(std::string_view service, bool serving) {
  Pending pending;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    ServingStatus status =
        serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
    auto [it, inserted] = statuses_.try_emplace(std::string(service), status);
    if (!inserted) {
      if (it->second == status) return;
      it->second = status;
    }
    for (HealthWatchReactor* w : watchers_) {
      if (w->name() == service) pending.emplace_back(w, w->Prepare(status, false));
    }
  }
  RunAll(pending);
}

void HealthService::SetAllNotServing() {
  Pending pending;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, status] : statuses_) status = HealthCheckResponse::NOT_SERVING;
    for (HealthWatchReactor* w : watchers_) {
      ServingStatus s = StatusOf(w->name());
      if (s != HealthCheckResponse::SERVICE_UNKNOWN) pending.emplace_back(w, w->Prepare(s, false));
    }
  }
  RunAll(pending);
}

void HealthService::Shutdown() {
  Pending pending;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, status] : statuses_) status = HealthCheckResponse::NOT_SERVING;
    shut_down_ = true;
    for (HealthWatchReactor* w : watchers_) {
      pending.emplace_back(w, w->Prepare(StatusOf(w->name()), /*finish_after=*/true));
    }
  }
  RunAll(pending);
}

bool HealthService::IsServing(std::string_view service) const {
  absl::ReaderMutexLock lock(&mu_);
  return StatusOf(service) == HealthCheckResponse::SERVING;
}

void HealthService::Unregister(HealthWatchReactor* reactor) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(reactor);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ServingStatus status;
  {
    absl::ReaderMutexLock lock(&mu_);
    status = StatusOf(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("unknown service '", Excerpt(request->service()), "'")));
  } else {
    response->set_status(status);
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  auto* reactor = new HealthWatchReactor(this, request->service());
  HealthWatchReactor::Step step;
  {
    absl::MutexLock lock(&mu_);
    watchers_.insert(reactor);
    // The current state first (SERVICE_UNKNOWN for an unknown service, which may appear later).
    step = reactor->Prepare(StatusOf(request->service()), /*finish_after=*/shut_down_);
  }
  reactor->Run(step);
  return reactor;
}

}  // namespace cascade::common
