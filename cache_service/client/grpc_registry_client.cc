// RegistryClient over the cascade.v2.ChunkRegistryService stub: synchronous calls with deadlines,
// and Resolve and PinChunk also on gRPC's callback API (ResolveAsync, PinChunkAsync).
#include "cache_service/client/grpc_registry_client.h"

#include <grpcpp/create_channel.h>

#include <chrono>

#include "cache_service/wire/registry_wire.h"
#include "cascade/v2/registry.grpc.pb.h"
#include "common/client_calls.h"

namespace cascade::registry {
namespace {

namespace v2 = ::cascade::v2;

class GrpcRegistryClient final : public RegistryClient {
 public:
  GrpcRegistryClient(std::shared_ptr<grpc::Channel> channel, GrpcRegistryClientOptions options)
      : options_(std::move(options)),
        channel_(channel),
        stub_(v2::ChunkRegistryService::NewStub(std::move(channel))) {}
  // Async calls may still be returning from their callbacks: they keep the channel until then.
  ~GrpcRegistryClient() override { calls_.WaitOrKeep(channel_, "registry_client"); }

  absl::StatusOr<ResolveResult> Resolve(const ResolveInput& in) override {
    v2::ResolveRequest req;
    wire::ToProto(in, &req);
    v2::ResolveResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.resolve_timeout_ms);
    absl::Status s = wire::FromGrpc(stub_->Resolve(&ctx, req, &resp));
    if (!s.ok()) return s;
    return wire::FromProto(resp);
  }

  void ResolveAsync(const ResolveInput& in, ResolveDone done) override {
    v2::ResolveRequest req;
    wire::ToProto(in, &req);
    CallAsync<v2::ResolveRequest, v2::ResolveResponse, ResolveResult>(
        std::move(req), options_.resolve_timeout_ms,
        [](Stub::async_interface* a, grpc::ClientContext* c, const v2::ResolveRequest* q,
           v2::ResolveResponse* r,
           std::function<void(grpc::Status)> f) { a->Resolve(c, q, r, std::move(f)); },
        [](const v2::ResolveResponse& r) { return wire::FromProto(r); }, std::move(done));
  }

  absl::StatusOr<int64_t> PinChunk(const Hash128& hash, int64_t ttl_s,
                                   const std::optional<HeldChunk>& chunk_if_unknown) override {
    v2::PinChunkRequest req;
    PinRequest(hash, ttl_s, chunk_if_unknown, &req);
    v2::PinChunkResponse resp;
    absl::Status s = Call(&v2::ChunkRegistryService::Stub::PinChunk, req, &resp);
    if (!s.ok()) return s;
    return resp.pinned_until_ms();
  }

  void PinChunkAsync(const Hash128& hash, int64_t ttl_s,
                     const std::optional<HeldChunk>& chunk_if_unknown, PinDone done) override {
    v2::PinChunkRequest req;
    PinRequest(hash, ttl_s, chunk_if_unknown, &req);
    CallAsync<v2::PinChunkRequest, v2::PinChunkResponse, int64_t>(
        std::move(req), options_.timeout_ms,
        [](Stub::async_interface* a, grpc::ClientContext* c, const v2::PinChunkRequest* q,
           v2::PinChunkResponse* r,
           std::function<void(grpc::Status)> f) { a->PinChunk(c, q, r, std::move(f)); },
        [](const v2::PinChunkResponse& r) -> absl::StatusOr<int64_t> {
          return r.pinned_until_ms();
        },
        std::move(done));
  }

  absl::StatusOr<RegisterResult> RegisterWorker(const WorkerInfo& info) override {
    v2::RegisterWorkerRequest req;
    wire::ToProto(info, &req);
    v2::RegisterWorkerResponse resp;
    absl::Status s = Call(&v2::ChunkRegistryService::Stub::RegisterWorker, req, &resp);
    if (!s.ok()) return s;
    return RegisterResult{resp.lease_ms(), resp.registry_epoch()};
  }

  absl::StatusOr<HeartbeatResult> Heartbeat(std::string_view worker_id,
                                            const WorkerLoad& load) override {
    v2::HeartbeatRequest req;
    req.set_worker_id(std::string(worker_id));
    wire::ToProto(load, req.mutable_load());
    v2::HeartbeatResponse resp;
    absl::Status s = Call(&v2::ChunkRegistryService::Stub::Heartbeat, req, &resp);
    if (!s.ok()) return s;
    return wire::FromProto(resp);
  }

  absl::StatusOr<ReportResult> ReportEvents(std::string_view worker_id, uint64_t seq,
                                            std::span<const ChunkEvent> events) override {
    v2::ReportEventsRequest req;
    req.set_worker_id(std::string(worker_id));
    req.set_seq(seq);
    for (const ChunkEvent& e : events) wire::ToProto(e, req.add_events());
    v2::ReportEventsResponse resp;
    absl::Status s = Call(&v2::ChunkRegistryService::Stub::ReportEvents, req, &resp);
    if (!s.ok()) return s;
    return ReportResult{resp.resync_required(), resp.applied_seq()};
  }

  absl::StatusOr<int> Resync(std::string_view worker_id, std::span<const HeldChunk> chunks,
                             uint64_t seq) override {
    v2::ResyncRequest req;
    req.set_worker_id(std::string(worker_id));
    req.set_seq(seq);
    for (const HeldChunk& c : chunks) wire::ToProto(c, req.add_chunks());
    v2::ResyncResponse resp;
    absl::Status s =
        Call(&v2::ChunkRegistryService::Stub::Resync, req, &resp, options_.resync_timeout_ms);
    if (!s.ok()) return s;
    return resp.chunks();
  }

  absl::Status Deregister(std::string_view worker_id) override {
    v2::DeregisterWorkerRequest req;
    req.set_worker_id(std::string(worker_id));
    v2::DeregisterWorkerResponse resp;
    return Call(&v2::ChunkRegistryService::Stub::DeregisterWorker, req, &resp);
  }

 private:
  using Stub = v2::ChunkRegistryService::Stub;

  // One unary call on gRPC's callback API: `start` issues it, `convert` turns the response into
  // the value `done` gets (or the call's error). The call holds a token of calls_ until it is
  // gone, so the destructor can wait for it (client_calls.h).
  template <typename Req, typename Resp, typename Value>
  void CallAsync(Req req, int64_t timeout_ms,
                 void (*start)(Stub::async_interface*, grpc::ClientContext*, const Req*, Resp*,
                               std::function<void(grpc::Status)>),
                 absl::StatusOr<Value> (*convert)(const Resp&),
                 absl::AnyInvocable<void(absl::StatusOr<Value>) &&> done) {
    struct Call {
      explicit Call(common::ClientCalls::Token t) : token(std::move(t)) {}
      common::ClientCalls::Token token;  // first, so destroyed last: see client_calls.h
      grpc::ClientContext ctx;
      Req req;
      Resp resp;
      absl::AnyInvocable<void(absl::StatusOr<Value>) &&> done;
    };
    auto* call = new Call(calls_.Add());
    call->req = std::move(req);
    call->done = std::move(done);
    SetDeadline(&call->ctx, timeout_ms);
    start(stub_->async(), &call->ctx, &call->req, &call->resp, [call, convert](grpc::Status st) {
      absl::Status s = wire::FromGrpc(st);
      if (s.ok()) {
        std::move(call->done)(convert(call->resp));
      } else {
        std::move(call->done)(std::move(s));
      }
      delete call;
    });
  }

  static void PinRequest(const Hash128& hash, int64_t ttl_s,
                         const std::optional<HeldChunk>& chunk_if_unknown,
                         v2::PinChunkRequest* req) {
    req->set_hash(hash.ToHex());
    req->set_ttl_seconds(ttl_s);
    if (chunk_if_unknown.has_value()) wire::ToProto(*chunk_if_unknown, req->mutable_chunk());
  }

  static void SetDeadline(grpc::ClientContext* ctx, int64_t timeout_ms) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  }

  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (v2::ChunkRegistryService::Stub::*method)(grpc::ClientContext*,
                                                                           const Req&, Resp*),
                    const Req& req, Resp* resp, int64_t timeout_ms = 0) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout_ms > 0 ? timeout_ms : options_.timeout_ms);
    return wire::FromGrpc((stub_.get()->*method)(&ctx, req, resp));
  }

  const GrpcRegistryClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v2::ChunkRegistryService::Stub> stub_;
  common::ClientCalls calls_;  // ResolveAsync's and PinChunkAsync's
};

}  // namespace

std::unique_ptr<RegistryClient> NewGrpcRegistryClient(const std::string& address,
                                                      const GrpcRegistryClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // Reconnect quickly after a registry restart: gRPC's default backoff grows to 2 minutes, and
  // until it reconnects every call fails at once with UNAVAILABLE.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::ChannelCredentials> creds =
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
  return NewGrpcRegistryClient(grpc::CreateCustomChannel(address, creds, args), options);
}

std::unique_ptr<RegistryClient> NewGrpcRegistryClient(std::shared_ptr<grpc::Channel> channel,
                                                      const GrpcRegistryClientOptions& options) {
  return std::make_unique<GrpcRegistryClient>(std::move(channel), options);
}

}  // namespace cascade::registry
