// Kernel harness for decode-sized GEMMs: the pinned cuBLASLt algorithm (gemm.h, chosen at
// m = 256, split-K off) against SmallGemm (small_gemm.cu) on the projection shapes of the
// benchmark presets. For each shape: are SmallGemm's rows bitwise equal to the pinned GEMM's
// rows of the same inputs computed at m = 256 (the prefill case), for m = 1..16 on fresh random
// data; and the time of each at m = 1, 2, 4, 16 (median of 50 event-timed samples of 20
// back-to-back calls, weights rotated over >= 200 MB of copies so they come from HBM, not L2),
// against the weight-bytes floor (bytes / 4.2 TB/s).
//   cuda_gemm_bench
#include <cuda_runtime_api.h>

#include <algorithm>
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

// Launches per timed sample: back to back, so host launch gaps overlap the kernels.
constexpr int kBackToBack = 20;

template <typename F>
double MedianUs(F fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 5; ++i) fn(i);
  std::vector<double> t;
  for (int i = 0; i < 50; ++i) {
    cudaEventRecord(a);
    for (int j = 0; j < kBackToBack; ++j) fn(i * kBackToBack + j);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1e3 / kBackToBack);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Shape {
  std::string name;
  int n, k;
  bool f32;
};

int Main() {
  auto dev = DeviceName(0);
  std::printf("# cuda_gemm_bench on %s\n\n", dev.ok() ? dev->c_str() : "?");
  std::vector<Shape> shapes;
  for (const char* preset : {"qwen3-0.6b", "llama-3.2-1b", "qwen3-8b"}) {
    const model::ModelConfig c = model::PresetConfig(preset);
    const int h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
              hkv = c.num_key_value_heads, in = c.intermediate_size;
    const std::string p = std::string(preset) + " ";
    shapes.push_back({p + "qkv", (hq + 2 * hkv) * d, h, false});
    shapes.push_back({p + "o", h, hq * d, false});
    shapes.push_back({p + "gate_up", 2 * in, h, false});
    shapes.push_back({p + "down", h, in, false});
    shapes.push_back({p + "lm_head", static_cast<int>(c.vocab_size), h, true});
  }
  auto gemm = Gemm::Create(/*batch_invariant=*/true, 256, /*small_m=*/false);  // cuBLASLt only
  CHECK_OK(gemm.status());
  std::mt19937 rng(1);
  std::printf(
      "| shape | n | k | bitwise rows equal (m 1..16) | floor us | cuBLAS m=1 | small m=1 | "
      "cuBLAS m=2 | small m=2 | cuBLAS m=4 | small m=4 | cuBLAS m=16 | small m=16 |\n"
      "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Shape& s : shapes) {
    const size_t wn = static_cast<size_t>(s.n) * s.k;
    // Enough weight copies (>= 200 MB, 4x the L2) that every timed call reads from HBM.
    const int copies = static_cast<int>(std::max<size_t>(4, (200u << 20) / (wn * 2) + 1));
    std::vector<DeviceBuffer> ws;
    ws.push_back(RandomBf16(wn, &rng, 1.f / std::sqrt(s.k)));
    for (int i = 1; i < copies; ++i) {  // same values, other addresses
      ws.push_back(Alloc(wn * 2));
      CHECK_OK(CudaStatus(
          cudaMemcpy(ws.back().data(), ws[0].data(), wn * 2, cudaMemcpyDeviceToDevice), "copy"));
    }
    const int ref_m = 256;
    DeviceBuffer x = RandomBf16(static_cast<size_t>(ref_m) * s.k, &rng, 1.f);
    const size_t ob = s.f32 ? 4 : 2;
    DeviceBuffer y_ref = Alloc(static_cast<size_t>(ref_m) * s.n * ob);
    DeviceBuffer y = Alloc(static_cast<size_t>(16) * s.n * ob);
    const GemmOut out = s.f32 ? GemmOut::kF32 : GemmOut::kBf16;
    CHECK_OK(
        (*gemm)->Run(x.as<Bf16>(), ws[0].as<Bf16>(), ref_m, s.n, s.k, y_ref.data(), out, nullptr));
    std::vector<uint8_t> want(static_cast<size_t>(16) * s.n * ob), got(want.size());
    CHECK_OK(CopyToHost(want.data(), y_ref.data(), want.size()));
    int equal = 0;
    for (int m = 1; m <= 16; ++m) {
      CHECK_OK(FillBytes(y.data(), 0xff, got.size()));
      CHECK_OK(SmallGemm(x.as<Bf16>(), ws[0].as<Bf16>(), m, s.n, s.k, y.data(), s.f32, nullptr));
      CHECK_OK(CopyToHost(got.data(), y.data(), static_cast<size_t>(m) * s.n * ob));
      equal += std::memcmp(want.data(), got.data(), static_cast<size_t>(m) * s.n * ob) == 0;
    }
    // First mismatch at m = 1, for the notes.
    std::string first;
    if (equal < 16) {
      CHECK_OK(SmallGemm(x.as<Bf16>(), ws[0].as<Bf16>(), 1, s.n, s.k, y.data(), s.f32, nullptr));
      CHECK_OK(CopyToHost(got.data(), y.data(), s.n * ob));
      int diff = 0;
      for (int i = 0; i < s.n; ++i) diff += std::memcmp(&want[i * ob], &got[i * ob], ob) != 0;
      first = " (m=1: " + std::to_string(diff) + "/" + std::to_string(s.n) + " differ)";
    }
    const double floor_us = wn * 2 / 4.2e12 * 1e6;
    std::printf("| %s | %d | %d | %d/16%s | %.1f |", s.name.c_str(), s.n, s.k, equal, first.c_str(),
                floor_us);
    for (int m : {1, 2, 4, 16}) {
      const double tc = MedianUs([&](int i) {
        CHECK_OK((*gemm)->Run(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, y.data(), out,
                              nullptr));
      });
      const double ts = MedianUs([&](int i) {
        CHECK_OK(SmallGemm(x.as<Bf16>(), ws[i % copies].as<Bf16>(), m, s.n, s.k, y.data(), s.f32,
                           nullptr));
      });
      std::printf(" %.1f | %.1f |", tc, ts);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace cascade::cuda

int main() { return cascade::cuda::Main(); }
