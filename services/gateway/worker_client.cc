// The gRPC WorkerClient: a client read reactor per Generate stream; see worker_client.h.
#include "services/gateway/worker_client.h"

#include "common/bounded_text.h"
#include "common/client_calls.h"

namespace cascade::gateway {
namespace {

using cascade::v2::WorkerServiceGenerateRequest;
using cascade::v2::WorkerServiceGenerateResponse;

class GrpcWorkerCall final : public WorkerCall,
                             public grpc::ClientReadReactor<WorkerServiceGenerateResponse>,
                             public std::enable_shared_from_this<GrpcWorkerCall> {
 public:
  GrpcWorkerCall(cascade::v2::WorkerService::Stub* stub, common::ClientCalls::Token token,
                 const WorkerServiceGenerateRequest& request, const WorkerCallOptions& options,
                 WorkerCallObserver* observer)
      : token_(std::move(token)), observer_(observer) {
    ctx_.set_deadline(options.deadline);
    // Ids are checked where they enter (CheckIdField); an invalid metadata value would abort
    // the process inside gRPC, so one that slipped through is not sent.
    if (common::CheckIdField("request_id", options.request_id, 2 * common::kMaxIdBytes).ok()) {
      ctx_.AddMetadata("x-request-id", options.request_id);
    }
    stub->async()->Generate(&ctx_, &request, this);
  }

  void Start() override {
    self_ = shared_from_this();  // until OnDone
    StartRead(&msg_);
    StartCall();
  }
  void Cancel() override { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    if (!observer_->OnMessage(msg_)) {
      ctx_.TryCancel();  // the worker frees the sequence
      return;
    }
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& status) override {
    observer_->OnDone(status);
    self_.reset();  // may delete this
  }

 private:
  common::ClientCalls::Token token_;  // first: released after ctx_ (client_calls.h)
  WorkerCallObserver* const observer_;
  grpc::ClientContext ctx_;
  WorkerServiceGenerateResponse msg_;
  std::shared_ptr<GrpcWorkerCall> self_;
};

class GrpcWorkerClient final : public WorkerClient {
 public:
  explicit GrpcWorkerClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), stub_(cascade::v2::WorkerService::NewStub(channel_)) {}

  // Waits for the calls to be gone, so the channel's last reference goes here and not in a
  // call's OnDone (client_calls.h). Their streams have deadlines and the gateway's drain has
  // cancelled them by now, so this is short; if one still lingers the channel is left alive.
  ~GrpcWorkerClient() override { calls_.WaitOrKeep(std::move(channel_), "gateway worker client"); }

  std::shared_ptr<WorkerCall> Generate(const WorkerServiceGenerateRequest& request,
                                       const WorkerCallOptions& options,
                                       WorkerCallObserver* observer) override {
    return std::make_shared<GrpcWorkerCall>(stub_.get(), calls_.Add(), request, options, observer);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<cascade::v2::WorkerService::Stub> stub_;
  common::ClientCalls calls_;
};

}  // namespace

std::unique_ptr<WorkerClient> NewGrpcWorkerClient(std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcWorkerClient>(std::move(channel));
}

}  // namespace cascade::gateway
