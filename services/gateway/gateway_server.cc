// Gateway process assembly; see gateway_server.h.
#include "services/gateway/gateway_server.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cache_service/client/grpc_registry_client.h"
#include "common/log.h"
#include "common/transport.h"
#include "gpu_worker/model/config.h"

namespace cascade::gateway {

void RegisterGatewayFlags(common::FlagSet* f, GatewayConfig* c) {
  GatewayOptions& g = c->gateway;
  f->AddString("model_dir", &c->model_dir, "model directory (tokenizer and config; required)");
  f->AddString("model_name", &g.limits.model_name,
               "model name clients use; default: the directory's name");
  f->AddString("registry", &c->registry_address, "chunk registry host:port; empty: none");
  f->AddString("workers", &c->workers,
               "comma-separated worker addresses, used when the registry is away");
  f->AddInt("max_concurrent", &g.max_concurrent,
            "admitted + queued + routing requests at most; beyond: RESOURCE_EXHAUSTED at once");
  f->AddDuration("queue_timeout", &g.admission.queue_timeout,
                 "longest wait for a worker with room; then RESOURCE_EXHAUSTED");
  f->AddDuration("overload_queue_timeout", &g.admission.overload_queue_timeout,
                 "longest wait once the queue has stood for --standing_queue (overload)");
  f->AddDuration("standing_queue", &g.admission.standing_queue,
                 "a queue not empty for this long means overload");
  f->AddBool("adaptive_admission", &g.admission.adaptive,
             "adapt each worker's concurrency limit to its time per output token");
  f->AddInt("admission_initial_limit", &g.admission.initial_limit,
            "a worker's concurrency limit before it is measured (the fixed limit without "
            "--adaptive_admission)");
  f->AddInt("admission_max_limit", &g.admission.max_limit, "a worker's concurrency limit at most");
  f->AddDuration("admission_tpot_target", &g.admission.tpot_target,
                 "a worker's limit does not shrink while its median time per output token is "
                 "under this (0: --admission_latency_tolerance alone)");
  f->AddDouble("admission_latency_tolerance", &g.admission.latency_tolerance,
               "time per output token allowed, as a multiple of the worker's unloaded time");
  f->AddInt64("max_prompt_bytes", &g.limits.max_prompt_bytes,
              "prompt text bytes per request at most");
  f->AddInt64("max_context", &g.limits.max_context, "prompt + max_tokens at most; 0: the model's");
  f->AddInt("default_max_tokens", &g.limits.default_max_tokens,
            "max_tokens when a request sets none");
  f->AddInt("max_attempts", &g.max_attempts, "workers tried per request (failover and resume)");
  f->AddBool("resume_mid_stream", &g.resume_mid_stream,
             "continue a stream on another worker when its worker dies mid-stream");
  f->AddDuration("request_timeout", &g.request_timeout, "deadline for requests that set none");
  f->AddCustom("route_policy", "cost|load|round_robin|random",
               std::string(RoutePolicyName(g.weights.policy)),
               "how workers are ranked: cost (cached prefix vs load vs KV, router.h), or for "
               "comparison load only, round robin, random",
               [&g](std::string_view text) -> absl::Status {
                 absl::StatusOr<RoutePolicy> p = ParseRoutePolicy(text);
                 if (!p.ok()) return p.status();
                 g.weights.policy = *p;
                 return absl::OkStatus();
               });
  f->AddDouble("route_prefill_weight", &g.weights.prefill,
               "routing cost per uncached prompt token");
  f->AddDouble("route_load_weight", &g.weights.load, "routing cost per running or queued sequence");
  f->AddDouble("route_kv_weight", &g.weights.kv, "routing cost times used-KV fraction squared");
  f->AddDouble("route_host_weight", &g.weights.host,
               "routing cost per matched token held only in a worker's host KV tier");
  f->AddInt("route_max_waiting", &g.weights.max_waiting,
            "queued requests that mark a worker overloaded");
  f->AddInt64("route_recent_ms", &g.route_recent_ms,
              "a prompt sent to a worker counts as held there for this long when routing, "
              "before the registry hears of it (a burst sharing a new prefix stays together); "
              "0: off; below 0 is refused");
  f->AddDouble("route_fetch_bandwidth", &c->fetch.bandwidth,
               "peer KV fetch: measured bytes/s of a worker-to-worker fetch (bench/service/"
               "RESULTS.md); 0: never fetch, always prefill");
  f->AddDouble("route_prefill_tokens_per_s", &c->fetch.prefill_tokens_per_s,
               "peer KV fetch: measured prefill tokens/s of this model on the workers; 0: never "
               "fetch");
  f->AddDouble("route_fetch_overhead_ms", &c->fetch.overhead_ms,
               "peer KV fetch: a fetch's fixed cost (connection, first block, import) in ms");
  f->AddDouble("route_fetch_holder_weight", &g.weights.fetch_holder,
               "peer KV fetch: routing cost per sequence running or queued on the holder");
  f->AddString("auth_token", &g.auth_token,
               "require 'authorization: Bearer <token>' on public RPCs");
  f->AddString("auth_token_file", &c->auth_token_file, "read the bearer token from this file");
  f->AddInt("http_port", &c->http_port,
            "OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models) on "
            "this port; -1 off, 0 a free one");
  f->AddInt("http_threads", &c->http_threads,
            "event-loop threads of the HTTP API (open streams hold none; --max_concurrent "
            "bounds them)");
  f->AddString("reasoning_parser", &c->reasoning_parser,
               "HTTP chat completions: qwen3 puts a leading <think>...</think> in "
               "message.reasoning_content (delta.reasoning_content when streamed); empty: off");
  common::RegisterInternalAuthFlags(f, &c->internal_auth);
}

void FetchCostModel(const FetchMeasurements& m, const model::ModelConfig& mc,
                    RouteWeights* weights) {
  if (m.bandwidth <= 0 || m.prefill_tokens_per_s <= 0) {
    weights->fetch = 0.0;
    return;
  }
  const double kv_bytes_per_token = 2.0 * static_cast<double>(mc.num_hidden_layers) *
                                    static_cast<double>(mc.kv_size()) * 2.0;  // K and V, bf16
  weights->fetch = m.prefill_tokens_per_s * kv_bytes_per_token / m.bandwidth;
  weights->fetch_overhead = m.prefill_tokens_per_s * m.overhead_ms / 1000.0;
}

absl::StatusOr<std::unique_ptr<GatewayServer>> GatewayServer::Start(const GatewayConfig& config) {
  if (config.model_dir.empty()) {
    return absl::InvalidArgumentError("--model_dir is required (the model's tokenizer and config)");
  }
  const AdmissionOptions& a = config.gateway.admission;
  if (a.queue_timeout < absl::ZeroDuration() || a.overload_queue_timeout < absl::ZeroDuration() ||
      a.standing_queue < absl::ZeroDuration() || a.tpot_target < absl::ZeroDuration() ||
      a.initial_limit < 1 || a.max_limit < a.initial_limit || !(a.latency_tolerance > 1.0)) {
    return absl::InvalidArgumentError(
        "admission flags: need --queue_timeout, --overload_queue_timeout, --standing_queue "
        "and --admission_tpot_target >= 0, --admission_initial_limit >= 1, "
        "--admission_max_limit >= --admission_initial_limit and "
        "--admission_latency_tolerance > 1");
  }
  if (config.gateway.route_recent_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--route_recent_ms ",
                                                   config.gateway.route_recent_ms,
                                                   ": need >= 0 (0 turns the routing note off)"));
  }
  if (config.http_port >= 0 && (config.http_threads < 1 || config.http_threads > kMaxHttpThreads)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_threads ", config.http_threads, ": need 1..", kMaxHttpThreads,
        " event-loop threads (each serves any number of open streams; 2 is plenty for most)"));
  }
  if (!config.reasoning_parser.empty() && config.reasoning_parser != "qwen3") {
    return absl::InvalidArgumentError(absl::StrCat("--reasoning_parser='", config.reasoning_parser,
                                                   "': must be qwen3 or empty (off)"));
  }
  absl::StatusOr<common::PeerIdentity> self_id =
      common::CheckOwnIdentity(config.internal_auth, common::Role::kGateway);
  if (!self_id.ok()) return self_id.status();
  const bool secure = !config.internal_auth.insecure;
  if (secure && (config.registry_tls.enabled || config.worker_tls.enabled)) {
    return absl::InvalidArgumentError(
        "--registry_tls/--worker_tls apply only with --insecure_internal; internal auth dials "
        "the registry and workers with --internal_cert");
  }
  std::unique_ptr<GatewayServer> g(new GatewayServer());
  GatewayOptions opts = config.gateway;
  auto tok = tokenizer::Tokenizer::Load(config.model_dir);
  if (!tok.ok()) return tok.status();
  g->tokenizer_ = std::move(*tok);
  auto mc = model::LoadModelConfig(config.model_dir);
  if (!mc.ok()) return mc.status();
  if (opts.limits.model_name.empty()) {
    opts.limits.model_name =
        std::filesystem::path(config.model_dir).lexically_normal().filename().string();
    if (opts.limits.model_name.empty()) {
      opts.limits.model_name =
          std::filesystem::path(config.model_dir).parent_path().filename().string();
    }
  }
  opts.limits.vocab_size = mc->vocab_size;
  FetchCostModel(config.fetch, *mc, &opts.weights);
  if (opts.limits.max_context <= 0 || opts.limits.max_context == 4096) {
    opts.limits.max_context = mc->max_position_embeddings;
  }
  if (!config.auth_token_file.empty()) {
    auto t = common::ReadFileToString(config.auth_token_file);
    if (!t.ok()) return t.status();
    opts.auth_token = std::string(absl::StripAsciiWhitespace(*t));
  }
  if (!config.registry_address.empty()) {
    common::ClientChannelOptions co;
    co.tls = secure ? common::InternalClientTls(config.internal_auth, common::kRegistryServerName)
                    : config.registry_tls;
    auto ch = common::MakeChannel(config.registry_address, co);
    if (!ch.ok()) return ch.status();
    g->registry_ = registry::NewGrpcRegistryClient(*ch);
  }
  std::vector<std::string> statics;
  for (absl::string_view w : absl::StrSplit(config.workers, ',', absl::SkipWhitespace())) {
    statics.emplace_back(w);
  }
  if (!g->registry_ && statics.empty()) {
    return absl::InvalidArgumentError("give --registry, --workers, or both");
  }
  common::ClientChannelOptions wo;
  wo.tls = secure ? common::InternalClientTls(config.internal_auth, common::kWorkerServerName)
                  : config.worker_tls;
  g->pool_ = std::make_unique<WorkerPool>(wo, statics);
  g->metrics_ = std::make_unique<TurnMetrics>(
      config.server.metrics ? *config.server.metrics : common::MetricsRegistry::Default());
  g->service_ = std::make_unique<GatewayService>(opts, g->tokenizer_.get(), g->registry_.get(),
                                                 g->pool_.get(), g->metrics_.get());
  // gRPC buffers a whole message before the service sees it: far oversized requests are refused
  // at the transport already. Up to 4x what a valid prompt can need they reach the service, which
  // refuses them before parsing with a message that names the limit (raw_request.h).
  common::ServerOptions server = config.server;
  server.max_message_bytes = std::min<int64_t>(
      server.max_message_bytes, 4 * static_cast<int64_t>(MaxRequestBytes(opts.limits)));
  // With the HTTP front on, the ready line waits for it (below): whoever waits for that line
  // (cascade up, scripts) may call either API at once.
  const bool http_on = config.http_port >= 0;
  if (http_on) server.print_ready_line = false;
  g->runner_ = std::make_unique<common::ServerRunner>(server);
  g->runner_->AddService({g->service_.get(), cascade::v2::GatewayService::service_full_name()});
  // Streams in flight (HTTP ones too: they are calls on the in-process channel) finish while
  // their connections are still open, new ones are refused as draining (stream_gate.h).
  GatewayService* svc = g->service_.get();
  g->runner_->AddDrainCallback([svc](absl::Time deadline) { svc->DrainStreams(deadline); });
  g->drain_ = config.server.drain_timeout;
  if (absl::Status s = g->runner_->Start(); !s.ok()) return s;
  if (config.http_port >= 0) {
    OpenAiHttpOptions ho;
    ho.host = config.server.host;
    ho.port = config.http_port;
    ho.threads = config.http_threads;
    ho.model_name = opts.limits.model_name;
    ho.max_context = opts.limits.max_context;
    // JSON escapes can double a prompt's bytes; the gateway checks the real limits after.
    ho.max_body_bytes = 2 * MaxRequestBytes(opts.limits);
    ho.detokenize = [tok = g->tokenizer_.get()](std::span<const int32_t> ids) {
      return tok->DecodeText(ids);
    };
    ho.reasoning = config.reasoning_parser == "qwen3";
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    auto http = OpenAiHttpServer::Start(ho, g->runner_->server()->InProcessChannel(args));
    if (!http.ok()) return http.status();
    g->http_ = std::move(*http);
    if (config.server.print_ready_line) {
      // The HTTP line first (cascade up reads its port, ChildSpec::note_markers), then the
      // runner's own ready line.
      std::cout << config.server.name << " OpenAI HTTP API on http://" << config.server.host << ":"
                << g->http_->port() << "/v1\n"
                << config.server.name << " serving on " << g->runner_->address() << std::endl;
    }
  }
  common::LogInfo("gateway_started", {{"model", opts.limits.model_name},
                                      {"max_context", opts.limits.max_context},
                                      {"registry", config.registry_address},
                                      {"static_workers", static_cast<long>(statics.size())}});
  return g;
}

GatewayServer::~GatewayServer() { Shutdown(absl::Seconds(5)); }

void GatewayServer::Wait() {
  runner_->Wait();
  Shutdown(drain_);
}

void GatewayServer::Shutdown(absl::Duration drain) {
  // New HTTP requests get 503; open HTTP streams are gRPC calls on the in-process channel, so the
  // server's drain (the service's streams first, stream_gate.h) ends them; the front then stops.
  if (http_) http_->StopAccepting();
  if (runner_) runner_->Shutdown(drain);
  http_.reset();
}

}  // namespace cascade::gateway
