#!/usr/bin/env python3
"""Issue #12's torch peer for the routed-expert op: 16 experts x n tokens each (n = 1, 2, 4, 8)
at Kimi K3's LatentMoE widths (latent 3584, FFN 3072), bf16 weights, on the GPU this runs on.
Per expert: h = act(x W1^T, x W3^T), y = h W2^T (gate, up, down), as one grouped GEMM per
projection (torch._grouped_mm where this torch has it, else a loop of matmuls; the faster
is reported). Writes JSON for `moonrun bench-model --kernels --kernel-peers FILE`.

    python3 bench/peers/torch_expert_gemm.py --out /tmp/torch-peers.json
"""
import argparse
import json
import sys

import torch

LATENT, FFN, EXPERTS = 3584, 3072, 16


def time_ms(fn, reps=50):
    fn()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_expert_gemm.py: no CUDA device")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w1 = torch.randn(EXPERTS, FFN, LATENT, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
    w3 = torch.randn(EXPERTS, FFN, LATENT, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
    w2 = torch.randn(EXPERTS, LATENT, FFN, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
    w13_t = torch.cat([w1, w3], dim=1).transpose(1, 2)  # [E, LATENT, 2 FFN] (column-major view for _grouped_mm)
    w2_t = w2.transpose(1, 2)                           # [E, FFN, LATENT]
    results = []
    for n in (1, 2, 4, 8):
        x = torch.randn(EXPERTS * n, LATENT, device=dev, dtype=torch.bfloat16, generator=g)
        offs = torch.arange(n, EXPERTS * n + 1, n, device=dev, dtype=torch.int32)

        def looped():
            out = []
            for e in range(EXPERTS):
                xe = x[e * n:(e + 1) * n]
                h = torch.nn.functional.silu(xe @ w1[e].T) * (xe @ w3[e].T)
                out.append(h @ w2[e].T)
            return torch.cat(out)

        candidates = {"loop of matmuls": looped}
        if hasattr(torch, "_grouped_mm"):
            def grouped():
                gu = torch._grouped_mm(x, w13_t, offs=offs)
                h = torch.nn.functional.silu(gu[:, :FFN]) * gu[:, FFN:]
                return torch._grouped_mm(h, w2_t, offs=offs)
            try:
                grouped()
                candidates["torch._grouped_mm"] = grouped
            except RuntimeError as e:  # an older torch / GPU without it
                print(f"torch._grouped_mm unavailable: {e}", file=sys.stderr)
        times = {name: time_ms(fn) for name, fn in candidates.items()}
        best = min(times, key=times.get)
        results.append({"tokens_per_expert": n, "ms": times[best], "how": best, "all_ms": times})
        print(f"16 experts x {n} tokens: " + ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()))
    json.dump({"source": f"torch {torch.__version__} bf16, {torch.cuda.get_device_name()}",
               "moe_experts": results}, open(args.out, "w"), indent=2)


if __name__ == "__main__":
    main()
