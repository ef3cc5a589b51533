"""External oracle: Hugging Face transformers computes the same generated model from the same
safetensors; its logits must be close to the CUDA backend's. Run on the GPU machine after
building cuda_hf_logits_dump:
    python3 tests/gpu/hf_compare.py BUILD_DIR/bin/cuda_hf_logits_dump [preset ...]
Tolerance: HF runs in float32 on the upcast bf16 weights; the CUDA backend in bf16 with fp32
accumulation: relative L2 of the logits < 5e-2, top-1 agreement >= 90% of positions.
"""
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers


def main():
    tool = sys.argv[1]
    presets = sys.argv[2:] or ["tiny", "llama-tiny"]
    ok = True
    for preset in presets:
        with tempfile.TemporaryDirectory(prefix=f"hf_{preset}_") as d:
            ok &= compare(tool, preset, d)
    print("HF COMPARE", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


def compare(tool, preset, d):
    """Dumps the CUDA backend's logits for `preset` into directory d and compares them with HF's."""
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(0, 151936, size=200)]
    subprocess.run([tool, preset, "5", d] + [str(t) for t in tokens], check=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).cuda()
    with torch.no_grad():
        ref = model(torch.tensor([tokens]).cuda()).logits[0].float().cpu().numpy()
    got = np.fromfile(f"{d}/cuda_logits.bin", dtype=np.float32).reshape(ref.shape)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    agree = float(np.mean(got.argmax(1) == ref.argmax(1)))
    print(f"{preset}: logits rel L2 max {rel.max():.3g} mean {rel.mean():.3g}, top-1 agreement {agree:.3f}")
    return bool(rel.max() < 5e-2 and agree >= 0.9)


if __name__ == "__main__":
    main()
