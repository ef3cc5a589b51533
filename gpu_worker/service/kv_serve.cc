// The FetchKv reactor; see kv_serve.h. The engine answers export batches on its thread; the
// reactor writes one message at a time. Lifetime: the reactor is deleted by the last of OnDone
// and an export answer in flight.
#include "gpu_worker/service/kv_serve.h"

#include <chrono>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "gpu_worker/service/kv_transfer.h"

namespace cascade::worker {
namespace {

using cascade::v2::FetchKvResponse;

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// A message waiting to be written, and the block bytes it holds.
struct Outgoing {
  grpc::ByteBuffer buffer;
  int64_t data_bytes = 0;
  bool is_block = false;
};

class FetchKvReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
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
          const std::string bytes = m.SerializeAsString();
          grpc::Slice slice(bytes);
          queue_.push_back({grpc::ByteBuffer(&slice, 1), 0, false});
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
    const uint32_t crc = BlockChecksum(x.key, std::as_bytes(std::span(x.bytes)));
    std::string key =
        (i == faults_.wrong_key_block && i + 1 < static_cast<int64_t>(keys_.size()) ? keys_[i + 1]
                                                                                    : x.key)
            .ToHex();
    if (i == faults_.corrupt_block) x.bytes[x.bytes.size() / 3] ^= 0x01;
    const auto n = static_cast<int64_t>(x.bytes.size());
    queued_bytes_ += n;
    queue_.push_back({BlockMessage(i, std::move(key), crc, std::move(x.bytes)), n, true});
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
      Outgoing next = std::move(queue_.front());
      queue_.pop_front();
      if (next.is_block) {
        ++sent_;
        queued_bytes_ -= next.data_bytes;
      }
      current_ = std::move(next.buffer);
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
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_ ABSL_GUARDED_BY(mu_);  // being written
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

class RefusedReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
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
  if (r.backend() != backend.Name() || r.block_bytes() != backend.KvBlockBytes() ||
      r.block_size() != backend.BlockSize() || backend.KvBlockBytes() <= 0) {
    return bad(grpc::StatusCode::FAILED_PRECONDITION,
               absl::StrCat("KV layout: this worker's blocks are ", backend.Name(), ", ",
                            backend.BlockSize(), " tokens, ", backend.KvBlockBytes(),
                            " bytes; the request's ", r.backend().substr(0, 16), ", ",
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

grpc::ByteBuffer BlockMessage(int64_t index, std::string key_hex, uint32_t crc32c,
                              std::string data) {
  cascade::v2::FetchKvBlock small;  // every field but the data
  small.set_index(index);
  small.set_key(std::move(key_hex));
  small.set_crc32c(crc32c);
  const std::string fields = small.SerializeAsString();
  const size_t n = data.size();
  // FetchKvResponse.block (field 2, length-delimited) = the small fields, then data (field 3,
  // length-delimited) when not empty, as protobuf writes an empty bytes field: not at all.
  const size_t block_len = fields.size() + (n > 0 ? 1 + VarintSize(n) + n : 0);
  std::string head;
  head.reserve(fields.size() + 24);
  head.push_back(0x12);
  AppendVarint(block_len, &head);
  head += fields;
  if (n == 0) {
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  head.push_back(0x1a);
  AppendVarint(n, &head);
  auto* owned = new std::string(std::move(data));
  grpc::Slice slices[2] = {grpc::Slice(head),
                           grpc::Slice(
                               owned->data(), owned->size(),
                               [](void* p) { delete static_cast<std::string*>(p); }, owned)};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetchKv(engine::EngineLoop* loop,
                                                         const grpc::ByteBuffer& raw,
                                                         FetchFaults faults) {
  cascade::v2::FetchKvRequest request;
  {
    grpc::ByteBuffer copy(raw);  // shares the slices; parsing consumes the copy
    if (!grpc::SerializationTraits<cascade::v2::FetchKvRequest>::Deserialize(&copy, &request)
             .ok()) {
      return new RefusedReactor(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "FetchKvRequest does not parse"));
    }
  }
  std::vector<hash::Hash128> keys;
  if (grpc::Status st = Check(loop->engine(), request, &keys); !st.ok()) {
    return new RefusedReactor(st);
  }
  auto* r = new FetchKvReactor(loop, std::move(keys), faults);
  r->Begin();
  return r;
}

}  // namespace cascade::worker
