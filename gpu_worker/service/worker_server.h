// A whole worker process in one object: loads the model, builds the backend and engine, serves
// cascade.v2.WorkerService through the common server plumbing, and keeps the registry informed.
// `cascade-worker` is a thin main over this; integration tests start several in one process.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/flags.h"
#include "common/internal_auth.h"
#include "common/server_runner.h"
#include "gpu_worker/backend/cuda/cuda_defaults.h"
#include "gpu_worker/engine/engine_loop.h"
#include "gpu_worker/model/model.h"
#include "gpu_worker/service/worker_service.h"

namespace cascade::worker {

struct WorkerConfig {
  common::ServerOptions server;
  std::string model_dir;
  std::string model_name;        // empty: the model directory's name
  std::string backend = "auto";  // cpu | cuda | auto (cuda when built and a GPU is present)
  // KV memory budget (per-token size from the model); 0: the backend's default (CPU 256 MiB;
  // CUDA kv_cache_fraction of the GPU memory free after the weights).
  int64_t kv_cache_bytes = 0;
  int64_t kv_blocks = 0;  // > 0 overrides kv_cache_bytes
  int block_size = 16;
  int max_num_seqs = 64;
  int max_batched_tokens = 2048;
  int max_waiting = 256;
  // The share of the KV cache that pinned chunks (RegisterChunk's pin_ttl_seconds, the registry's
  // pins) may hold, in [0, 1] (engine::EngineOptions::max_pinned_fraction): pins past it are not
  // taken, so a client pinning prompt after prompt cannot leave other requests without KV.
  double max_pinned_kv_fraction = 0.5;
  int max_chunks_per_block = 8;  // chunk records through one KV block (residency cap)
  int64_t max_context = 0;       // 0: the model's max_position_embeddings
  int threads = 0;               // CPU backend threads; 0 = all cores
  int cuda_device = 0;           // CUDA backend: which visible GPU (one worker per GPU)
  // CUDA backend without --kv_blocks or --kv_cache_bytes: the share of the GPU memory free after
  // the weights that the KV cache takes (lower it when workers share a GPU).
  double kv_cache_fraction = 0.8;
  // CUDA backend: tune the decode GEMMs at each graph bucket up to m = 64 (CudaBackendOptions::
  // gemm_tune: faster cuBLASLt algorithms with the pinned algorithm's bits; measured 9-22% faster
  // decode at batch 8-64 on qwen3-8b, 1.6-3.6% slower on the nano-vllm workload on qwen3-0.6b):
  // gemm_tune for every model, by default for models of hidden size >= gemm_tune_min_hidden
  // (2048: llama-3.2-1b and larger).
  bool gemm_tune = false;
  int gemm_tune_min_hidden = cuda::kDefaultGemmTuneMinHidden;
  // CUDA backend: decode-sized GEMMs (up to this many rows, <= 64; 0: off) on the kernel measured
  // fastest per batch bucket at load time among the pinned algorithm, SmallGemm and DecodeGemm,
  // each bitwise the pinned one's (CudaBackendOptions::decode_gemm_max_m; the same tokens).
  int decode_gemm_max_m = cuda::kDefaultDecodeGemmMaxM;
  // CUDA backend: GEMMs of at least this many rows (prefill chunks; 0: off) on the cuBLASLt
  // algorithm chosen per weight shape at load time among those bitwise the pinned one's
  // (CudaBackendOptions::gemm_prefill_min_m; the same tokens).
  int gemm_prefill_min_m = cuda::kDefaultGemmPrefillMinM;
  // CUDA backend: CudaBackendOptions::persistent_decode_min_tiles (-1: the persistent decode
  // kernel off; the same tokens either way).
  int persistent_decode_min_tiles = cuda::kDefaultPersistentDecodeMinTiles;
  // CUDA backend: CudaBackendOptions::capture_graphs_at_load.
  bool capture_graphs_at_load = true;
  // CUDA backend: CudaBackendOptions::speculative_launch (with --overlap_schedule).
  bool speculative_launch = true;
  // CUDA backend: CudaBackendOptions::defer_eager_steps (with --overlap_schedule).
  bool defer_eager_steps = true;
  // CUDA backend: attention's fold order (CudaBackendOptions::attention_super_tiles). "one_level"
  // (the default) folds every 64-token tile into a row in turn; "two_level" accumulates
  // super-tiles of four tiles in place and folds those (Hopper only): other bits, so every worker
  // of a deployment must use the same order (the registry's KV numerics keep peer fetches apart).
  // Measured on an H200 (bench/engine/RESULTS.md, session 26): decode steps over a three-level
  // prefix tree 1.29x faster, plain decode 1-3% slower, cold prefill 2-15% slower (8k prompts
  // most): worth it where many requests share system and context chunks.
  std::string attention_fold_order = "one_level";
  // CUDA backend: batch-invariant split-K (CudaBackendOptions::split_k). "rule" (the default)
  // cuts k of the narrow projections (o_proj, down_proj) into slices fixed per shape, summed in
  // order; "off" runs them unsplit. Other bits, so every worker of a deployment alike (the KV
  // numerics keep peer fetches apart). H200, qwen3-0.6b: decode steps at batch 1-32 ~0.88x with
  // the rule, prefill 0.93-0.97x (bench/engine/NOTES.md runs 23, 28). No effect on the CPU
  // backend, whose arithmetic is its own.
  std::string gemm_k_split = "rule";
  // Host KV tier: host memory for copies of blocks the GPU tier evicts. -1: auto, the smaller of
  // a fifth of the machine's RAM and four times the GPU tier's KV bytes; 0: off.
  int64_t host_kv_bytes = -1;
  // With the host tier: GPU blocks kept copied to the host ahead of their eviction
  // (engine::EngineOptions::host_offload_ahead_blocks); -1: auto, 0: off.
  int64_t host_kv_offload_ahead = -1;
  // With the host tier, its write policy (engine::EngineOptions::host_offload_min_uses): a GPU
  // block goes to the host only if its content was taken again at least this many times while
  // cached; 0: every block.
  int64_t host_kv_offload_min_uses = 0;
  // Schedule and build step n+1 while step n runs (engine::EngineOptions::overlap_schedule):
  // the same tokens, the host's work hidden behind the GPU's. On by default: on an H100
  // (bench/engine/RESULTS.md, fourteenth session) decode steps 2.4-6.8% shorter at batch 64-256,
  // unchanged at 1-8, the nano-vllm workload 1.3% faster.
  bool overlap_schedule = true;
  // Overlapped only after steps of at least this many sequences (engine::EngineOptions::
  // overlap_min_rows). -1 (the default): EffectiveOverlapMinRows picks by backend. On an H200
  // (qwen3-0.6b, bench/engine/RESULTS.md) the overlap alone was 0-25% slower at 1-8 rows and 2-6%
  // faster at 32, 128 and 256 (session 36); with speculated launches every step overlapped is
  // 1-5% faster at 1-16 rows than the plain schedule there and even at 64 (session 49).
  int overlap_min_rows = -1;
  // Prompt-logprob rows a step scores at most (engine::EngineOptions::max_prompt_logprob_rows);
  // 0: the backend's default (4096 on CUDA, 256 on the CPU, which scores them on the host from
  // whole logits rows). Fewer bound how long one step spends scoring a long prompt while other
  // requests decode beside it; the scores are the same.
  int max_prompt_logprob_rows = 0;
  std::string worker_id;                  // empty: "worker-<port>"
  std::string registry_address;           // empty: run without a registry
  std::string advertise_address;          // what the gateway dials; empty: 127.0.0.1:<port>
  common::ClientTlsOptions registry_tls;  // only with internal_auth.insecure
  // mTLS with roles (the default): this worker's certificate names its id; the registry is
  // dialed with it too. REQUIRED unless internal_auth.insecure.
  common::InternalAuthOptions internal_auth;
  int64_t heartbeat_ms = 1000;
  // Peer fetch (the receiving side): pull the KV of a prefix a peer holds when the route names
  // one. tls is filled from internal_auth at start.
  PeerFetchOptions peer_fetch;
};

void RegisterWorkerFlags(common::FlagSet* flags, WorkerConfig* config);

// KV blocks for `config` on a backend of `kind` ("cpu" or "cuda") over a model of `model`:
// --kv_blocks, else --kv_cache_bytes over the per-block bytes (f32 K/V on the CPU, bf16 on CUDA),
// else the CPU's 256 MiB default; 0 on CUDA when neither is given (the CUDA backend then sizes
// the cache from --kv_cache_fraction of its free memory). InvalidArgument for a negative
// --kv_blocks or --kv_cache_bytes (0 is the default).
absl::StatusOr<int64_t> KvCacheBlocks(const WorkerConfig& config, const model::ModelConfig& model,
                                      const std::string& kind);

// OK, or INVALID_ARGUMENT naming the engine flag of `config` out of its range
// (--max_pinned_kv_fraction outside [0, 1]).
absl::Status CheckEngineFlags(const WorkerConfig& config);

// The host KV tier's size for --host_kv_bytes=`flag` over `backend` (resolves -1, auto).
int64_t HostKvBytes(int64_t flag, const engine::Backend& backend);

// The engine's overlap_min_rows for `config` on a backend of `kind` ("cpu" or "cuda"): the flag
// when it is >= 0; for -1 (auto), 0 (every step overlapped) on CUDA with --speculative_launch,
// where the next step is already enqueued behind the one in flight, else 32 (the overlap alone
// loses below ~32 rows: it only moves host work, the GPU still waits for the launch).
int EffectiveOverlapMinRows(const WorkerConfig& config, const std::string& kind);

class RegistryAgent;
class WorkerMetrics;

class WorkerServer {
 public:
  // Loads, builds and starts serving. Errors name what failed (model directory, backend, port).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerConfig& config);
  ~WorkerServer();

  const std::string& worker_id() const { return worker_id_; }
  int port() const { return runner_->port(); }
  std::string address() const;
  engine::EngineLoop& loop() { return *loop_; }
  common::ServerRunner& runner() { return *runner_; }
  WorkerService& service() { return *service_; }

  // Blocks until SIGTERM/SIGINT or RequestShutdown(), then drains.
  void Wait();
  // Graceful: NOT_SERVING, deregister, drain streams within `drain`, stop the engine.
  void Shutdown(absl::Duration drain);

 private:
  WorkerServer() = default;

  WorkerConfig config_;
  std::string worker_id_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<engine::EngineLoop> loop_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<RegistryAgent> agent_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<common::ServerRunner> runner_;
};

// Builds the backend `kind` names for `model`: "cpu", "cuda", or "auto".
absl::StatusOr<std::unique_ptr<engine::Backend>> MakeBackend(const std::string& kind,
                                                             const model::Model& model,
                                                             const WorkerConfig& config);

// Process-wide, once, before serving (the worker binary and benchmarks call it): keeps freed
// multi-MB buffers (KV blocks in transit: 2-4 MB each, allocated and freed per block by a peer
// fetch on both ends) in the heap instead of returning them to the OS, so the next block does
// not fault its pages in again. Page faults were the largest single cost of a fetch
// (bench/service/NOTES.md). Buffers up to 32 MB come from the heap; up to 256 MB of free heap
// top stays mapped per arena. Returns false where the allocator is not glibc's.
bool KeepKvBuffersMapped();

}  // namespace cascade::worker
