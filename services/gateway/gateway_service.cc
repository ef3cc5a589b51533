// Gateway service: unary RPCs, routing and admission; the streaming reactors are in reactors.cc.
#include "services/gateway/gateway_service.h"

#include <openssl/crypto.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "common/chunk_hash.h"
#include "common/log.h"
#include "services/gateway/raw_request.h"
#include "services/gateway/turn.h"

namespace cascade::gateway {

// Chunks RecentRoutes keeps at most (~100 bytes each).
constexpr size_t kRecentChunks = size_t{1} << 16;

GatewayService::GatewayService(GatewayOptions options, const tokenizer::Tokenizer* tokenizer,
                               registry::RegistryClient* registry, WorkerPool* pool,
                               TurnMetrics* metrics)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      registry_(registry),
      pool_(pool),
      metrics_(metrics),
      recent_(options_.route_recent_ms, kRecentChunks) {
  AdmissionOptions a = options_.admission;
  a.max_pending = options_.max_concurrent;
  admission_ = std::make_unique<Admission>(a);
}

grpc::Status GatewayService::CheckAuth(const grpc::CallbackServerContext* context) const {
  if (options_.auth_token.empty()) return grpc::Status::OK;
  const auto& md = context->client_metadata();
  auto it = md.find("authorization");
  const std::string want = "Bearer " + options_.auth_token;
  // Compared in constant time (OpenSSL's CRYPTO_memcmp), so how long a wrong token takes to be
  // refused says nothing of how much of it was right; only its length shows.
  const bool match = it != md.end() && it->second.size() == want.size() &&
                     CRYPTO_memcmp(it->second.data(), want.data(), want.size()) == 0;
  if (!match) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'");
  }
  return grpc::Status::OK;
}

grpc::Status GatewayService::HoldRoom(Admission::Hold* hold) {
  *hold = admission_->TryHold();
  if (*hold) return grpc::Status::OK;
  metrics_->rejected->Increment();
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("the gateway has ", options_.max_concurrent,
                                   " requests admitted, queued or being routed, its limit "
                                   "(--max_concurrent); retry later"));
}

uint64_t GatewayService::Admit(std::vector<Scored> ranked,
                               std::chrono::system_clock::time_point deadline,
                               Admission::Callback done) {
  const auto asked = std::chrono::steady_clock::now();
  return admission_->Acquire(
      std::move(ranked), absl::FromChrono(deadline),
      [this, asked, done = std::move(done)](absl::StatusOr<Grant> g) {
        metrics_->queue_wait->Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count());
        if (absl::IsResourceExhausted(g.status())) metrics_->rejected->Increment();
        done(std::move(g));
      });
}

TurnParams GatewayService::NewTurnParams(const Prompt& prompt, std::string request_id,
                                         const grpc::CallbackServerContext* context) {
  TurnParams p;
  p.request_id = std::move(request_id);
  p.request = ToWorkerRequest(prompt, p.request_id, options_.limits.model_name);
  p.stop = prompt.stop;
  p.deadline = DeadlineFor(context);
  p.max_attempts = options_.max_attempts;
  p.resume_mid_stream = options_.resume_mid_stream;
  p.admission = admission_.get();
  p.recent = &recent_;
  return p;
}

std::string GatewayService::NewRequestId() {
  static const uint64_t salt = std::random_device{}();
  return absl::StrCat("req-", absl::Hex(salt & 0xffffff), "-", next_id_.fetch_add(1));
}

std::chrono::system_clock::time_point GatewayService::DeadlineFor(
    const grpc::CallbackServerContext* c) const {
  auto fallback =
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.request_timeout);
  auto d = c->deadline();
  return d < fallback ? d : fallback;
}

bool GatewayService::RegistryAllow() {
  if (registry_breaker_.Allow()) return true;
  metrics_->registry_skipped->Increment();
  return false;
}

void GatewayService::RegistryDone(const absl::Status& status) {
  // The registry's fault, not the request's: it is unreachable, slow or failing.
  const bool failed = absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
                      absl::IsResourceExhausted(status) || absl::IsInternal(status) ||
                      absl::IsUnknown(status);
  registry_breaker_.Record(failed, failed ? status.ToString() : "");
}

void GatewayService::Route(const Prompt& prompt, std::string sticky,
                           cascade::v2::WorkerServiceGenerateRequest* request, RouteDone done) {
  const int64_t num_tokens = prompt.num_tokens;
  if (registry_ == nullptr || !RegistryAllow()) {
    std::move(done)(Rank(nullptr, num_tokens, sticky, request));
    return;
  }
  const std::vector<hash::ChunkSpec> specs = ChunkSpecs(prompt);
  registry_->ResolveAsync(
      registry::ResolveInput{options_.limits.model_name, prompt.cache_salt, specs},
      [this, num_tokens, sticky = std::move(sticky), request,
       done = std::move(done)](absl::StatusOr<registry::ResolveResult> r) mutable {
        RegistryDone(r.status());
        std::move(done)(Rank(&r, num_tokens, sticky, request));
      });
}

std::vector<Scored> GatewayService::Rank(const absl::StatusOr<registry::ResolveResult>* r,
                                         int64_t num_tokens, const std::string& sticky,
                                         cascade::v2::WorkerServiceGenerateRequest* request) {
  std::vector<Candidate> cands;
  bool resolved = false;
  if (r != nullptr) {
    if (r->ok()) {
      resolved = true;
      // The registry hashed the chain; the worker checks these instead of trusting them blind
      // and keeps its own pass for its cache (worker_service.cc).
      if (request != nullptr &&
          (*r)->chunks.size() == static_cast<size_t>(request->chunks_size())) {
        for (size_t i = 0; i < (*r)->chunks.size(); ++i) {
          request->mutable_chunks(static_cast<int>(i))->set_hash((*r)->chunks[i].hash.ToHex());
        }
      }
      for (const registry::WorkerMatch& m : (*r)->workers) {
        Candidate c{m.worker_id,
                    m.address,
                    m.matched_tokens,
                    m.load.running,
                    m.load.waiting,
                    m.load.free_kv_blocks,
                    m.load.total_kv_blocks,
                    pool_->Inflight(m.address),
                    m.matched_host_tokens,
                    m.kv_numerics,
                    m.block_size};
        cands.push_back(c);
      }
      pool_->Remember(cands);
      std::vector<RoutedChunk> chunks;
      chunks.reserve((*r)->chunks.size());
      for (const registry::ResolvedChunk& c : (*r)->chunks) chunks.push_back({c.hash, c.end});
      recent_.Apply(chunks, RecentRoutes::NowMs(), &cands);
    } else {
      metrics_->registry_errors->Increment();
      common::LogWarn("registry_resolve_failed",
                      {{"error", r->status().ToString()}, {"routing", "load-only"}});
    }
  }
  if (!resolved || cands.empty()) cands = pool_->KnownWorkers();
  std::vector<Scored> ranked = RankWorkers(cands, num_tokens, options_.weights,
                                           route_ticket_.fetch_add(1, std::memory_order_relaxed));
  if (common::LogEnabled(common::LogLevel::kDebug)) {
    for (const Scored& s : ranked) {
      common::LogDebug("route_candidate", {{"worker", s.candidate.worker_id},
                                           {"matched_tokens", s.candidate.matched_tokens},
                                           {"routed_tokens", s.candidate.routed_tokens},
                                           {"running", s.candidate.running},
                                           {"waiting", s.candidate.waiting},
                                           {"inflight", s.candidate.inflight},
                                           {"cost", s.cost},
                                           {"registry", resolved}});
    }
  }
  if (!sticky.empty()) {
    auto it = std::find_if(ranked.begin(), ranked.end(),
                           [&](const Scored& s) { return s.candidate.address == sticky; });
    // Stay with the session's worker (its prefix cache has the conversation) unless overloaded.
    if (it != ranked.end() && it->candidate.waiting < options_.weights.max_waiting) {
      std::rotate(ranked.begin(), it, it + 1);
    }
  }
  return ranked;
}

grpc::ServerUnaryReactor* GatewayService::Tokenize(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  auto* reactor = context->DefaultReactor();
  grpc::Status st = CheckAuth(context);
  absl::StatusOr<cascade::v2::TokenizeRequest> req =
      ParseRawRequest<cascade::v2::TokenizeRequest>(*request, max_request_bytes());
  if (st.ok()) st = ToGrpc(req.status());
  cascade::v2::TokenizeResponse out;
  if (st.ok()) st = DoTokenize(*req, &out);
  if (st.ok()) SerializeToByteBuffer(out, response);
  reactor->Finish(st);
  return reactor;
}

grpc::Status GatewayService::DoTokenize(const cascade::v2::TokenizeRequest& r,
                                        cascade::v2::TokenizeResponse* response) {
  const cascade::v2::TokenizeRequest* request = &r;
  if (absl::Status s = CheckModel(request->model(), options_.limits); !s.ok()) return ToGrpc(s);
  if (request->chunks_size() == 0) {
    if (static_cast<int64_t>(request->text().size()) > options_.limits.max_prompt_bytes) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "text is too large");
    }
    auto ids = tokenizer_->Encode(request->text());
    if (!ids.ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("text: ", ids.status().message()));
    }
    response->mutable_token_ids()->Assign(ids->begin(), ids->end());
    return grpc::Status::OK;
  }
  cascade::v2::SamplingParams none;
  none.set_max_tokens(1);
  auto p = BuildPrompt(request->chunks(), none, "",
                       !request->has_add_generation_prompt() || request->add_generation_prompt(),
                       *tokenizer_, options_.limits,
                       !request->has_enable_thinking() || request->enable_thinking());
  if (!p.ok()) return ToGrpc(p.status());
  auto placed = hash::PlaceChunks(options_.limits.model_name, "", ChunkSpecs(*p));
  for (size_t i = 0; i < p->chunks.size(); ++i) {
    response->mutable_token_ids()->Add(p->chunks[i].tokens.begin(), p->chunks[i].tokens.end());
    auto* ci = response->add_chunks();
    ci->set_hash(placed[i].hash.ToHex());
    ci->set_start(placed[i].start);
    ci->set_end(placed[i].end);
    ci->set_kind(static_cast<cascade::v2::ChunkKind>(p->chunks[i].kind));
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* GatewayService::ListModels(grpc::CallbackServerContext* context,
                                                     const cascade::v2::ListModelsRequest*,
                                                     cascade::v2::ListModelsResponse* response) {
  auto* reactor = context->DefaultReactor();
  grpc::Status auth = CheckAuth(context);
  if (!auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  auto* m = response->add_models();
  m->set_name(options_.limits.model_name);
  m->set_max_context(options_.limits.max_context);
  m->set_vocab_size(tokenizer_->vocab_size());
  // Live workers: ask the registry (a one-token resolve lists every live worker of the model)
  // so the count is right before the first request; without it, the workers last seen.
  if (registry_ != nullptr && RegistryAllow()) {
    const std::vector<int32_t> probe = {0};
    const std::vector<hash::ChunkSpec> specs = {{cascade::v2::CHUNK_KIND_RAW, probe, ""}};
    registry_->ResolveAsync(
        {options_.limits.model_name, "", specs},
        [this, reactor, m](absl::StatusOr<registry::ResolveResult> r) {
          RegistryDone(r.status());
          if (r.ok()) {
            std::vector<Candidate> live;
            for (const registry::WorkerMatch& w : r->workers) {
              live.push_back(Candidate{w.worker_id, w.address, 0, w.load.running, w.load.waiting,
                                       w.load.free_kv_blocks, w.load.total_kv_blocks, 0, 0,
                                       w.kv_numerics, w.block_size});
            }
            pool_->Remember(live);
          }
          m->set_workers(static_cast<int32_t>(pool_->KnownWorkers().size()));
          reactor->Finish(grpc::Status::OK);
        });
    return reactor;
  }
  m->set_workers(static_cast<int32_t>(pool_->KnownWorkers().size()));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace cascade::gateway
