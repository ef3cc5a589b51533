"""PyTorch SDPA reference timings for the decode cases of cuda_attention_bench (same shape:
16 q heads, 8 kv heads, head_dim 128, bf16), on contiguous (not paged) K/V. Run on the GPU machine:
    python3 bench/kernels/sdpa_bench.py
"""
import torch
import torch.nn.functional as F

HQ, HKV, D = 16, 8, 128


def median_ms(fn, reps=20, calls=1):
    """Median over reps of the time per call of `calls` calls issued back to back (calls = 1: one
    call between two events, its host launch work included; cuda_attention_bench's b2b_us uses 10)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    times.sort()
    return times[len(times) // 2]


def main():
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'sdpa case':34s} {'time_us':>9s} {'GB/s':>9s} {'b2b_us':>9s}")
    for ctx in (1024, 4096):
        for batch in (1, 16, 64, 256):
            sets = max(1, min(8, (256 * 1024 * 1024) // (batch * ctx * HKV * D * 4)))
            qs = [torch.randn(batch, HQ, 1, D, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
            ks = [torch.randn(batch, HKV, ctx, D, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
            vs = [torch.randn(batch, HKV, ctx, D, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
            i = [0]

            def run():
                j = i[0] % sets
                i[0] += 1
                F.scaled_dot_product_attention(qs[j], ks[j], vs[j], enable_gqa=True)

            ms = median_ms(run)
            b2b = median_ms(run, calls=10)
            nbytes = batch * ctx * HKV * D * 2 * 2
            print(f"{f'sdpa decode B={batch} ctx={ctx}':34s} {ms * 1e3:9.1f} {nbytes / ms / 1e6:9.0f}"
                  f" {b2b * 1e3:9.1f}")
            del qs, ks, vs
    for n in (512, 2048, 4096, 8192):
        q = torch.randn(1, HQ, n, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, HKV, n, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, HKV, n, D, device=dev, dtype=torch.bfloat16)
        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
        flops = 4.0 * D * HQ * n * (n + 1) / 2
        print(f"{f'sdpa prefill N={n}':34s} {ms * 1e3:9.1f} {flops / ms / 1e9:9.2f} TFLOP/s")


if __name__ == "__main__":
    main()
