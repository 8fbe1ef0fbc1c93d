"""Proves k3_torch.py computes the K3 reference (tests/fixtures/k3-tiny-{a,b}).

  /usr/bin/python3 training/check_text.py [--fixtures tests/fixtures] [--quick]

Checks (exit status 1 if any fails):
  1. every case of each fixture's expected.json, float64, reference path (recurrent KDA):
     prefill the prompt, then greedy, re-running the whole sequence each step;
     max |logit - expected| <= 1e-3 and identical greedy ids;
  2. the training path (chunked KDA, all cases of a fixture in one right-padded batch) gives
     the reference path's logits (float64, <= 1e-9), also with embed_rows / inputs_embeds;
  3. chunked KDA == recurrent KDA on random inputs (float64; values and gradients), incl.
     strongly decaying gates and lengths around the chunk size;
  4. MXFP4: quantise(dequantise(stored codes)) reproduces the stored experts' values.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_torch as K  # noqa: E402
import safetensors_io as st  # noqa: E402

FAILED = []


def report(name, value, limit, ok=None):
    ok = (value <= limit) if ok is None else ok
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {value:.3g} (limit {limit:.3g})")
    if not ok:
        FAILED.append(name)


def load_model(fdir, dtype=torch.float64):
    with open(os.path.join(fdir, "config.json")) as f:
        cfg = K.K3Config.from_json(json.load(f))
    model = K.K3ForConditionalGeneration(cfg)
    model.load_state_dict(K.load_checkpoint_state(st.load(fdir), dtype), strict=True)
    return model.to(dtype).eval(), cfg


@torch.no_grad()
def greedy(model, prompt, n, mode="recurrent"):
    """Prefill + greedy by re-running the full sequence each step. Returns (ids, logits [n, V])."""
    ids = list(prompt)
    rows = []
    for _ in range(n):
        logits = model(torch.tensor([ids]), kda_mode=mode).logits[0, -1]
        rows.append(logits)
        ids.append(int(logits.argmax()))
    return ids[len(prompt):], torch.stack(rows)


def check_fixture(fdir, quick):
    name = os.path.basename(fdir.rstrip("/"))
    print(f"[{name}]")
    model, cfg = load_model(fdir)
    with open(os.path.join(fdir, "expected.json")) as f:
        exp = json.load(f)
    tol = exp["tolerance_abs_logit"]
    ref_rows = []
    for ci, case in enumerate(exp["cases"]):
        t0 = time.time()
        want = np.fromfile(os.path.join(fdir, case["logits_file"]), dtype="<f4").reshape(case["logits_shape"])
        n = case["max_tokens"]
        if quick:  # teacher-forced single pass (same rows when the ids agree)
            seq = case["prompt_ids"] + case["greedy_ids"][:-1]
            with torch.no_grad():
                lg = model(torch.tensor([seq]), kda_mode="recurrent").logits[0, len(case["prompt_ids"]) - 1:]
            ids = lg.argmax(-1).tolist()
        else:
            ids, lg = greedy(model, case["prompt_ids"], n)
        err = float(np.abs(lg.numpy() - want).max())
        same = ids == case["greedy_ids"]
        print(f"  case{ci}: prompt {len(case['prompt_ids'])}, {n} tokens: max|dlogit| {err:.2e}, "
              f"greedy ids {'equal' if same else 'DIFFER'} ({time.time() - t0:.1f}s)")
        if err > tol or not same:
            FAILED.append(f"{name} case{ci}")
        ref_rows.append((case["prompt_ids"] + case["greedy_ids"][:-1], len(case["prompt_ids"]), lg))

    # 2. the training path on one right-padded batch.
    seqs = [s for s, _, _ in ref_rows]
    T = max(len(s) for s in seqs)
    pad = cfg.vocab_size - 1
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
        mask[b, :len(s)] = True
    with torch.no_grad():
        out = model(ids, kda_mode="chunked", token_mask=mask)
        full_ref = [model(torch.tensor([s]), kda_mode="recurrent").logits[0] for s in seqs]
    err = max(float((out.logits[b, :len(s)] - full_ref[b]).abs().max()) for b, s in enumerate(seqs))
    report(f"{name} training path (chunked, padded batch of {len(seqs)}) vs reference", err, 1e-9)
    err_c = max(float((out.logits[b, p - 1:len(s)] - lg).abs().max()) for b, (s, p, lg) in enumerate(ref_rows))
    report(f"{name} training path vs greedy reference rows", err_c, 1e-9)

    # embed_rows / inputs_embeds: replacing rows by their own embeddings changes nothing.
    emb = model.language_model.model.embed_tokens.weight
    b_idx = torch.tensor([0, 1, 1])
    t_idx = torch.tensor([0, 3, 5])
    rows = emb[ids[b_idx, t_idx]]
    with torch.no_grad():
        o2 = model(ids, embed_rows=(b_idx, t_idx, rows), token_mask=mask).logits
        o3 = model(inputs_embeds=emb[ids], token_mask=mask).logits
        o4 = model(ids, embed_rows=(b_idx, t_idx, rows + 1.0), token_mask=mask).logits
    report(f"{name} embed_rows / inputs_embeds identity", float(max((o2 - out.logits).abs().max(),
                                                                     (o3 - out.logits).abs().max())), 1e-12)
    report(f"{name} embed_rows takes effect", float((o4 - out.logits).abs().max()), 0, ok=float((o4 - out.logits).abs().max()) > 1e-3)

    # MXFP4 fake quant (QAT) is the identity on weights that are already MXFP4 values.
    with torch.no_grad():
        o5 = model(ids, token_mask=mask, fake_quant=True).logits
    report(f"{name} fake-quant forward == plain forward on MXFP4 weights", float((o5 - out.logits).abs().max()), 0.0)

    # fp32 (as trained, no autocast) chunked path vs the float64 golden: informative.
    m32, _ = load_model(fdir, torch.float32)
    with torch.no_grad():
        o32 = m32(ids, kda_mode="chunked", token_mask=mask).logits.double()
    err32 = max(float((o32[b, p - 1:len(s)] - lg).abs().max()) for b, (s, p, lg) in enumerate(ref_rows))
    print(f"  info: fp32 chunked training path vs float64 reference: {err32:.2e}")

    # 4. MXFP4 round trip of the stored experts.
    tensors = st.load(fdir)
    worst = 0.0
    for nm, t in tensors.items():
        if nm.endswith(".weight_packed"):
            base = nm[: -len(".weight_packed")]
            w = K.mxfp4_dequantize(K.mxfp4_unpack(t), tensors[base + ".weight_scale"], torch.float64)
            c2, s2 = K.mxfp4_quantize(w)
            w2 = K.mxfp4_dequantize(c2, s2, torch.float64)
            worst = max(worst, float((w2 - w).abs().max()))
    report(f"{name} MXFP4 requantise(dequantise(stored)) exact", worst, 0.0)


def check_kda():
    print("[chunked KDA vs recurrent KDA, random inputs]")
    gen = torch.Generator().manual_seed(1)
    worst, worst_g = 0.0, 0.0
    for B, T, H, Kd, V, lb in [(2, 1, 2, 16, 8, -5.0), (1, 63, 2, 32, 16, -5.0), (2, 64, 3, 16, 16, -5.0),
                               (2, 65, 2, 16, 32, -5.0), (1, 130, 2, 32, 32, -5.0), (2, 200, 2, 64, 64, -5.0),
                               (1, 150, 1, 16, 16, -20.0)]:
        def rnd(*s):
            return torch.randn(*s, generator=gen, dtype=torch.float64)
        q, k = rnd(B, T, H, Kd), rnd(B, T, H, Kd)
        q = q / q.norm(dim=-1, keepdim=True) * Kd ** -0.5
        k = k / k.norm(dim=-1, keepdim=True)
        v = rnd(B, T, H, V)
        g = lb * torch.sigmoid(rnd(B, T, H, Kd) * 3 - 2)          # spans weak to strong decay
        beta = torch.sigmoid(rnd(B, T, H))
        for x in (q, k, v, g, beta):
            x.requires_grad_(True)
        o_r, s_r = K.kda_recurrent(q, k, v, g, beta)
        o_c, s_c = K.kda_chunked(q, k, v, g, beta)
        e = max(float((o_r - o_c).abs().max()), float((s_r - s_c).abs().max()))
        w = rnd(*o_r.shape)
        gr = torch.autograd.grad((o_r * w).sum() + s_r.sum(), (q, k, v, g, beta))
        gc = torch.autograd.grad((o_c * w).sum() + s_c.sum(), (q, k, v, g, beta))
        eg = max(float((a - b).abs().max()) for a, b in zip(gr, gc))
        print(f"  B{B} T{T} H{H} K{Kd} V{V} lb{lb}: max|do| {e:.1e}, max|dgrad| {eg:.1e}")
        worst, worst_g = max(worst, e), max(worst_g, eg)
    report("chunked vs recurrent KDA (float64, outputs + final state)", worst, 1e-10)
    report("chunked vs recurrent KDA (float64, gradients)", worst_g, 1e-9)
    # fp32 chunked vs float64 recurrent (the training precision).
    T = 256
    q = torch.nn.functional.normalize(torch.randn(2, T, 4, 64, generator=gen, dtype=torch.float64), dim=-1) / 8
    k = torch.nn.functional.normalize(torch.randn(2, T, 4, 64, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(2, T, 4, 64, generator=gen, dtype=torch.float64)
    g = -5.0 * torch.sigmoid(torch.randn(2, T, 4, 64, generator=gen, dtype=torch.float64) * 3 - 2)
    beta = torch.sigmoid(torch.randn(2, T, 4, generator=gen, dtype=torch.float64))
    o_r, _ = K.kda_recurrent(q, k, v, g, beta)
    o_c, _ = K.kda_chunked(*(x.float() for x in (q, k, v, g, beta)))
    print(f"  info: fp32 chunked vs float64 recurrent (T={T}, |o|max {float(o_r.abs().max()):.2f}): "
          f"{float((o_c.double() - o_r).abs().max()):.1e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                        "fixtures"))
    ap.add_argument("--quick", action="store_true", help="teacher-forced single pass instead of the greedy loop")
    args = ap.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), os.cpu_count() or 1))
    check_kda()
    for name in ("k3-tiny-a", "k3-tiny-b"):
        check_fixture(os.path.join(args.fixtures, name), args.quick)
    print("FAILED: " + ", ".join(FAILED) if FAILED else "all checks passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
