// The prefill attention form chosen at load by timing (attention.h TunePrefillForm).
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpu_worker/backend/cuda/attention.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/launchers.h"
#include "gpu_worker/backend/cuda/status_macros.h"

namespace cascade::cuda {
namespace {

template <class T>
absl::StatusOr<DeviceBuffer> Upload(const std::vector<T>& v) {
  ASSIGN_OR_RETURN(buf, DeviceBuffer::Allocate(std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty()) RETURN_IF_ERROR(CopyToDevice(buf.data(), v.data(), v.size() * sizeof(T)));
  return buf;
}

}  // namespace

absl::StatusOr<PrefillFormChoice> TunePrefillForm(const HeadShape& shape, int block_size,
                                                  int tokens, Stream stream) {
  PrefillFormChoice choice;
  choice.form = internal::PrefillForm();
  ASSIGN_OR_RETURN(wgmma, WgmmaPrefillAvailable());
  if (!wgmma || shape.head_dim != 128 || block_size <= 0 || block_size % 16 != 0 ||
      shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0 || tokens <= 0) {
    return choice;  // one form only: nothing to choose
  }
  const int hq = shape.num_q_heads, hkv = shape.num_kv_heads, d = shape.head_dim;
  // One sequence of `tokens` tokens from position 0 (a cold prompt), blocks 0, 1, ...
  const int blocks = (tokens + block_size - 1) / block_size;
  std::vector<int32_t> positions(tokens), ids(blocks);
  for (int i = 0; i < tokens; ++i) positions[i] = i;
  for (int i = 0; i < blocks; ++i) ids[i] = i;
  const std::vector<int32_t> query_start = {0, tokens}, context = {tokens}, table = {0, blocks};
  AttentionConfig config;
  config.num_q_heads = hq;
  config.num_kv_heads = hkv;
  config.head_dim = d;
  config.block_size = block_size;
  const AttentionBatch batch{
      positions.data(), tokens, query_start.data(), context.data(), table.data(), ids.data(), 1};
  AttentionPlan plan;
  RETURN_IF_ERROR(PlanAttention(config, batch, &plan));
  if (plan.num_split() != 0 || plan.num_final() == 0) {
    return absl::InternalError("TunePrefillForm: a cold prompt's plan has split items");
  }
  // Keys, values and queries of small equal values (bf16 0x3c3c, ~0.0115): the same work as any
  // data (the kernels' time does not depend on the values), no NaN or overflow.
  const size_t cache_bytes = static_cast<size_t>(blocks) * hkv * block_size * d * sizeof(Bf16);
  const size_t rows_bytes = static_cast<size_t>(tokens) * hq * d * sizeof(Bf16);
  ASSIGN_OR_RETURN(k, DeviceBuffer::Allocate(cache_bytes));
  ASSIGN_OR_RETURN(v, DeviceBuffer::Allocate(cache_bytes));
  ASSIGN_OR_RETURN(q, DeviceBuffer::Allocate(rows_bytes));
  ASSIGN_OR_RETURN(out, DeviceBuffer::Allocate(rows_bytes));
  RETURN_IF_ERROR(FillBytes(k.data(), 0x3c, cache_bytes));
  RETURN_IF_ERROR(FillBytes(v.data(), 0x3c, cache_bytes));
  RETURN_IF_ERROR(FillBytes(q.data(), 0x3c, rows_bytes));
  ASSIGN_OR_RETURN(pos, Upload(positions));
  ASSIGN_OR_RETURN(block_ids, Upload(ids));
  ASSIGN_OR_RETURN(final_items, Upload(plan.final_items));
  ASSIGN_OR_RETURN(item_rows, Upload(plan.item_rows));
  ASSIGN_OR_RETURN(partial_base, Upload(plan.partial_base));
  AttentionArgs args;
  args.q = q.as<Bf16>();
  args.q_row_stride = hq * d;
  args.cache = KvCacheView{k.as<Bf16>(), v.as<Bf16>(), blocks, block_size, hkv, d};
  args.positions = pos.as<int32_t>();
  args.block_ids = block_ids.as<int32_t>();
  args.out = out.as<Bf16>();
  args.scale = 1.f / std::sqrt(static_cast<float>(d));
  args.num_q_heads = hq;
  args.prefill_path = PrefillPath::kWgmma;
  AttentionPlanView view;
  view.final_items = final_items.as<int32_t>();
  view.num_final = plan.num_final();
  view.item_rows = item_rows.as<int32_t>();
  view.partial_base = partial_base.as<int32_t>();
  view.max_final_rows = plan.max_final_rows;

  // Rounds of kCalls calls per form, the forms alternating so that clock and thermal drift
  // touch both alike; each form's time is its median round.
  constexpr int kForms = 2, kRounds = 7, kCalls = 3;
  std::vector<float> rounds[kForms];
  StreamTimer timer;
  auto round = [&](int form, bool keep) -> absl::Status {
    internal::SetPrefillForm(form);
    RETURN_IF_ERROR(timer.Start(stream));
    for (int c = 0; c < kCalls; ++c) RETURN_IF_ERROR(Attention(args, view, stream));
    RETURN_IF_ERROR(timer.Stop(stream));
    ASSIGN_OR_RETURN(ms, timer.ElapsedMs());
    if (keep) rounds[form].push_back(ms * 1e3f / kCalls);
    return absl::OkStatus();
  };
  const int saved = internal::PrefillForm();
  absl::Status status;
  for (int r = -1; r < kRounds && status.ok(); ++r) {  // round -1: warm-up, not kept
    for (int form = 0; form < kForms && status.ok(); ++form) status = round(form, r >= 0);
  }
  internal::SetPrefillForm(saved);
  RETURN_IF_ERROR(status);
  for (int form = 0; form < kForms; ++form) {
    std::sort(rounds[form].begin(), rounds[form].end());
    choice.us[form] = rounds[form][rounds[form].size() / 2];
  }
  // Ping-pong only where it is clearly faster (1%): the two are often within noise.
  choice.form = choice.us[1] < 0.99 * choice.us[0] ? 1 : 0;
  choice.tuned = true;
  internal::SetPrefillForm(choice.form);
  return choice;
}

std::string PrefillFormChoice::Describe(int tokens) const {
  if (!tuned) return "prefill attention: one form (not timed)";
  return absl::StrFormat(
      "prefill attention: %s (%d-token prompt: warp-specialized %.1f us, ping-pong %.1f us)",
      form == 1 ? "ping-pong" : "warp-specialized", tokens, us[0], us[1]);
}

}  // namespace cascade::cuda
