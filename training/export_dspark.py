"""Export a trained DSpark draft (train_dspark.py's dspark.pt), write its C++ reference numbers, and
measure its offline greedy acceptance against the demo target.

  python3 training/export_dspark.py --ckpt RUN/dspark.pt --target models/moonrun-demo \
      --out models/moonrun-demo-dspark --prompts PROMPTS.json [--eval-data DATA --eval-docs 128]

Writes OUT/config.json and OUT/model.safetensors (the RMSNorm weights F32, the rest
BF16; no embed_tokens / lm_head: the target's are shared), then OUT/expected.json, computed in
float64 on the weights read back from OUT and the target's stored weights (bf16, MXFP4 experts
dequantised as export.py does): per prompt (token-id list) the anchor is the last prompt token
(position len-1), the context is the target's taps at positions 0..len-2, and the block is
decoded greedily (slot k's corrected logits = base_k + markov bias of prev_k, prev_0 = the last
prompt token, prev_k = the draft of slot k-1).

--eval-data: the offline acceptance. For the first --eval-docs text documents of DATA, the
prompt is the document up to its last assistant turn (the first position of its last run of
loss-mask 1); the target (fp32) continues it greedily for --gen tokens; then at every anchor a
from the last prompt token up to the block that ends at the first end-of-message token (or
the end of the continuation), the draft's greedy block (context = target taps at < a) is
compared with the target's greedy tokens at a+1..a+B. Acceptance length = 1 + the number of
leading slots that agree. Written to --report (JSON).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dspark_torch as D  # noqa: E402
import safetensors_io as st  # noqa: E402
import train_dspark as TD  # noqa: E402


def write_checkpoint(ckpt, out):
    blob = torch.load(ckpt, map_location="cpu")
    c = D.DSparkConfig.from_json(blob["config"])
    draft = D.DSparkDraft(c)
    draft.load_state_dict(blob["model"], strict=True)
    os.makedirs(out, exist_ok=True)
    st.save_file(D.checkpoint_tensors(draft), os.path.join(out, "model.safetensors"), {"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c.to_json(), f, indent=1)
        f.write("\n")
    return blob


def f32list(t):
    return [float(np.float32(x)) for x in t.reshape(-1).tolist()]


@torch.no_grad()
def make_expected(out, target_dir, prompts, note):
    draft = D.load_draft(out, torch.float64)
    target, _ = TD.load_target(target_dir, torch.float64)
    c = draft.c
    embed = target.language_model.model.embed_tokens
    lm_head = target.language_model.lm_head
    cases = []
    for ci, prompt in enumerate(prompts):
        assert len(prompt) >= 2
        ids = torch.tensor([prompt[:-1]])
        taps, _ = TD.target_taps(target, ids, c.target_layer_ids)          # [1, len-1, n*H] float64
        assert taps.dtype == torch.float64
        a = len(prompt) - 1
        logits, toks, conf = D.draft_block(draft, embed, lm_head, taps, torch.tensor([[prompt[-1]]]),
                                           torch.tensor([[a]]))
        H = c.hidden_size
        tap_sum = [float(taps[0, :, j * H:(j + 1) * H].abs().sum()) for j in range(len(c.target_layer_ids))]
        srt = logits[0, 0].sort(-1, descending=True).values
        cases.append({
            "prompt_ids": list(prompt), "anchor_position": a,
            "block_tokens": toks[0, 0].tolist(),
            "block_logits": [f32list(logits[0, 0, k]) for k in range(c.block_size)],
            "confidence": [float(x) for x in torch.sigmoid(conf[0, 0]).tolist()],
            "taps_checksum": tap_sum,
            "min_top2_margin": float((srt[:, 0] - srt[:, 1]).min()),
        })
        print(f"  case{ci}: prompt {len(prompt)}, block {cases[-1]['block_tokens']}, confidence "
              f"{[round(x, 3) for x in cases[-1]['confidence']]}, top2 margin {cases[-1]['min_top2_margin']:.2e}")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"reference": note, "target": target_dir, "target_layer_ids": c.target_layer_ids,
                   "block_size": c.block_size, "vocab_size": c.vocab_size, "mask_token_id": c.mask_token_id,
                   "cases": cases}, f)
        f.write("\n")
    return cases


@torch.no_grad()
def greedy_continue(target, prompts, n, dev):
    """Batched greedy continuation (fp32, right padding: every layer is causal)."""
    L = [len(p) for p in prompts]
    T = max(L) + n
    ids = torch.zeros(len(prompts), T, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p)
    ids = ids.to(dev)
    cur = torch.tensor(L, device=dev)
    rows = torch.arange(len(prompts), device=dev)
    for _ in range(n):
        Tn = int(cur.max())
        Tn = ((Tn + 63) // 64) * 64
        h = target(ids[:, :Tn], compute_logits=False).hidden
        nxt = target.language_model.lm_head(h[rows, cur - 1]).argmax(-1)
        ids[rows, cur] = nxt
        cur = cur + 1
    return [ids[b, :L[b] + n].tolist() for b in range(len(prompts))]


@torch.no_grad()
def acceptance(draft, target, data_dir, n_docs, gen, eos_ids, dev, batch=16):
    import train as T
    data = T.Data(data_dir, 4096, print)
    prompts = []
    for o, n, imgs in data.samples:
        if imgs:
            continue
        m = np.asarray(data.mask[o:o + n])
        starts = [t for t in range(1, n) if m[t] and not m[t - 1]]
        if not starts:
            continue
        prompts.append([int(x) for x in data.ids[o:o + starts[-1]]])
        if len(prompts) >= n_docs:
            break
    c = draft.c
    B = c.block_size
    embed = target.language_model.model.embed_tokens
    lm_head = target.language_model.lm_head
    t0 = time.time()
    seqs = []
    for i in range(0, len(prompts), 64):
        seqs += greedy_continue(target, prompts[i:i + 64], gen, dev)
    t_gen = time.time() - t0
    lens_all, leading_all, conf_all, match_all = [], [], [], []
    for i in range(0, len(seqs), batch):
        chunk = list(range(i, min(i + batch, len(seqs))))
        Tn = max(len(seqs[j]) for j in chunk)
        ids = torch.zeros(len(chunk), Tn, dtype=torch.long)
        for r, j in enumerate(chunk):
            ids[r, :len(seqs[j])] = torch.tensor(seqs[j])
        ids = ids.to(dev)
        taps, hidden = TD.target_taps(target, ids, c.target_layer_ids)
        tgreedy = lm_head(hidden).argmax(-1)                                     # [N, T]
        anchors, valid = [], []
        for r, j in enumerate(chunk):
            s = len(prompts[j])
            cont = seqs[j][s:]
            e = next((s + t for t, x in enumerate(cont) if x in eos_ids), len(seqs[j]) - 1)
            anchors.append(list(range(s - 1, e - B + 1)))
        A = max(1, max(len(x) for x in anchors))
        anc = torch.zeros(len(chunk), A, dtype=torch.long)
        ok = torch.zeros(len(chunk), A, dtype=torch.bool)
        for r, x in enumerate(anchors):
            if x:
                anc[r, :len(x)] = torch.tensor(x, dtype=torch.long)
                ok[r, :len(x)] = True
        anc, ok = anc.to(dev), ok.to(dev)
        _, toks, conf = D.draft_block(draft, embed, lm_head, taps, ids.gather(1, anc), anc)
        pos = (anc.unsqueeze(-1) + torch.arange(B, device=dev)).clamp(max=Tn - 1)
        want = tgreedy.gather(1, pos.reshape(len(chunk), -1)).view_as(toks)
        match = (toks == want)
        leading = match.long().cumprod(-1)
        lens_all.append((1 + leading.sum(-1))[ok].cpu())
        leading_all.append(leading[ok].cpu())
        match_all.append(match[ok].cpu())
        conf_all.append(torch.sigmoid(conf)[ok].cpu())
    lens = torch.cat(lens_all).double()
    leading = torch.cat(leading_all).double()
    match = torch.cat(match_all).double()
    conf = torch.cat(conf_all).double()
    reach = leading.mean(0)                                                       # P(slots 1..k all accepted)
    prev_reach = torch.cat([torch.ones(1, dtype=torch.float64), reach[:-1]])
    # calibration: mean confidence vs the accept rate of a slot whose prefix was accepted
    prefix_ok = torch.cat([torch.ones(leading.shape[0], 1, dtype=torch.float64), leading[:, :-1]], 1) > 0
    return {
        "docs": len(prompts), "blocks": int(lens.numel()), "gen_tokens": gen, "block_size": B,
        "mean_acceptance_length": float(lens.mean()),
        "accepted_through_slot": [float(x) for x in reach],
        "conditional_accept_slot": [float(x) for x in (reach / prev_reach.clamp(min=1e-12))],
        "slot_agreement": [float(x) for x in match.mean(0)],
        "mean_confidence_given_prefix": [float(conf[:, k][prefix_ok[:, k]].mean()) for k in range(B)],
        "target_generation_seconds": t_gen,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--target", default="models/moonrun-demo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", help="JSON list of token-id lists (expected.json)")
    ap.add_argument("--eval-data", help="a train.py data dir (held-out conversations)")
    ap.add_argument("--eval-docs", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--report", help="acceptance JSON (default OUT/../dspark_eval.json)")
    args = ap.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), os.cpu_count() or 1))
    blob = write_checkpoint(args.ckpt, args.out)
    print(f"wrote {args.out} (draft trained {blob.get('steps')} steps, {blob.get('train_minutes', 0):.2f} min)")
    if args.eval_data:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        target, tconfig = TD.load_target(args.target)
        target.to(dev)
        draft = D.load_draft(args.out, torch.float32).to(dev)
        eos = {tconfig.get("eos_token_id", 2306), 2305, 2306}
        t0 = time.time()
        rep = acceptance(draft, target, args.eval_data, args.eval_docs, args.gen, eos, dev)
        rep["seconds"] = time.time() - t0
        rep["train_steps"], rep["train_minutes"] = blob.get("steps"), blob.get("train_minutes")
        print(json.dumps(rep, indent=1))
        path = args.report or os.path.join(os.path.dirname(os.path.abspath(args.out)), "dspark_eval.json")
        with open(path, "w") as f:
            json.dump(rep, f, indent=1)
        del target
    if args.prompts:
        with open(args.prompts) as f:
            prompts = json.load(f)
        prompts = [p["prompt_ids"] if isinstance(p, dict) else p for p in prompts]
        note = ("training/export_dspark.py: dspark_torch.py + k3_torch.py in float64 on the weights read back "
                "from model.safetensors (draft) and the target's stored weights (bf16, MXFP4 dequantised); "
                "context = target taps at positions 0..len-2, anchor = the last prompt token at len-1; "
                "greedy block with the Markov bias of the previous draft token")
        t0 = time.time()
        make_expected(args.out, args.target, prompts, note)
        print(f"expected.json: {len(prompts)} cases ({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
