// Kernel harness for batch-invariant GEMMs (gemm.h) on the projection shapes of the benchmark
// presets: the pinned cuBLASLt algorithm unsplit and with k cut into S = 2, 4, 8 slices (a
// strided-batched call, partials summed in slice order), SmallGemm's split partials, and
// cuBLASLt's heuristics (unpinned: the cost of determinism).
//
// Bitwise, per shape and S, on fresh random data: "inv" counts the m in {1..8, 13, 16, 64, 256}
// whose partial products are bitwise the rows of the same inputs computed in a 1024-row call
// (row invariance of the pinned call); "small" counts the m <= 16 whose SmallGemm partials are
// bitwise those rows too (the small path equals the cuBLAS path).
// Timing: us per call (median of 15 event-timed replays of one CUDA graph of >= 10 back-to-back
// calls, so no host launch cost, as in decode graphs; weights rotated over >= 200 MB of copies
// so they come from HBM, not L2; the H100 run of NOTES.md run 8 timed eager launches instead,
// which made every cuBLASLt call at small m cost its ~8 us of host work): Run() (bf16 out; S > 1
// includes the SplitReduce pass), and for S > 1 also RunPartials() alone ("partials": what o_proj /
// down_proj cost, their sum being fused into the next norm), at m = 1 .. 2048; floor = weight bytes
// / 3.35 TB/s (H100; 4.2 on an H200). Option (a) probe: cuBLASLt's own split-K
// (CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 4, reduction in the compute type) on the pinned unsplit
// algorithm: supported? rows at m = 1 equal to m = 256?
// Per projection shape also "decode sweep" (DecodeGemm's CTA shapes at m = 1 / 16 / 64) and
// "decode split sweep" (DecodeGemm with k in S = 1, 2, 4, 8 slices at m = 1 / 8 / 64: the partials
// alone at 8, 16 and 32 features a CTA, p c8 / c16 / c32, and the fastest with SplitReduce's
// ordered sum, +r): what cutting a projection's k chain is worth
// at decode sizes (bench/engine/NOTES.md, the k-sliced design).
//   cuda_gemm_bench [--quick] [--preset=NAME (only that preset's shapes: qwen3-0.6b,
//                                 llama-3.2-1b or qwen3-8b)]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/kernels/check_ok.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/gemm.h"
#include "gpu_worker/backend/cuda/ops.h"
#include "gpu_worker/model/config.h"

namespace cascade::cuda {
namespace {

DeviceBuffer Alloc(size_t bytes) {
  auto b = DeviceBuffer::Allocate(bytes);
  CHECK_OK(b.status());
  return std::move(*b);
}

uint16_t Bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

DeviceBuffer RandomBf16(size_t n, std::mt19937* rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = Bf(d(*rng));
  DeviceBuffer b = Alloc(n * 2);
  CHECK_OK(CopyToDevice(b.data(), h.data(), n * 2));
  return b;
}

// Calls per timed sample: captured back to back in one CUDA graph (at least 10, and one per
// weight copy), so host launch costs are out of the numbers as in the engine's decode graphs.
constexpr int kBackToBack = 10;

// Median us per call of fn(i, stream), i = 0 .. calls - 1, over 15 replays of a graph of all
// `calls` calls (first run eagerly, outside the capture, so lookups and first-use work are done).
template <typename F>
double MedianUs(int calls, F fn) {
  static cudaStream_t s = [] {
    cudaStream_t t;
    CHECK_OK(CudaStatus(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), "stream"));
    return t;
  }();
  for (int i = 0; i < 2; ++i) fn(i, s);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_OK(CudaStatus(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture"));
  for (int i = 0; i < calls; ++i) fn(i, s);
  CHECK_OK(CudaStatus(cudaStreamEndCapture(s, &graph), "end capture"));
  CHECK_OK(CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "instantiate"));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  CHECK_OK(CudaStatus(cudaGraphLaunch(exec, s), "warm-up replay"));
  std::vector<double> t;
  for (int i = 0; i < 15; ++i) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(exec, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1e3 / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  CHECK_OK(CudaStatus(cudaGetLastError(), "timing"));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<uint8_t> Host(const void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  CHECK_OK(Synchronize(nullptr));
  CHECK_OK(CopyToHost(h.data(), p, bytes));
  return h;
}

struct Shape {
  std::string name;
  int n, k;
};

// Option (a): the pinned unsplit algorithm with cuBLASLt's own split-K. Returns a table cell.
std::string ProbeLtSplitK(int n, int k, const Bf16* x, const Bf16* w) {
  cublasLtHandle_t h;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) return "no handle";
  DeviceBuffer ws = Alloc(64 << 20);
  auto layouts = [&](int m, cublasLtMatmulDesc_t* desc, cublasLtMatrixLayout_t* a,
                     cublasLtMatrixLayout_t* b, cublasLtMatrixLayout_t* c) {
    cublasLtMatmulDescCreate(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cublasLtMatrixLayoutCreate(a, CUDA_R_16BF, k, n, k);
    cublasLtMatrixLayoutCreate(b, CUDA_R_16BF, k, m, k);
    cublasLtMatrixLayoutCreate(c, CUDA_R_32F, n, m, n);
  };
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;
  layouts(256, &desc, &a, &b, &c);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  const uint64_t wsb = 64 << 20;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                       sizeof(wsb));
  const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                       sizeof(mask));
  cublasLtMatmulHeuristicResult_t r[1];
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, c, pref, 1, r, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  std::string cell;
  if (found == 0) {
    cell = "no algo";
  } else {
    cublasLtMatmulAlgo_t algo = r[0].algo;
    int32_t splitk_cap = 0, algo_id = 0;
    uint32_t schemes = 0;
    size_t got = 0;
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_cap,
                                      sizeof(splitk_cap), &got);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes,
                                      sizeof(schemes), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof(algo_id),
                                         &got);
    cell = "algo " + std::to_string(algo_id) + ", splitK cap " + std::to_string(splitk_cap) +
           ", schemes 0x" + [&] {
             char s[16];
             std::snprintf(s, sizeof(s), "%x", schemes);
             return std::string(s);
           }();
    const int32_t four = 4;
    const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &four,
                                         sizeof(four));
    cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                         sizeof(scheme));
    std::vector<std::vector<uint8_t>> rows;
    for (int m : {256, 1}) {
      cublasLtMatmulDesc_t d2;
      cublasLtMatrixLayout_t a2, b2, c2;
      layouts(m, &d2, &a2, &b2, &c2);
      cublasLtMatmulHeuristicResult_t chk;
      DeviceBuffer y = Alloc(static_cast<size_t>(m) * n * 4);
      const float alpha = 1.f, beta = 0.f;
      cublasStatus_t st = cublasLtMatmulAlgoCheck(h, d2, a2, b2, c2, c2, &algo, &chk);
      if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatmul(h, d2, &alpha, w, a2, x, b2, &beta, y.data(), c2, y.data(), c2, &algo,
                            ws.data(), wsb, nullptr);
      }
      if (st != CUBLAS_STATUS_SUCCESS) {
        cell += std::string("; m=") + std::to_string(m) + " rejected (" +
                cublasGetStatusString(st) + ")";
      } else {
        rows.push_back(Host(y.data(), static_cast<size_t>(n) * 4));  // row 0
      }
      cublasLtMatmulDescDestroy(d2);
      cublasLtMatrixLayoutDestroy(a2);
      cublasLtMatrixLayoutDestroy(b2);
      cublasLtMatrixLayoutDestroy(c2);
    }
    if (rows.size() == 2) cell += rows[0] == rows[1] ? "; row m=1 == m=256" : "; row m=1 DIFFERS";
  }
  cublasLtMatmulDescDestroy(desc);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtDestroy(h);
  return cell;
}

// DecodeGemm (ops.h) on an unsplit shape: "inv" counts the m in 1..64 whose bf16 rows are bitwise
// the pinned kRefM-row call's (want: that call's f32 partial = its f32 product, so bf16 rows are
// compared against a bf16 call made here); then us per call at the built-in CTA shape and, at
// m = 1 / 16 / 64, per (features per CTA, stages).
template <typename RowFn, typename FmtFn>
void DecodeRows(const Shape& s, const DeviceBuffer& x, const std::vector<DeviceBuffer>& ws,
                int calls, const std::vector<uint8_t>& want_f32, const std::vector<int>& time_ms,
                RowFn row, FmtFn fmt) {
  const int copies = static_cast<int>(ws.size());
  const std::vector<int> check = {1, 2, 3, 5, 8, 13, 16, 17, 24, 31, 32, 33, 48, 63, 64};
  DeviceBuffer y = Alloc(static_cast<size_t>(64) * s.n * 4);
  int same = 0;
  std::string err;
  for (int m : check) {
    const size_t cnt = static_cast<size_t>(m) * s.n;
    CHECK_OK(FillBytes(y.data(), 0xff, cnt * 4));
    const absl::Status st =
        DecodeGemm(x.as<Bf16>(), ws[0].as<Bf16>(), m, s.n, s.k, y.data(), true, nullptr);
    if (!st.ok()) {
      err = std::string(st.message());
      break;
    }
    same += Host(y.data(), cnt * 4) ==
            std::vector<uint8_t>(want_f32.begin(), want_f32.begin() + cnt * 4);
  }
  if (!err.empty()) {
    row("decode", err, "", {});
    return;
  }
  std::vector<std::string> cells;
  for (int m : time_ms) {
    cells.push_back(m > 64 ? "-" : fmt(MedianUs(calls, [&](int i, cudaStream_t st) {
      CHECK_OK(
          DecodeGemm(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, y.data(), false, st));
    })));
  }
  row("decode (f32 rows == pinned: inv)", std::to_string(same) + "/" + std::to_string(check.size()),
      "", cells);
  std::string sweep;
  for (int m : {1, 16, 64}) {
    for (int cols : {8, 16, 32}) {
      for (int stages : {4, 8, 16}) {
        if (s.n % cols != 0) continue;
        bool ok = true;
        const double us = MedianUs(calls, [&](int i, cudaStream_t st) {
          ok = ok && DecodeGemm(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, y.data(),
                                false, st, cols, stages)
                         .ok();
        });
        if (ok)
          sweep += " m" + std::to_string(m) + "/c" + std::to_string(cols) + "/s" +
                   std::to_string(stages) + " " + fmt(us);
      }
    }
  }
  std::printf("  decode sweep %s:%s\n", s.name.c_str(), sweep.c_str());
  // k cut into S slices on DecodeGemm (grid.y = slice): the S f32 partials alone at each CTA
  // shape of 8, 16 and 32 features ("p c8 / c16 / c32": what a kernel summing its slices in itself
  // would cost at most, its chains k / S / 16 k16 steps long; more features a CTA keep the grid at
  // ~128 CTAs as S grows, where the built-in shape multiplies it by S) and the fastest of them with
  // SplitReduce's ordered sum to bf16 after it ("+r", today's split path), at decode-sized m: how
  // much of a projection's time its k chain is (bench/engine/NOTES.md, the k-sliced design).
  if (s.n >= 65536) return;  // (the LM heads: not a projection the design cuts)
  std::string split;
  DeviceBuffer parts = Alloc(static_cast<size_t>(8) * 64 * s.n * 4);
  for (int m : {1, 8, 64}) {
    for (int S : {1, 2, 4, 8}) {
      if (s.k % (128 * S) != 0) continue;
      std::string cell;
      double best_us = 0;
      int best_cols = 0;
      for (int cols : {8, 16, 32}) {
        if (s.n % cols != 0) continue;
        bool ok = true;
        const double us = MedianUs(calls, [&](int i, cudaStream_t st) {
          ok = ok && DecodeGemm(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, parts.data(),
                                true, st, cols, 0, S)
                         .ok();
        });
        if (!ok) continue;
        cell += " c" + std::to_string(cols) + " " + fmt(us);
        if (best_cols == 0 || us < best_us) best_us = us, best_cols = cols;
      }
      if (best_cols == 0) continue;
      bool ok = true;
      const double r_us = MedianUs(calls, [&](int i, cudaStream_t st) {
        ok = ok &&
             DecodeGemm(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, parts.data(), true,
                        st, best_cols, 0, S)
                 .ok() &&
             SplitReduce(parts.as<float>(), S, m, s.n, y.data(), false, st).ok();
      });
      split += " m" + std::to_string(m) + "/S" + std::to_string(S) + " p" + cell +
               (ok ? " +r " + fmt(r_us) : std::string());
    }
  }
  std::printf("  decode split sweep %s:%s\n", s.name.c_str(), split.c_str());
}

int Main(bool quick, const std::string& only) {
  auto dev = DeviceName(0);
  std::printf("# cuda_gemm_bench on %s\n\n", dev.ok() ? dev->c_str() : "?");
  std::vector<Shape> shapes;
  const std::vector<std::string> presets = {"qwen3-0.6b", "llama-3.2-1b", "qwen3-8b"};
  if (!only.empty() && std::find(presets.begin(), presets.end(), only) == presets.end()) {
    std::fprintf(stderr, "--preset=%s: not one of qwen3-0.6b, llama-3.2-1b, qwen3-8b\n",
                 only.c_str());
    return 2;
  }
  for (const std::string& preset : presets) {
    if (!only.empty() && only != preset) continue;
    const model::ModelConfig c = model::PresetConfig(preset);
    const int h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
              hkv = c.num_key_value_heads, in = c.intermediate_size;
    const std::string p = preset + " ";
    shapes.push_back({p + "qkv", (hq + 2 * hkv) * d, h});
    shapes.push_back({p + "o", h, hq * d});
    shapes.push_back({p + "gate_up", 2 * in, h});
    shapes.push_back({p + "down", h, in});
    if (preset == "qwen3-0.6b")
      shapes.push_back({p + "lm_head", static_cast<int>(c.vocab_size), h});
  }
  const std::vector<int> time_ms = quick ? std::vector<int>{1, 8, 16, 32, 64, 256}
                                         : std::vector<int>{1, 4, 8, 16, 32, 64, 128, 256, 2048};
  std::vector<int> check_ms = {1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 64, 256};
  constexpr int kRefM = 1024;
  auto heuristic = Gemm::Create(/*batch_invariant=*/false, 256, false);
  CHECK_OK(heuristic.status());
  std::mt19937 rng(1);
  std::printf("| shape | n | k | floor us | variant | inv | small |");
  for (int m : time_ms) std::printf(" m=%d |", m);
  std::printf("\n|---|---:|---:|---:|---|---|---|");
  for (size_t i = 0; i < time_ms.size(); ++i) std::printf("---:|");
  std::printf("\n");
  std::vector<std::string> probes;
  for (const Shape& s : shapes) {
    const size_t wn = static_cast<size_t>(s.n) * s.k;
    const int copies = static_cast<int>(std::max<size_t>(4, (200u << 20) / (wn * 2) + 1));
    const int calls = std::max(kBackToBack, copies);
    std::vector<DeviceBuffer> ws;
    ws.push_back(RandomBf16(wn, &rng, 1.f / std::sqrt(s.k)));
    for (int i = 1; i < copies; ++i) {  // same values, other addresses
      ws.push_back(Alloc(wn * 2));
      CHECK_OK(CudaStatus(
          cudaMemcpy(ws.back().data(), ws[0].data(), wn * 2, cudaMemcpyDeviceToDevice), "copy"));
    }
    const int max_m = std::max(kRefM, time_ms.back());
    DeviceBuffer x = RandomBf16(static_cast<size_t>(max_m) * s.k, &rng, 1.f);
    const double floor_us = wn * 2 / 3.35e12 * 1e6;
    auto row = [&](const std::string& variant, const std::string& inv, const std::string& small,
                   const std::vector<std::string>& cells) {
      std::printf("| %s | %d | %d | %.1f | %s | %s | %s |", s.name.c_str(), s.n, s.k, floor_us,
                  variant.c_str(), inv.c_str(), small.c_str());
      for (const std::string& c : cells) std::printf(" %s |", c.c_str());
      std::printf("\n");
      std::fflush(stdout);
    };
    auto fmt = [](double us) {
      char b[32];
      std::snprintf(b, sizeof(b), "%.1f", us);
      return std::string(b);
    };
    DeviceBuffer y = Alloc(static_cast<size_t>(max_m) * s.n * 2);
    {
      std::vector<std::string> cells;
      for (int m : time_ms) {
        cells.push_back(fmt(MedianUs(calls, [&](int i, cudaStream_t st) {
          CHECK_OK((*heuristic)
                       ->Run(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, y.data(),
                             GemmOut::kBf16, st));
        })));
      }
      row("heuristic", "-", "-", cells);
    }
    for (int S : {1, 2, 4, 8}) {
      if (s.k % (64 * S) != 0) continue;
      auto gemm = Gemm::Create(/*batch_invariant=*/true, 256, /*small_m=*/false, S == 1 ? 1 : S);
      CHECK_OK(gemm.status());
      Gemm& g = **gemm;
      if (g.Splits(s.n, s.k) != S) {
        row("pinned S=" + std::to_string(S), "no batched algorithm", "-", {});
        continue;
      }
      // Bitwise: partials of m rows vs the same rows of a kRefM-row call.
      const size_t ref_count = static_cast<size_t>(kRefM) * s.n;
      DeviceBuffer pref = Alloc(S * ref_count * 4), p = Alloc(S * ref_count * 4);
      CHECK_OK(g.RunPartials(x.as<Bf16>(), ws[0].as<Bf16>(), kRefM, s.n, s.k, pref.as<float>(),
                             nullptr));
      const std::vector<uint8_t> want = Host(pref.data(), S * ref_count * 4);
      int inv = 0, small = 0, small_total = 0;
      for (int m : check_ms) {
        const size_t cnt = static_cast<size_t>(m) * s.n;
        auto same = [&]() {
          const std::vector<uint8_t> got = Host(p.data(), S * cnt * 4);
          for (int j = 0; j < S; ++j) {
            if (std::memcmp(got.data() + j * cnt * 4, want.data() + j * ref_count * 4, cnt * 4))
              return false;
          }
          return true;
        };
        CHECK_OK(FillBytes(p.data(), 0xff, S * cnt * 4));
        CHECK_OK(
            g.RunPartials(x.as<Bf16>(), ws[0].as<Bf16>(), m, s.n, s.k, p.as<float>(), nullptr));
        inv += same();
        if (m <= 16) {
          ++small_total;
          CHECK_OK(FillBytes(p.data(), 0xff, S * cnt * 4));
          CHECK_OK(
              SmallGemm(x.as<Bf16>(), ws[0].as<Bf16>(), m, s.n, s.k, p.data(), true, nullptr, S));
          small += same();
        }
      }
      const std::string inv_s = std::to_string(inv) + "/" + std::to_string(check_ms.size());
      const std::string small_s = std::to_string(small) + "/" + std::to_string(small_total);
      std::vector<std::string> run_cells, part_cells, small_cells;
      DeviceBuffer pt = Alloc(S * static_cast<size_t>(time_ms.back()) * s.n * 4);
      for (int m : time_ms) {
        run_cells.push_back(fmt(MedianUs(calls, [&](int i, cudaStream_t st) {
          CHECK_OK(g.Run(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, y.data(),
                         GemmOut::kBf16, st));
        })));
        if (S > 1) {
          part_cells.push_back(fmt(MedianUs(calls, [&](int i, cudaStream_t st) {
            CHECK_OK(g.RunPartials(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k,
                                   pt.as<float>(), st));
          })));
        }
        small_cells.push_back(m > 16 ? "-" : fmt(MedianUs(calls, [&](int i, cudaStream_t st) {
          CHECK_OK(SmallGemm(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, pt.data(),
                             /*f32_out=*/true, st, S));
        })));
      }
      const std::string sn = "S=" + std::to_string(S);
      row("pinned " + sn + (S > 1 ? " + reduce" : ""), inv_s, small_s, run_cells);
      if (S > 1) row("pinned " + sn + " partials", "", "", part_cells);
      row("small " + sn + (S > 1 ? " partials" : " f32"), "", "", small_cells);
      if (S == 1 && s.k % 128 == 0) DecodeRows(s, x, ws, calls, want, time_ms, row, fmt);
    }
    if (!quick && s.k % 256 == 0) {
      probes.push_back("| " + s.name + " | " +
                       ProbeLtSplitK(s.n, s.k, x.as<Bf16>(), ws[0].as<Bf16>()) + " |");
    }
  }
  std::printf(
      "\n## Option (a): cuBLASLt split-K (4, compute-type reduction) on the pinned algo\n\n");
  std::printf("| shape | probe |\n|---|---|\n");
  for (const std::string& p : probes) std::printf("%s\n", p.c_str());
  return 0;
}

}  // namespace
}  // namespace cascade::cuda

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a.rfind("--preset=", 0) == 0) {
      only = a.substr(9);  // (Main checks it names one of its presets)
    } else {
      std::fprintf(
          stderr, "usage: cuda_gemm_bench [--quick] [--preset=qwen3-0.6b|llama-3.2-1b|qwen3-8b]\n");
      return 2;
    }
  }
  return cascade::cuda::Main(quick, only);
}
