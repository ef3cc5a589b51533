// The FetchKv reactor; see kv_serve.h. The engine answers export batches on its thread; the
// reactor writes one message at a time. Lifetime: the reactor is deleted by the last of OnDone
// and an export answer in flight.
#include "gpu_worker/service/kv_serve.h"

#include <chrono>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "gpu_worker/service/kv_transfer.h"

namespace cascade::worker {
namespace {

using cascade::v2::FetchKvResponse;

class FetchKvReactor final : public grpc::ServerWriteReactor<FetchKvResponse> {
 public:
  FetchKvReactor(engine::EngineLoop* loop, std::vector<hash::Hash128> keys, FetchFaults faults)
      : loop_(loop), keys_(std::move(keys)), faults_(faults), t0_(Clock::now()) {}

  void Begin() {
    MutexLock lock(&mu_);
    RequestBatchLocked();
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      broken_ = true;  // the peer is gone; OnCancel follows
    }
    MaybeWriteLocked();
  }

  void OnCancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
    MaybeWriteLocked();
  }

  void OnDone() override {
    bool release;
    {
      MutexLock lock(&mu_);
      done_ = true;
      if (common::LogEnabled(common::LogLevel::kDebug)) {
        common::LogDebug("fetch_kv_served", {{"blocks", sent_},
                                             {"ms", MsSince(t0_)},
                                             {"batches", batches_},
                                             {"export_wait_ms", export_wait_ms_}});
      }
      release = !exporting_;
    }
    if (release) delete this;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double MsSince(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }

  void RequestBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    exporting_ = true;
    asked_at_ = Clock::now();
    std::vector<hash::Hash128> rest(keys_.begin() + asked_, keys_.end());
    loop_->engine().ExportBlocks(std::move(rest), kFetchBatchBytes,
                                 [this](engine::ExportBatch b) { OnBatch(std::move(b)); });
    loop_->Wake();
  }

  // On the engine thread.
  void OnBatch(engine::ExportBatch b) {
    bool del = false;
    {
      MutexLock lock(&mu_);
      exporting_ = false;
      ++batches_;
      export_wait_ms_ += MsSince(asked_at_);
      if (done_) {
        del = true;
      } else if (!b.status.ok()) {
        error_ = common::ToGrpc(b.status);
        end_ = true;
      } else {
        if (!header_sent_) {
          header_sent_ = true;
          total_ = b.held;
          FetchKvResponse m;
          m.mutable_header()->set_blocks(total_);
          m.mutable_header()->set_block_bytes(loop_->engine().backend().KvBlockBytes());
          queue_.push_back(std::move(m));
        }
        for (engine::ExportedBlock& x : b.blocks) Push(std::move(x));
        if (b.blocks.empty() || asked_ >= total_) end_ = true;
      }
      if (!del) MaybeWriteLocked();
    }
    if (del) delete this;
  }

  void Push(engine::ExportedBlock x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t i = asked_++;
    FetchKvResponse m;
    cascade::v2::FetchKvBlock* blk = m.mutable_block();
    blk->set_index(i);
    blk->set_crc32c(BlockChecksum(x.key, std::as_bytes(std::span(x.bytes))));
    blk->set_key((i == faults_.wrong_key_block && i + 1 < static_cast<int64_t>(keys_.size())
                      ? keys_[i + 1]
                      : x.key)
                     .ToHex());
    if (i == faults_.corrupt_block) x.bytes[x.bytes.size() / 3] ^= 0x01;
    queued_bytes_ += static_cast<int64_t>(x.bytes.size());
    *blk->mutable_data() = std::move(x.bytes);
    queue_.push_back(std::move(m));
  }

  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_called_ || done_) return;
    if (cancelled_ || broken_) {
      if (!writing_) Finish(grpc::Status::CANCELLED);  // the answer in flight is dropped
      finish_called_ = !writing_;
      return;
    }
    if (writing_) return;
    const bool stalled = faults_.stall_after >= 0 && sent_ >= faults_.stall_after;
    const bool truncated = faults_.truncate_after >= 0 && sent_ >= faults_.truncate_after;
    if (!queue_.empty() && !stalled && !truncated) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      if (current_.has_block()) {
        ++sent_;
        queued_bytes_ -= static_cast<int64_t>(current_.block().data().size());
      }
      writing_ = true;
      StartWrite(&current_);
      // Keep the next batch coming while this one drains (two batches at most in memory).
      if (!exporting_ && !end_ && queued_bytes_ < kFetchBatchBytes) RequestBatchLocked();
      return;
    }
    if (stalled) return;  // until the peer gives up
    if (truncated || (end_ && queue_.empty() && !exporting_)) {
      finish_called_ = true;
      Finish(error_);
      return;
    }
    if (!exporting_ && !end_) RequestBatchLocked();
  }

  // Set at construction.
  engine::EngineLoop* const loop_;
  const std::vector<hash::Hash128> keys_;
  const FetchFaults faults_;
  const Clock::time_point t0_;

  Mutex mu_;
  Clock::time_point asked_at_ ABSL_GUARDED_BY(mu_);  // the export request with the engine
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  double export_wait_ms_ ABSL_GUARDED_BY(mu_) = 0;  // asked to answered, summed
  std::deque<FetchKvResponse> queue_ ABSL_GUARDED_BY(mu_);
  FetchKvResponse current_ ABSL_GUARDED_BY(mu_);
  grpc::Status error_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;  // blocks announced
  int64_t asked_ ABSL_GUARDED_BY(mu_) = 0;  // blocks received from the engine
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;   // blocks written (or being written)
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool header_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool exporting_ ABSL_GUARDED_BY(mu_) = false;  // an export request is with the engine
  bool end_ ABSL_GUARDED_BY(mu_) = false;        // no more batches to ask for
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

class RefusedReactor final : public grpc::ServerWriteReactor<FetchKvResponse> {
 public:
  explicit RefusedReactor(grpc::Status st) { Finish(st); }
  void OnDone() override { delete this; }
};

grpc::Status Check(engine::Engine& engine, const cascade::v2::FetchKvRequest& r,
                   std::vector<hash::Hash128>* keys) {
  const auto bad = [](grpc::StatusCode code, std::string msg) { return grpc::Status(code, msg); };
  if (r.model() != engine.options().model_name) {
    return bad(grpc::StatusCode::FAILED_PRECONDITION,
               absl::StrCat("model: this worker serves '", engine.options().model_name, "'"));
  }
  engine::Backend& backend = engine.backend();
  if (r.backend() != backend.KvNumerics() || r.block_bytes() != backend.KvBlockBytes() ||
      r.block_size() != backend.BlockSize() || backend.KvBlockBytes() <= 0) {
    return bad(grpc::StatusCode::FAILED_PRECONDITION,
               absl::StrCat("KV layout: this worker's blocks are ", backend.KvNumerics(), ", ",
                            backend.BlockSize(), " tokens, ", backend.KvBlockBytes(),
                            " bytes; the request's ", common::Excerpt(r.backend()), ", ",
                            r.block_size(), ", ", r.block_bytes()));
  }
  if (r.block_keys_size() == 0 || r.block_keys_size() > kMaxFetchBlocks) {
    return bad(grpc::StatusCode::INVALID_ARGUMENT,
               absl::StrCat("block_keys: between 1 and ", kMaxFetchBlocks, " keys, got ",
                            r.block_keys_size()));
  }
  for (int i = 0; i < r.block_keys_size(); ++i) {
    std::optional<hash::Hash128> k = hash::Hash128::FromHex(r.block_keys(i));
    if (!k) {
      return bad(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("block_keys[", i, "] is not 32 hex characters"));
    }
    keys->push_back(*k);
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::ServerWriteReactor<FetchKvResponse>* StartFetchKv(engine::EngineLoop* loop,
                                                        const cascade::v2::FetchKvRequest& request,
                                                        FetchFaults faults) {
  std::vector<hash::Hash128> keys;
  if (grpc::Status st = Check(loop->engine(), request, &keys); !st.ok()) {
    return new RefusedReactor(st);
  }
  auto* r = new FetchKvReactor(loop, std::move(keys), faults);
  r->Begin();
  return r;
}

}  // namespace cascade::worker
