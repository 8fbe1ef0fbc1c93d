#!/usr/bin/env python3
"""Issue #12's torch peer for the routed-expert op: 16 experts x n tokens each (n = 1, 2, 4, 8)
at Kimi K3's LatentMoE widths (latent 3584, FFN 3072), bf16 weights, on the GPU this runs on;
and issue #40's: Kimi K2's experts (hidden 7168, FFN 2048) at the INT4 op's shapes.
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
    del w1, w3, w2, w13_t, w2_t
    torch.cuda.empty_cache()
    json.dump({"source": f"torch {torch.__version__} bf16, {torch.cuda.get_device_name()}",
               "moe_experts": results, "moe_experts_k2": k2_experts(dev, g)}, open(args.out, "w"), indent=2)


# Issue #40's peer: Kimi K2's routed experts (hidden 7168, FFN 2048, top-8) in bf16 at the
# shapes moonrun's INT4 op is timed at (src/tools/bench_kernels.cpp, kK2Shapes): E experts,
# n tokens each.
K2_HIDDEN, K2_FFN = 7168, 2048
K2_SHAPES = [(8, 1), (64, 1), (64, 3), (64, 128), (192, 1)]


def k2_experts(dev, g):
    rows = []
    held = None
    for E, n in K2_SHAPES:
        if held != E:
            w13_t = w2_t = None
            torch.cuda.empty_cache()
            w13_t = (torch.randn(E, 2 * K2_FFN, K2_HIDDEN, device=dev, dtype=torch.bfloat16, generator=g) * 0.01).transpose(1, 2)
            w2_t = (torch.randn(E, K2_HIDDEN, K2_FFN, device=dev, dtype=torch.bfloat16, generator=g) * 0.01).transpose(1, 2)
            held = E
        x = torch.randn(E * n, K2_HIDDEN, device=dev, dtype=torch.bfloat16, generator=g)
        offs = torch.arange(n, E * n + 1, n, device=dev, dtype=torch.int32)

        def grouped():
            gu = torch._grouped_mm(x, w13_t, offs=offs)
            h = torch.nn.functional.silu(gu[:, :K2_FFN]) * gu[:, K2_FFN:]
            return torch._grouped_mm(h, w2_t, offs=offs)

        def looped():
            out = []
            for e in range(E):
                xe = x[e * n:(e + 1) * n]
                gu = xe @ w13_t[e]
                out.append((torch.nn.functional.silu(gu[:, :K2_FFN]) * gu[:, K2_FFN:]) @ w2_t[e])
            return torch.cat(out)

        candidates = {"loop of matmuls": looped}
        if hasattr(torch, "_grouped_mm"):
            try:
                grouped()
                candidates["torch._grouped_mm"] = grouped
            except RuntimeError as e:
                print(f"torch._grouped_mm unavailable: {e}", file=sys.stderr)
        times = {name: time_ms(fn, reps=10 if n >= 64 else 50) for name, fn in candidates.items()}
        best = min(times, key=times.get)
        rows.append({"experts": E, "tokens_per_expert": n, "ms": times[best], "how": best, "all_ms": times})
        print(f"K2: {E} experts x {n} tokens: " + ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()))
    return rows


if __name__ == "__main__":
    main()
