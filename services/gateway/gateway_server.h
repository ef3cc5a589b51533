// A whole gateway process in one object: tokenizer and model limits from the model directory,
// registry client, worker pool, the Gateway service on the common server plumbing.
// `cascade-gateway` is a thin main over this; integration tests start it in-process.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cache_service/client/registry_client.h"
#include "common/flags.h"
#include "common/server_runner.h"
#include "gpu_worker/model/config.h"
#include "services/gateway/gateway_service.h"
#include "services/gateway/openai_http.h"

namespace cascade::gateway {

// The measurements peer fetch routing is derived from (router.h): a fetched token costs
// prefill_tokens_per_s * kv_bytes_per_token / bandwidth prefilled tokens, a fetch overhead_ms *
// prefill_tokens_per_s more. Off while either rate is 0.
// The defaults are the H100 measurement (bench/service/RESULTS.md: qwen3-8b shape, two CUDA
// workers, gRPC with internal mTLS over loopback); prefill speed is per model and GPU, so it has
// no default and peer fetch stays off until it is set.
struct FetchMeasurements {
  double bandwidth = 5.9e8;           // bytes/s of a worker-to-worker fetch, end to end
  double prefill_tokens_per_s = 0.0;  // of this model on the workers
  double overhead_ms = 265.0;         // a fetch's fixed cost
};

// Sets weights->fetch and fetch_overhead from `m` for a model of config `mc` (bf16 KV, as the
// CUDA workers keep it).
void FetchCostModel(const FetchMeasurements& m, const model::ModelConfig& mc,
                    RouteWeights* weights);

// The most HTTP event-loop threads --http_threads may ask for (Start refuses more).
inline constexpr int kMaxHttpThreads = 256;

struct GatewayConfig {
  common::ServerOptions server;
  GatewayOptions gateway;
  std::string model_dir;         // tokenizer.json, tokenizer_config.json, config.json
  std::string registry_address;  // empty: no registry (load-only routing over --workers)
  std::string workers;           // comma-separated static worker addresses (fallback)
  std::string auth_token_file;
  common::ClientTlsOptions registry_tls;  // only with internal_auth.insecure
  common::ClientTlsOptions worker_tls;    // only with internal_auth.insecure
  // mTLS with roles to the registry and workers (the default): a gateway certificate, and the
  // CA the registry's and workers' certificates must chain to. REQUIRED unless insecure. The
  // public port is not internal: it keeps --tls_cert and --auth_token.
  common::InternalAuthOptions internal_auth;
  int http_port = -1;    // the OpenAI-compatible HTTP front: -1 off, 0 a free port
  int http_threads = 2;  // its event loops (a stream holds no thread), 1..kMaxHttpThreads
  // Chat completions' reasoning (vLLM's --reasoning-parser): "" (off: the text is all content)
  // or "qwen3" (a leading <think>...</think> becomes reasoning_content).
  std::string reasoning_parser;
  FetchMeasurements fetch;
};

void RegisterGatewayFlags(common::FlagSet* flags, GatewayConfig* config);

class GatewayServer {
 public:
  static absl::StatusOr<std::unique_ptr<GatewayServer>> Start(const GatewayConfig& config);
  ~GatewayServer();

  int port() const { return runner_->port(); }
  int http_port() const { return http_ ? http_->port() : -1; }
  std::string address() const { return runner_->local_address(); }
  common::ServerRunner& runner() { return *runner_; }
  void Wait();
  void Shutdown(absl::Duration drain);

 private:
  GatewayServer() = default;

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<TurnMetrics> metrics_;
  std::unique_ptr<GatewayService> service_;
  // After service_, so it goes first: it waits for its async Resolves, whose callbacks run in
  // the service.
  std::unique_ptr<registry::RegistryClient> registry_;
  std::unique_ptr<common::ServerRunner> runner_;
  std::unique_ptr<OpenAiHttpServer> http_;  // after runner_: stopped before it
  absl::Duration drain_;
};

}  // namespace cascade::gateway
