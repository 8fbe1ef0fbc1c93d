"""Export a trained K3 demo model as a moonrun checkpoint + a logits fixture, and check moonrun on it.

  /usr/bin/python3 training/export.py --ckpt RUN/ckpt.pt --tokenizer TOKDIR --out OUTDIR \
      [--prompts prompts.json] [--max-tokens 16] [--moonrun build-cpu/moonrun]

  --random-init (instead of --ckpt): export a freshly initialised model (tests the pipeline).

Writes OUTDIR/config.json (training/demo_config.py, or the config stored in the ckpt),
OUTDIR/model.safetensors (release names/dtypes; routed experts MXFP4 weight_packed/weight_scale
U8; A_log, dt_bias, conv weights, o_norm, router bias F32; the rest BF16; vision_tower.* and
mm_projector.* when the state dict has them, else the tower is left out of vision_config),
the tokenizer files (tiktoken.model, tokenizer_config.json, ...), and the fixture in the
tests/fixtures/README.md format: OUTDIR/expected.json + caseK.f32, computed by k3_torch.py in
float64 on the weights read back from the written model.safetensors (bf16-rounded, MXFP4
dequantised). --prompts: a JSON list of token-id lists (or of {"prompt_ids", "max_tokens"}).

Then (unless --no-check) runs `moonrun verify` and `moonrun generate --device cpu
--logits-out` for every case and compares: greedy ids identical, max |dlogit| <= 1e-3.
Exit status 1 when a check fails.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_config  # noqa: E402
import k3_torch as K  # noqa: E402
import safetensors_io as st  # noqa: E402

VISION_PREFIXES = ("vision_tower.", "mm_projector.")
TOKENIZER_SKIP = ("config.json", "model.safetensors.index.json", "expected.json")


def strip_vision_tower(config):
    vc = config.get("vision_config") or {}
    config["vision_config"] = {k: vc[k] for k in ("patch_size", "merge_kernel_size") if k in vc}
    return config


def load_state(args, n_base):
    """(state dict, config.json dict)."""
    if args.random_init:
        config = demo_config.demo_config(n_base, with_vision_tower=False)
        model = K.K3ForConditionalGeneration(K.K3Config.from_json(config))
        model.init_weights(seed=args.seed)
        return model.state_dict(), config
    try:
        ckpt = torch.load(args.ckpt, map_location="cpu", weights_only=False)
    except TypeError:  # torch without weights_only
        ckpt = torch.load(args.ckpt, map_location="cpu")
    state = ckpt.get("model", ckpt) if isinstance(ckpt, dict) else ckpt
    config = ckpt.get("config") if isinstance(ckpt, dict) else None
    if config is None:
        config = demo_config.demo_config(n_base)
    has_vision = any(k.startswith(VISION_PREFIXES) for k in state)
    if not has_vision:
        config = strip_vision_tower(config)
    return state, config


def write_checkpoint(out, state, config, tokenizer_dir):
    os.makedirs(out, exist_ok=True)
    cfg = K.K3Config.from_json(config)
    tensors = K.checkpoint_tensors({k: v for k, v in state.items() if not k.startswith(VISION_PREFIXES)}, cfg)
    for k, v in state.items():
        if k.startswith(VISION_PREFIXES):
            tensors[k] = v.detach().float().to(torch.bfloat16)
    st.save_file(tensors, os.path.join(out, "model.safetensors"), {"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
        f.write("\n")
    for name in sorted(os.listdir(tokenizer_dir)):
        src = os.path.join(tokenizer_dir, name)
        if (os.path.isfile(src) and name not in TOKENIZER_SKIP and not name.endswith(".safetensors")
                and not name.endswith(".f32")):
            shutil.copyfile(src, os.path.join(out, name))
    for need in ("tiktoken.model", "tokenizer_config.json"):
        if not os.path.exists(os.path.join(out, need)):
            raise SystemExit(f"{tokenizer_dir}: {need} missing")
    return cfg


@torch.no_grad()
def make_fixture(out, fixture_dir, prompts, default_max_tokens, reference_note):
    """The expected.json + caseK.f32 of the exported weights (float64, read back from disk)."""
    with open(os.path.join(out, "config.json")) as f:
        cfg = K.K3Config.from_json(json.load(f))
    tensors = {k: v for k, v in st.load(out).items() if not k.startswith(VISION_PREFIXES)}
    model = K.K3ForConditionalGeneration(cfg)
    model.load_state_dict(K.load_checkpoint_state(tensors, torch.float64), strict=True)
    model = model.double().eval()
    os.makedirs(fixture_dir, exist_ok=True)
    cases = []
    for ci, p in enumerate(prompts):
        prompt, n = (p["prompt_ids"], p.get("max_tokens", default_max_tokens)) if isinstance(p, dict) else \
            (p, default_max_tokens)
        assert prompt and all(0 <= t < cfg.vocab_size for t in prompt), f"prompt {ci}: ids outside the vocabulary"
        ids = list(prompt)
        rows = []
        for _ in range(n):  # greedy, re-running the whole sequence (chunked == recurrent to 1e-12 in fp64)
            h = model(torch.tensor([ids]), compute_logits=False).hidden[0, -1]
            lg = model.language_model.lm_head(h)
            rows.append(lg)
            ids.append(int(lg.argmax()))
        logits = torch.stack(rows).numpy()
        top2 = np.sort(logits, axis=-1)[:, -2:]
        model.set_margin_recording(True)
        model(torch.tensor([ids[:-1]]), compute_logits=False)
        margins = model.routing_margins()
        model.set_margin_recording(False)
        fname = f"case{ci}.f32"
        logits.astype("<f4").tofile(os.path.join(fixture_dir, fname))
        cases.append({"prompt_ids": list(prompt), "max_tokens": n, "greedy_ids": ids[len(prompt):],
                      "logits_file": fname, "logits_shape": [n, cfg.vocab_size],
                      "min_top2_margin": float((top2[:, 1] - top2[:, 0]).min()),
                      "min_routing_margin": float(min(margins)) if margins else None})
        print(f"  case{ci}: prompt {len(prompt)}, {n} tokens, top2 margin {cases[-1]['min_top2_margin']:.2e}, "
              f"routing margin {cases[-1]['min_routing_margin']:.2e}")
    with open(os.path.join(fixture_dir, "expected.json"), "w") as f:
        json.dump({"reference": reference_note, "tolerance_abs_logit": 0.001, "cases": cases}, f, indent=1)
        f.write("\n")
    return cases


def check_moonrun(moonrun, out, fixture_dir, cases, tol=1e-3):
    """moonrun verify + generate --logits-out per case vs the fixture. Returns the failures."""
    failures = []
    r = subprocess.run([moonrun, "verify", "--model", out], capture_output=True, text=True)
    print(f"  moonrun verify: rc {r.returncode} {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ''}")
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
        failures.append("verify")
    with tempfile.TemporaryDirectory() as tmp:
        for ci, c in enumerate(cases):
            lf = os.path.join(tmp, f"c{ci}.f32")
            cmd = [moonrun, "generate", "--model", out, "--token-ids", ",".join(map(str, c["prompt_ids"])),
                   "--max-tokens", str(c["max_tokens"]), "--temperature", "0", "--device", "cpu",
                   "--logits-out", lf]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"  case{ci}: moonrun generate failed (rc {r.returncode}): {r.stderr[-1500:]}")
                failures.append(f"case{ci}")
                continue
            got_ids = json.loads(r.stdout.strip().splitlines()[-1])["token_ids"]
            got = np.fromfile(lf, dtype="<f4").reshape(-1, c["logits_shape"][1])
            want = np.fromfile(os.path.join(fixture_dir, c["logits_file"]), dtype="<f4").reshape(c["logits_shape"])
            err = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
            same = got_ids == c["greedy_ids"]
            ok = same and err <= tol
            print(f"  case{ci}: moonrun vs float64 reference: max|dlogit| {err:.2e}, greedy ids "
                  f"{'equal' if same else 'DIFFER'} {'ok' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"case{ci}")
    return failures


def default_prompts(vocab_base, seed):
    g = np.random.default_rng(seed)
    return [[int(t) for t in g.integers(0, vocab_base, n)] for n in (1, 7, 64, 75, 130)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", help="ckpt.pt written by train.py (or a bare state dict)")
    src.add_argument("--random-init", action="store_true", help="export a freshly initialised model")
    src.add_argument("--check-only", action="store_true",
                     help="only run the moonrun comparison on an existing --out (+ --fixture-dir)")
    ap.add_argument("--tokenizer", help="dir with tiktoken.model and tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fixture-dir", help="where expected.json + caseK.f32 go (default: --out)")
    ap.add_argument("--prompts", help="JSON list of token-id lists (default: 5 random prompts, 1..130 tokens)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--moonrun", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                      "build-cpu", "moonrun"))
    ap.add_argument("--no-check", action="store_true", help="skip the moonrun verify/generate comparison")
    args = ap.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), os.cpu_count() or 1))
    if args.check_only:
        fixture_dir = args.fixture_dir or args.out
        with open(os.path.join(fixture_dir, "expected.json")) as f:
            cases = json.load(f)["cases"]
        failures = check_moonrun(args.moonrun, args.out, fixture_dir, cases)
        print("FAILED: " + ", ".join(failures) if failures else "moonrun agrees with the float64 reference")
        sys.exit(1 if failures else 0)
    if not args.tokenizer:
        ap.error("--tokenizer is required")

    n_base = demo_config.count_base_tokens(os.path.join(args.tokenizer, "tiktoken.model"))
    state, config = load_state(args, n_base)
    vocab = config["text_config"]["vocab_size"]
    if vocab != n_base + demo_config.NUM_RESERVED_SPECIAL_TOKENS:
        print(f"warning: vocab_size {vocab} != tokenizer ranks {n_base} + 256")
    t0 = time.time()
    write_checkpoint(args.out, state, config, args.tokenizer)
    print(f"wrote {args.out} ({time.time() - t0:.1f}s)")

    if args.prompts:
        with open(args.prompts) as f:
            prompts = json.load(f)
    else:
        prompts = default_prompts(n_base, args.seed)
    fixture_dir = args.fixture_dir or args.out
    note = ("training/export.py: k3_torch.py in float64 (chunked KDA, greedy re-running the full sequence) on the "
            "weights read back from model.safetensors (bf16, MXFP4 dequantised)")
    t0 = time.time()
    cases = make_fixture(args.out, fixture_dir, prompts, args.max_tokens, note)
    print(f"fixture: {len(cases)} cases in {fixture_dir} ({time.time() - t0:.1f}s)")
    if args.no_check:
        return
    failures = check_moonrun(args.moonrun, args.out, fixture_dir, cases)
    print("FAILED: " + ", ".join(failures) if failures else "moonrun agrees with the float64 reference")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
