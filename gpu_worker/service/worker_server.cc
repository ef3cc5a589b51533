// Worker process assembly; see worker_server.h.
#include "gpu_worker/service/worker_server.h"

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "gpu_worker/backend/cpu/cpu_backend.h"
#include "gpu_worker/service/registry_agent.h"
#include "gpu_worker/service/worker_metrics.h"
#ifdef CASCADE_HAVE_CUDA
#include "gpu_worker/backend/cuda/cuda_backend.h"
#include "gpu_worker/backend/cuda/device.h"
#endif

namespace cascade::worker {

void RegisterWorkerFlags(common::FlagSet* f, WorkerConfig* c) {
  f->AddString("model_dir", &c->model_dir, "model directory in Hugging Face layout (required)");
  f->AddString("model_name", &c->model_name,
               "model name clients use; default: the directory's name");
  f->AddString("backend", &c->backend, "cpu, cuda, or auto (cuda when built and a GPU is present)");
  f->AddInt64("kv_cache_bytes", &c->kv_cache_bytes,
              "KV cache memory budget in bytes; 0: the backend's default (CPU 256 MiB, CUDA "
              "--kv_cache_fraction of the GPU memory free after the weights)");
  f->AddInt64("kv_blocks", &c->kv_blocks, "KV cache size in blocks; overrides --kv_cache_bytes");
  f->AddInt("block_size", &c->block_size, "tokens per KV block (prefix sharing granularity)");
  f->AddInt("max_batch", &c->max_num_seqs, "sequences running at once at most");
  f->AddInt("max_batched_tokens", &c->max_batched_tokens, "tokens per engine step at most");
  f->AddInt("max_waiting", &c->max_waiting, "queued requests beyond which RESOURCE_EXHAUSTED");
  f->AddDouble("max_pinned_kv_fraction", &c->max_pinned_kv_fraction,
               "share of the KV cache pinned chunks may hold, in [0, 1]; pins past it are not "
               "taken (cascade:pins_refused_total), so pins cannot starve other requests");
  f->AddInt("max_chunks_per_block", &c->max_chunks_per_block,
            "chunks recorded (and reported to the registry) through one KV block, in [1, 1024]: "
            "the same tokens under other chunk boundaries hold the same blocks; past it the "
            "least recently used is withdrawn (cascade:held_chunks_displaced_total)");
  f->AddInt64("max_context", &c->max_context, "prompt + output tokens at most; 0: the model's");
  f->AddInt("threads", &c->threads, "CPU backend threads; 0: all cores");
  f->AddInt(
      "cuda_device", &c->cuda_device,
      "CUDA backend: the GPU to run on (an index among the visible ones); one worker per GPU");
  f->AddDouble("kv_cache_fraction", &c->kv_cache_fraction,
               "CUDA backend without --kv_blocks or --kv_cache_bytes: share of the GPU memory free "
               "after the weights that the KV cache takes, in (0, 1)");
  f->AddBool("gemm_tune", &c->gemm_tune,
             "CUDA backend: at each decode batch bucket up to 64, use the fastest cuBLASLt GEMM "
             "whose output is bitwise the pinned one's (same tokens), whatever the model's size");
  f->AddInt("gemm_tune_min_hidden", &c->gemm_tune_min_hidden,
            "CUDA backend: tune as --gemm_tune by default for models of at least this hidden "
            "size (0: never by default; 2048: llama-3.2-1b and larger, where it measured "
            "4-19% faster decode at batch 1-64)");
  f->AddInt("decode_gemm_max_m", &c->decode_gemm_max_m,
            "CUDA backend: GEMMs of up to this many rows (<= 64; 0: off) run the kernel measured "
            "fastest per decode batch bucket at load time, each bitwise the pinned one's");
  f->AddInt("gemm_prefill_min_m", &c->gemm_prefill_min_m,
            "CUDA backend: GEMMs of at least this many rows (prefill chunks; 0: off) run the "
            "cuBLASLt algorithm measured fastest per weight shape at load time among those "
            "bitwise the pinned one's (same tokens; 1.12-1.19x prefill on an H200)");
  f->AddInt("persistent_decode_min_tiles", &c->persistent_decode_min_tiles,
            "CUDA backend on Hopper: decode steps whose rows average at least this many 64-token "
            "tiles (or whose rows x kv heads fit one per consumer, two per SM) run on the "
            "persistent decode attention kernel (same tokens; 0: at any length; -1: never, the "
            "split kernel as before it)");
  f->AddBool("capture_graphs_at_load", &c->capture_graphs_at_load,
             "CUDA backend: capture every batch bucket's decode graph at start (about a second), "
             "so no early request waits ~5-10 ms for a capture; =false to capture on first use");
  f->AddBool("speculative_launch", &c->speculative_launch,
             "CUDA backend, with --overlap_schedule: enqueue the next decode step behind the one "
             "in flight, its inputs taken on the GPU, so the GPU does not wait for the host "
             "between steps (same tokens; decode steps ~4% shorter at batch 64-256 on an H200)");
  f->AddBool("defer_eager_steps", &c->defer_eager_steps,
             "CUDA backend, with --overlap_schedule: prefill and mixed steps whose rows are all "
             "sampled on the GPU return once enqueued, so the next step is built (and, with "
             "--speculative_launch, enqueued) while they run (same tokens); =false runs them whole "
             "before the host goes on");
  f->AddString("attention_fold_order", &c->attention_fold_order,
               "CUDA backend: one_level (default) or two_level (Hopper: super-tiles of 4 tiles "
               "folded in order; other bits, so alike on every worker; decode over shared "
               "system + context chunks ~1.3x faster, cold prefill up to 1.15x slower)");
  f->AddString("gemm_k_split", &c->gemm_k_split,
               "CUDA backend: rule (default: o_proj / down_proj's k cut into slices fixed per "
               "shape, summed in order; decode at batch 1-32 ~1.13x faster, prefill 3-7% slower "
               "on an H200) or off; other bits, so alike on every worker");
  f->AddInt64("host_kv_bytes", &c->host_kv_bytes,
              "host KV tier: host memory for KV blocks the GPU tier evicts (pinned on CUDA); "
              "-1: min(RAM / 5, 4 x the KV cache); 0: off");
  f->AddInt64("host_kv_offload_ahead", &c->host_kv_offload_ahead,
              "host KV tier: once fewer GPU blocks than this are free, the blocks eviction takes "
              "next are copied to the host ahead of it (they stay cached), so no step waits for "
              "an eviction's copy; -1: 4 steps' allocations up to a quarter of the KV cache; "
              "0: off (each eviction is copied before the step that reuses its block)");
  f->AddInt64("host_kv_offload_min_uses", &c->host_kv_offload_min_uses,
              "host KV tier write policy: a GPU block goes to the host only if its content was "
              "taken again (a prefix hit) at least this many times while cached; 0 (default): "
              "every block; 1: unique prompts cost no copies, a prefix that returns only after "
              "its eviction is recomputed");
  f->AddBool("overlap_schedule", &c->overlap_schedule,
             "schedule and build the next step while the current one runs on the device "
             "(same tokens; hides the host's work; on by default, =false to turn it off)");
  f->AddInt("overlap_min_rows", &c->overlap_min_rows,
            "with --overlap_schedule: overlap only after steps of at least this many sequences; "
            "0: every step; -1 (default): 0 on CUDA with --speculative_launch, else 32 (the "
            "overlap alone measured slower below ~32 rows)");
  f->AddInt("max_prompt_logprob_rows", &c->max_prompt_logprob_rows,
            "prompt tokens scored (prompt logprobs) per step at most, in [0, 16384]; 0: the "
            "backend's default (4096 on CUDA, 256 on the CPU); fewer shorten the steps that score "
            "a long prompt beside other requests' decode (same scores)");
  f->AddString("worker_id", &c->worker_id, "stable worker id; default worker-<port>");
  f->AddString("registry", &c->registry_address, "chunk registry host:port; empty: none");
  f->AddString("advertise_address", &c->advertise_address,
               "host:port the gateway dials; default 127.0.0.1:<port>");
  f->AddInt64("heartbeat_ms", &c->heartbeat_ms, "registry heartbeat interval");
  f->AddBool("peer_fetch", &c->peer_fetch.enabled,
             "fetch the KV of a prefix from the peer the gateway names (FetchKv) instead of "
             "prefilling it; needs the host KV tier");
  f->AddDuration("peer_fetch_timeout", &c->peer_fetch.timeout,
                 "a peer fetch's deadline; past it the prompt is prefilled");
  f->AddInt64("peer_fetch_max_bytes", &c->peer_fetch.max_bytes,
              "KV bytes one peer fetch may bring at most");
  common::RegisterInternalAuthFlags(f, &c->internal_auth);
}

absl::StatusOr<int64_t> KvCacheBlocks(const WorkerConfig& config, const model::ModelConfig& model,
                                      const std::string& kind) {
  if (config.kv_blocks < 0 || config.kv_cache_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_blocks=", config.kv_blocks, " --kv_cache_bytes=", config.kv_cache_bytes,
        ": KV cache sizes must be >= 0 (0: the backend's default; e.g. --kv_cache_bytes=",
        int64_t{40} << 30, " for 40 GiB)"));
  }
  if (config.kv_blocks > 0) return config.kv_blocks;
  int64_t bytes = config.kv_cache_bytes;
  if (bytes <= 0) {
    if (kind != "cpu") return 0;
    bytes = int64_t{256} << 20;
  }
  // CPU keeps float32 K and V; CUDA keeps bf16, so the same budget holds twice the tokens.
  const int64_t bytes_per_elem = kind == "cpu" ? 4 : 2;
  const int64_t per_token = 2 * model.num_hidden_layers * model.kv_size() * bytes_per_elem;
  return std::max<int64_t>(1, bytes / (per_token * config.block_size));
}

absl::StatusOr<std::unique_ptr<engine::Backend>> MakeBackend(const std::string& kind,
                                                             const model::Model& model,
                                                             const WorkerConfig& config) {
  const model::ModelConfig& mc = model.config();
  if (kind != "cpu" && kind != "cuda" && kind != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be cpu, cuda or auto, not '", kind, "'"));
  }
  // A CUDA setting, refused on every backend: a bad value is a mistake wherever it is given.
  if (config.decode_gemm_max_m < 0 || config.decode_gemm_max_m > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--decode_gemm_max_m=", config.decode_gemm_max_m,
                                                   ": must be in [0, 64] (0: off)"));
  }
  if (config.gemm_prefill_min_m < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gemm_prefill_min_m=", config.gemm_prefill_min_m, ": must be >= 0 (0: off)"));
  }
  if (config.persistent_decode_min_tiles < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--persistent_decode_min_tiles=", config.persistent_decode_min_tiles,
                     ": must be >= -1 (-1: never, 0: at any length)"));
  }
  if (config.attention_fold_order != "one_level" && config.attention_fold_order != "two_level") {
    return absl::InvalidArgumentError(absl::StrCat("--attention_fold_order='",
                                                   config.attention_fold_order,
                                                   "': must be one_level or two_level"));
  }
  if (config.gemm_k_split != "rule" && config.gemm_k_split != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--gemm_k_split='", config.gemm_k_split, "': must be rule or off"));
  }
  if (config.gemm_tune_min_hidden < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gemm_tune_min_hidden=", config.gemm_tune_min_hidden,
                     ": must be >= 0 (0: never by default)"));
  }
#ifdef CASCADE_HAVE_CUDA
  if (kind == "cuda" || (kind == "auto" && cuda::DeviceCount() > 0)) {
    const int devices = cuda::DeviceCount();
    if (config.cuda_device < 0 || (devices > 0 && config.cuda_device >= devices)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cuda_device=", config.cuda_device, ": ", devices,
                       " GPU(s) visible; give an index in [0, ", devices,
                       ") (CUDA_VISIBLE_DEVICES narrows them)"));
    }
    if (!(config.kv_cache_fraction > 0 && config.kv_cache_fraction < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv_cache_fraction=", config.kv_cache_fraction, ": must be in (0, 1)"));
    }
    cuda::CudaBackendOptions o;
    o.device = config.cuda_device;
    o.kv_cache_fraction = config.kv_cache_fraction;
    absl::StatusOr<int64_t> blocks = KvCacheBlocks(config, mc, "cuda");
    if (!blocks.ok()) return blocks.status();
    o.num_blocks = *blocks;  // 0: sized from free memory
    o.block_size = config.block_size;
    o.max_num_tokens = std::max(config.max_batched_tokens, 256);
    o.gemm_tune = config.gemm_tune;
    o.gemm_tune_min_hidden = config.gemm_tune_min_hidden;
    o.decode_gemm_max_m = config.decode_gemm_max_m;
    o.gemm_prefill_min_m = config.gemm_prefill_min_m;
    o.persistent_decode_min_tiles = config.persistent_decode_min_tiles;
    o.capture_graphs_at_load = config.capture_graphs_at_load;
    o.speculative_launch = config.speculative_launch;
    o.defer_eager_steps = config.defer_eager_steps;
    o.split_k = config.gemm_k_split == "off" ? 1 : 0;
    // The two-level order asked for by name: where the device cannot run it, NewCudaBackend
    // says so rather than falling back to other bits than the deployment's.
    o.attention_super_tiles = config.attention_fold_order == "two_level" ? cuda::kSuperTiles : 1;
    auto b = cuda::NewCudaBackend(model, o);
    if (!b.ok()) return b.status();
    return std::move(*b);
  }
#else
  if (kind == "cuda") {
    return absl::FailedPreconditionError(
        "--backend=cuda: this build has no CUDA backend (configure where nvcc is installed)");
  }
#endif
  if (config.attention_fold_order == "two_level") {
    return absl::InvalidArgumentError(
        "--attention_fold_order=two_level: the CPU backend folds attention in one level only "
        "(the two-level order runs on Hopper GPUs); use one_level");
  }
  cpu::CpuBackendOptions o;
  absl::StatusOr<int64_t> blocks = KvCacheBlocks(config, mc, "cpu");
  if (!blocks.ok()) return blocks.status();
  o.num_blocks = *blocks;
  o.block_size = config.block_size;
  o.num_threads = config.threads;
  if (absl::Status s = cpu::ValidateCpuBackendOptions(o); !s.ok()) return s;
  return cpu::NewCpuBackend(model, o);
}

absl::Status CheckEngineFlags(const WorkerConfig& config) {
  if (!(config.max_pinned_kv_fraction >= 0 && config.max_pinned_kv_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_pinned_kv_fraction=", config.max_pinned_kv_fraction,
                     ": must be in [0, 1] (0: no pins, 1: pins may hold the whole KV cache)"));
  }
  if (config.max_chunks_per_block < 1 || config.max_chunks_per_block > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_chunks_per_block=", config.max_chunks_per_block,
                     ": must be in [1, 1024] (chunk records through one KV block)"));
  }
  if (config.overlap_min_rows < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--overlap_min_rows=", config.overlap_min_rows,
                     ": must be >= 0 (0: every step), or -1 (auto: by backend)"));
  }
  if (config.max_prompt_logprob_rows < 0 || config.max_prompt_logprob_rows > 16384) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_prompt_logprob_rows=", config.max_prompt_logprob_rows,
        ": must be in [0, 16384] (0: the backend's default, 4096 on CUDA, 256 on the CPU)"));
  }
  if (config.host_kv_offload_min_uses < 0 || config.host_kv_offload_min_uses > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host_kv_offload_min_uses=", config.host_kv_offload_min_uses,
                     ": must be in [0, 1000000] (0: every evicted block goes to the host)"));
  }
  if (config.host_kv_offload_ahead < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host_kv_offload_ahead=", config.host_kv_offload_ahead,
                     ": must be >= 0 blocks (0: off), or -1 (auto)"));
  }
  return absl::OkStatus();
}

int64_t HostKvBytes(int64_t flag, const engine::Backend& backend) {
  if (flag >= 0) return flag;
  const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  const int64_t kv = backend.NumBlocks() * backend.KvBlockBytes();
  return std::max<int64_t>(0, std::min(ram / 5, 4 * kv));
}

int EffectiveOverlapMinRows(const WorkerConfig& config, const std::string& kind) {
  if (config.overlap_min_rows >= 0) return config.overlap_min_rows;
  return kind == "cuda" && config.speculative_launch ? 0 : 32;
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(const WorkerConfig& config) {
  if (config.model_dir.empty()) {
    return absl::InvalidArgumentError(
        "--model_dir is required (create one with `cascade mkmodel`)");
  }
  absl::StatusOr<common::PeerIdentity> self_id =
      common::CheckOwnIdentity(config.internal_auth, common::Role::kWorker);
  if (!self_id.ok()) return self_id.status();
  const bool secure = !config.internal_auth.insecure;
  if (secure && !config.worker_id.empty() && config.worker_id != self_id->worker_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_id=", config.worker_id, " but --internal_cert names ",
                     self_id->ToString(), "; a worker acts under its certificate's id"));
  }
  if (secure && config.registry_tls.enabled) {
    return absl::InvalidArgumentError(
        "registry TLS options apply only with --insecure_internal; internal auth dials the "
        "registry with --internal_cert");
  }
  if (absl::Status s = CheckEngineFlags(config); !s.ok()) return s;
  std::unique_ptr<WorkerServer> w(new WorkerServer());
  w->config_ = config;
  auto model = model::LoadModel(config.model_dir);
  if (!model.ok()) return model.status();
  w->model_ = std::move(*model);
  auto backend = MakeBackend(config.backend, *w->model_, config);
  if (!backend.ok()) return backend.status();

  const model::ModelConfig& mc = w->model_->config();
  engine::EngineOptions eo;
  eo.model_name = config.model_name.empty() ? w->model_->name() : config.model_name;
  eo.max_num_seqs = config.max_num_seqs;
  eo.max_num_batched_tokens = config.max_batched_tokens;
  eo.max_context = config.max_context > 0 ? config.max_context : mc.max_position_embeddings;
  eo.max_tokens_limit = static_cast<int32_t>(eo.max_context);
  eo.max_waiting = config.max_waiting;
  eo.max_pinned_fraction = config.max_pinned_kv_fraction;
  eo.max_chunks_per_block = config.max_chunks_per_block;
  eo.eos_token_ids = mc.eos_token_ids;
  eo.host_kv_bytes = HostKvBytes(config.host_kv_bytes, **backend);
  eo.host_offload_ahead_blocks = config.host_kv_offload_ahead;
  eo.host_offload_min_uses = static_cast<int32_t>(config.host_kv_offload_min_uses);
  eo.overlap_schedule = config.overlap_schedule;
  eo.overlap_min_rows = EffectiveOverlapMinRows(config, (*backend)->Name());
  eo.chunk_events = !config.registry_address.empty();  // only the registry agent takes them
  // The CPU backend scores prompt-logprob rows on the host from the step's whole logits rows
  // (vocabulary x 4 bytes each): fewer of them a step there than the CUDA backend's 4096.
  if ((*backend)->Name() == "cpu") eo.max_prompt_logprob_rows = 256;
  if (config.max_prompt_logprob_rows > 0)
    eo.max_prompt_logprob_rows = config.max_prompt_logprob_rows;
  auto engine = engine::NewEngine(eo, std::move(*backend));
  if (absl::Status s = engine->HostTierStatus(); !s.ok()) {
    if (config.host_kv_bytes > 0) {
      return absl::Status(s.code(), absl::StrCat("--host_kv_bytes: ", s.message()));
    }
    common::LogInfo("host_kv_tier_off", {{"reason", std::string(s.message())}});
  }

  common::ServerOptions server = config.server;
  if (secure) server.internal_auth = {config.internal_auth, WorkerMethodPolicy()};
  w->runner_ = std::make_unique<common::ServerRunner>(server);
  auto* runner = w->runner_.get();
  WorkerServer* self = w.get();
  w->loop_ = std::make_unique<engine::EngineLoop>(std::move(engine), [self] {
    if (self->metrics_) self->metrics_->Update(self->loop_->engine().Stats());
    if (self->agent_) self->agent_->OnStep();
  });
  // The worker id needs the bound port when not given, so the service is created after Start;
  // gRPC needs services before Start, so bind the id to the configured port when it is fixed.
  std::string id = secure ? self_id->worker_id : config.worker_id;
  if (id.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    static std::atomic<int> counter{0};
    id = config.server.port != 0 ? absl::StrCat(host, ":", config.server.port)
                                 : absl::StrCat(host, "-", getpid(), "-", counter++);
  }
  w->worker_id_ = id;
  w->metrics_ = std::make_unique<WorkerMetrics>(
      config.server.metrics ? *config.server.metrics : common::MetricsRegistry::Default(), id);
  PeerFetchOptions peer = config.peer_fetch;
  peer.tls = secure ? common::InternalClientTls(config.internal_auth, common::kWorkerServerName)
                    : common::ClientTlsOptions{};
  w->service_ =
      std::make_unique<WorkerService>(id, w->loop_.get(), std::move(peer), w->metrics_.get());
  runner->AddService({w->service_.get(), cascade::v2::WorkerService::service_full_name()});
  runner->AddDrainCallback([self] {
    if (self->agent_) self->agent_->Deregister();
  });
  // Then the streams in flight finish while the server still holds their connections (and new
  // ones are refused UNAVAILABLE, which a gateway retries elsewhere); the server's own drain
  // afterwards finds none, so it cannot close a connection under a stream's last messages.
  runner->AddDrainCallback([self](absl::Time deadline) { self->service_->DrainStreams(deadline); });
  w->loop_->Start();
  if (absl::Status s = runner->Start(); !s.ok()) return s;

  if (!config.registry_address.empty()) {
    AgentOptions ao;
    ao.worker_id = id;
    ao.address =
        config.advertise_address.empty() ? runner->local_address() : config.advertise_address;
    ao.model = eo.model_name;
    ao.block_size = config.block_size;
    ao.max_context = eo.max_context;
    ao.vocab_size = static_cast<int32_t>(mc.vocab_size);
    ao.heartbeat_ms = config.heartbeat_ms;
    ao.registry_address = config.registry_address;
    ao.tls = secure ? common::InternalClientTls(config.internal_auth, common::kRegistryServerName)
                    : config.registry_tls;
    auto agent = RegistryAgent::Start(ao, &w->loop_->engine());
    if (!agent.ok()) return agent.status();
    w->agent_ = std::move(*agent);
  }
  common::LogInfo("worker_started",
                  {{"worker_id", id},
                   {"model", eo.model_name},
                   {"backend", w->loop_->engine().backend().Name()},
                   {"kv_numerics", w->loop_->engine().backend().KvNumerics()},
                   {"kv_blocks", w->loop_->engine().backend().NumBlocks()},
                   {"host_kv_blocks", w->loop_->engine().Stats().host_total_blocks},
                   {"block_size", config.block_size}});
  return w;
}

WorkerServer::~WorkerServer() { Shutdown(absl::Seconds(5)); }

std::string WorkerServer::address() const { return runner_->local_address(); }

void WorkerServer::Wait() {
  runner_->Wait();
  Shutdown(config_.server.drain_timeout);
}

void WorkerServer::Shutdown(absl::Duration drain) {
  if (!runner_) return;
  runner_->Shutdown(drain);
  if (agent_) agent_->Stop();
  if (loop_) loop_->Stop();
}

bool KeepKvBuffersMapped() {
#if defined(__GLIBC__)
  // 32 MB is the largest mmap threshold glibc accepts on 64-bit; setting it also stops glibc's
  // own adjustment of both thresholds.
  return mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
#else
  return false;
#endif
}

}  // namespace cascade::worker
