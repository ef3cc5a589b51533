// The FetchKv client; see peer_fetch.h.
#include "gpu_worker/service/peer_fetch.h"

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace cascade::worker {
namespace {

using cascade::v2::FetchKvResponse;

class GrpcFetchCall final : public PeerFetchCall,
                            public grpc::ClientReadReactor<FetchKvResponse>,
                            public std::enable_shared_from_this<GrpcFetchCall> {
 public:
  GrpcFetchCall(common::ClientCalls::Token token, FetchPlan plan,
                std::function<void(FetchOutcome)> done)
      : token_(std::move(token)),
        verifier_(plan.keys, plan.first_parent, plan.block_bytes),
        done_(std::move(done)) {
    request_.set_model(plan.model);
    request_.set_backend(plan.backend);
    request_.set_block_bytes(plan.block_bytes);
    request_.set_block_size(plan.block_size);
    for (const hash::Hash128& k : plan.keys) request_.add_block_keys(k.ToHex());
  }

  // The context holds the channel for the call's life; the fetcher keeps it beyond (token_).
  void Start(cascade::v2::WorkerService::Stub* stub,
             std::chrono::system_clock::time_point deadline) {
    t0_ = std::chrono::steady_clock::now();
    ctx_.set_deadline(deadline);
    stub->async()->FetchKv(&ctx_, &request_, this);
    self_ = shared_from_this();  // until OnDone
    StartRead(&msg_);
    StartCall();
  }

  void Cancel() override {
    cancelled_here_ = true;
    ctx_.TryCancel();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    bool go_on = false;
    const double at = Ms();
    ++timings_.messages;
    if (msg_.has_header()) {
      timings_.header_ms = at;
      go_on = verifier_.OnHeader(msg_.header().blocks(), msg_.header().block_bytes());
    } else if (msg_.has_block()) {
      if (timings_.first_block_ms == 0) timings_.first_block_ms = at;
      timings_.last_block_ms = at;
      cascade::v2::FetchKvBlock* b = msg_.mutable_block();
      go_on = verifier_.OnBlock(b->index(), b->key(), std::move(*b->mutable_data()), b->crc32c());
    }
    timings_.verify_ms += Ms() - at;
    if (!go_on) {
      ctx_.TryCancel();  // the holder stops sending; OnDone reports the verifier's reason
      return;
    }
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status st = common::FromGrpc(status);
    // CANCELLED that this side did not ask for: the holder ended the call (it shut down).
    if (absl::IsCancelled(st) && !cancelled_here_) {
      st = absl::UnavailableError(absl::StrCat("the holder ended the transfer: ", st.message()));
    }
    timings_.end_ms = Ms();
    FetchOutcome out = std::move(verifier_).Finish(st);
    out.timings = timings_;
    done_(std::move(out));
    self_.reset();  // may delete this
  }

 private:
  double Ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_)
        .count();
  }

  common::ClientCalls::Token token_;  // first: released after ctx_ (client_calls.h)
  std::chrono::steady_clock::time_point t0_;
  FetchTimings timings_;  // the reactor's callbacks run one at a time
  cascade::v2::FetchKvRequest request_;
  FetchVerifier verifier_;
  std::function<void(FetchOutcome)> done_;
  grpc::ClientContext ctx_;
  FetchKvResponse msg_;
  std::shared_ptr<GrpcFetchCall> self_;
  std::atomic<bool> cancelled_here_{false};
};

class FailedCall final : public PeerFetchCall {
 public:
  void Cancel() override {}
};

}  // namespace

PeerFetcher::~PeerFetcher() {
  MutexLock lock(&mu_);
  for (auto& [address, peer] : peers_) peer->calls.WaitOrKeep(peer, "peer fetch of " + address);
}

std::vector<std::string> PeerFetcher::peers() {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [address, peer] : peers_) out.push_back(address);
  return out;
}

std::shared_ptr<PeerFetcher::Peer> PeerFetcher::PeerFor(const std::string& address,
                                                        common::ClientCalls::Token* token,
                                                        absl::Status* status) {
  MutexLock lock(&mu_);
  if (auto it = peers_.find(address); it != peers_.end()) {
    *token = it->second->calls.Add();
    return it->second;
  }
  common::ClientChannelOptions o;
  o.tls = options_.tls;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ch = common::MakeChannel(address, o);
  if (!ch.ok()) {
    *status = ch.status();
    return nullptr;
  }
  // Over the bound, let go of the first-named idle channel (a call's token goes after its
  // context, so an idle one's last reference is the map's, dropped here).
  if (peers_.size() >= kMaxPeerChannels) {
    for (auto it = peers_.begin(); it != peers_.end(); ++it) {
      if (it->second->calls.live() == 0) {
        peers_.erase(it);
        break;
      }
    }
  }
  auto peer = std::make_shared<Peer>();
  peer->stub = cascade::v2::WorkerService::NewStub(*ch);
  *token = peer->calls.Add();
  peers_.emplace(address, peer);
  return peer;
}

std::shared_ptr<PeerFetchCall> PeerFetcher::Fetch(FetchPlan plan,
                                                  std::chrono::system_clock::time_point deadline,
                                                  std::function<void(FetchOutcome)> done) {
  absl::Status st;
  common::ClientCalls::Token token;
  std::shared_ptr<Peer> peer = PeerFor(plan.address, &token, &st);
  if (peer == nullptr) {
    FetchOutcome o;
    o.result = FetchResult::kUnavailable;
    o.detail = absl::StrCat("cannot dial ", plan.address, ": ", st.ToString());
    done(std::move(o));
    return std::make_shared<FailedCall>();
  }
  const auto limit =
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.timeout);
  auto call = std::make_shared<GrpcFetchCall>(std::move(token), std::move(plan), std::move(done));
  call->Start(peer->stub.get(), std::min(deadline, limit));
  return call;
}

}  // namespace cascade::worker
