#!/usr/bin/env python3
"""Hugging Face transformers baseline for engine_bench's decode table.

Same safetensors (the generated model directory engine_bench writes, e.g.
/tmp/cascade_bench_qwen3-0.6b), bf16, SDPA attention, a static KV cache, and one decode step
captured in a CUDA graph and replayed (the fastest plain-transformers decode loop). Greedy,
prompt `--prompt_len` random tokens, `--decode_len` steps timed after warm-up; prints a markdown
table of ms per decode step by batch.

  python3 bench/engine/hf_decode_bench.py --model_dir /tmp/cascade_bench_qwen3-0.6b --batches 1,64,256
"""
import argparse
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, StaticCache


def load(model_dir):
    try:
        m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")
    return m.cuda().eval()


def static_cache(model, batch, max_len):
    try:
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=max_len,
                           device="cuda", dtype=torch.bfloat16)
    except TypeError:
        return StaticCache(config=model.config, max_cache_len=max_len)


@torch.no_grad()
def decode_ms(model, batch, prompt_len, decode_len):
    cache = static_cache(model, batch, prompt_len + decode_len + 8)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device="cuda")
    out = model(input_ids=ids, past_key_values=cache,
                cache_position=torch.arange(prompt_len, device="cuda"), use_cache=True)
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    pos = torch.tensor([prompt_len], device="cuda")

    def step():
        o = model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True)
        return o.logits[:, -1].argmax(-1, keepdim=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            nxt = step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nxt = step()
    for _ in range(3):  # warm replays
        graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(decode_len):
        graph.replay()
        tok.copy_(nxt)
        pos.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / decode_len


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model_dir", required=True)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--decode_len", type=int, default=64)
    a = ap.parse_args()
    model = load(a.model_dir)
    print(f"# HF transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}: static cache + CUDA graph, {a.model_dir}\n")
    print("| batch | HF ms/step |\n|---:|---:|")
    for b in [int(x) for x in a.batches.split(",")]:
        print(f"| {b} | {decode_ms(model, b, a.prompt_len, a.decode_len):.3f} |", flush=True)


if __name__ == "__main__":
    main()
