"""Train a DSpark block draft (training/dspark_torch.py) against the FROZEN demo target.

  python3 training/train_dspark.py --data DATA --target models/moonrun-demo --out RUN \
      [--schedule-minutes 5.5] [--batch-tokens 32768] [--anchors 48] [--lr 1e-3]

DATA is a train.py data dir (ids.u32, mask.u8, docs.json); documents with images are left out
(the target would need its vision tower for them). Per step, the target (bf16 autocast, no
grad) runs on a batch of documents and gives its layer outputs at target_layer_ids (the taps)
and its next-token distributions. Per document up to --anchors anchors a are drawn among the
positions whose next token is a training target (loss mask of x_{a+1} = 1); anchor a's block
is [x_a, mask * (B-1)] at positions a..a+B-1, attending to the context rows at positions < a
and to its own block. Slot k predicts x_{a+k+1} (teacher forcing: prev_k = x_{a+k}), and its loss,
weighted by exp(-k / gamma) and counted where x_{a+k+1} is a training target, is
  0.1 * CE(draft, x_{a+k+1}) + 0.9 * TV(draft, target) + 1.0 * BCE(confidence, 1 - TV)
with TV = 0.5 * sum |softmax(draft) - softmax(target at a+k)| (so 1 - TV is the speculative
acceptance probability of the slot) and the confidence head fed detached features (a probe: it
does not move the draft). The target's embed_tokens and lm_head are shared and frozen.
AdamW, linear warmup + cosine by wall-clock (--schedule-minutes), bf16 autocast. Writes
RUN/dspark.pt ({"model": fp32 state dict, "config": config.json dict, ...}) and RUN/log.jsonl.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dspark_torch as D  # noqa: E402
import k3_torch as K  # noqa: E402
import safetensors_io as st  # noqa: E402
import train as T  # noqa: E402

VISION_PREFIXES = ("vision_tower.", "mm_projector.")


def load_target(path, dtype=torch.float32):
    """The moonrun-demo text model from its checkpoint (bf16 values, MXFP4 experts dequantised)."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    cfg = K.K3Config.from_json(config)
    model = K.K3ForConditionalGeneration(cfg)
    tensors = {k: v for k, v in st.load(path).items() if not k.startswith(VISION_PREFIXES)}
    model.load_state_dict(K.load_checkpoint_state(tensors, dtype), strict=True)
    model = model.to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, config


def target_taps(target, ids, layer_ids):
    """ids [N, T] -> (taps [N, T, n*H] (fp32; fp64 for a float64 target), final hidden [N, T, H])."""
    out = target(ids, compute_logits=False, tap_layers=set(layer_ids))
    return torch.cat([out.taps[i] for i in layer_ids], -1), out.hidden


def sample_anchors(tgt_w, A, gen):
    """tgt_w [N, T] bool (x_t is a target) -> anchors [N, A] long, valid [N, A] bool: up to A
    distinct positions a with tgt_w[a+1], uniformly at random."""
    N, Tn = tgt_w.shape
    cand = torch.zeros_like(tgt_w)
    cand[:, :-1] = tgt_w[:, 1:]
    score = torch.rand(N, Tn, generator=gen, device=tgt_w.device) + cand.float() * 2.0
    A = min(A, Tn)
    top = score.topk(A, dim=-1)
    return top.indices, top.values >= 2.0


def gather_rows(x, idx):
    """x [N, T, ...], idx [N, M] -> [N, M, ...]."""
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand(*idx.shape, *x.shape[2:]))


def block_loss(draft, target, ids, tgt_w, args, gen):
    """The training loss of one batch and its statistics (per-slot teacher-forced agreement)."""
    c = draft.c
    B = c.block_size
    N, Tn = ids.shape
    with torch.no_grad():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.autocast):
            taps, hidden = target_taps(target, ids, c.target_layer_ids)
        taps = taps.float()
        anchors, valid = sample_anchors(tgt_w, args.anchors, gen)
        A = anchors.shape[1]
        kk = torch.arange(B, device=ids.device)
        pos = anchors.unsqueeze(-1) + kk                                        # [N, A, B] = a + k
        posc = pos.clamp(max=Tn - 1).reshape(N, A * B)
        nxt = (pos + 1).clamp(max=Tn - 1).reshape(N, A * B)
        labels = ids.gather(1, nxt).view(N, A, B)
        slot_ok = valid.unsqueeze(-1) & (pos + 1 < Tn) & tgt_w.gather(1, nxt).view(N, A, B)
        prev = ids.gather(1, posc).view(N, A, B)
        h_t = gather_rows(hidden, posc).float()                                 # [N, A*B, H]
        t_logits = target.language_model.lm_head(h_t).view(N, A, B, -1)
        p_t = torch.softmax(t_logits.float(), -1)
    embed = target.language_model.model.embed_tokens
    lm_head = target.language_model.lm_head
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.autocast):
        logits, _, conf = D.draft_block(draft, embed, lm_head, taps, ids.gather(1, anchors), anchors, prev=prev,
                                        greedy=False, detach_conf=True)
    logits = logits.float()
    logp = torch.log_softmax(logits, -1)
    ce = -logp.gather(-1, labels.unsqueeze(-1))[..., 0]
    tv = 0.5 * (logp.exp() - p_t).abs().sum(-1)
    bce = F.binary_cross_entropy_with_logits(conf.float(), (1.0 - tv).detach(), reduction="none")
    w = torch.exp(-kk.float() / args.gamma).view(1, 1, B) * slot_ok.float()
    wsum = w.sum().clamp(min=1.0)
    loss = ((args.w_ce * ce + args.w_tv * tv + args.w_conf * bce) * w).sum() / wsum
    with torch.no_grad():
        agree = (logits.argmax(-1) == p_t.argmax(-1)) & slot_ok
        stats = {"ce": (ce * w).sum() / wsum, "tv": (tv * w).sum() / wsum, "bce": (bce * w).sum() / wsum,
                 "agree_k": agree.float().sum((0, 1)), "n_k": slot_ok.float().sum((0, 1))}
    return loss, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--target", default="models/moonrun-demo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--schedule-minutes", type=float, default=5.5, help="training wall clock (LR schedule)")
    ap.add_argument("--max-steps", type=int, default=10 ** 9)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--anchors", type=int, default=48, help="anchors per document")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--w-ce", type=float, default=0.1)
    ap.add_argument("--w-tv", type=float, default=0.9)
    ap.add_argument("--w-conf", type=float, default=1.0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-samples", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--no-autocast", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.autocast = dev.type == "cuda" and not args.no_autocast
    logf = open(os.path.join(args.out, "log.jsonl"), "a")

    def log(msg, **kv):
        print(msg, flush=True)
        if kv:
            logf.write(json.dumps(kv) + "\n")
            logf.flush()

    torch.manual_seed(args.seed)
    target, tconfig = load_target(args.target)
    target.to(dev)
    tc = tconfig.get("text_config", tconfig)
    pad_id = tconfig.get("pad_token_id", tc["vocab_size"] - 1)
    c = D.DSparkConfig(hidden_size=tc["hidden_size"], vocab_size=tc["vocab_size"], mask_token_id=pad_id,
                       num_hidden_layers=args.layers)
    assert max(c.target_layer_ids) < tc["num_hidden_layers"]
    draft = D.DSparkDraft(c)
    draft.init_weights(args.seed)
    draft.to(dev).train()
    n_params = sum(p.numel() for p in draft.parameters())
    log(f"draft: {n_params / 1e6:.2f}M parameters; target {args.target}; mask id {c.mask_token_id}")

    data = T.Data(args.data, args.max_len, log)
    n_all = len(data.samples)
    data.samples = [s for s in data.samples if not s[2]]
    log(f"{n_all - len(data.samples)} samples with images left out")
    val = data.split_validation(args.val_samples, args.seed) if args.val_samples else []

    decay = [p for n, p in draft.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in draft.named_parameters() if p.ndim != 2]
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), **fused)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    B = c.block_size

    def lr_at(step, frac):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        lo = args.lr * args.min_lr_ratio
        return lo + (args.lr - lo) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))

    def evaluate():
        draft.eval()
        g = torch.Generator(device=dev).manual_seed(1234)
        tot = {"ce": 0.0, "tv": 0.0, "n": 0}
        agree, nk = torch.zeros(B, device=dev), torch.zeros(B, device=dev)
        with torch.no_grad():
            for idx in data.epoch_batches(val, 0, args.seed, args.batch_tokens):
                ids, tgt_w, _, _ = data.collate(val, idx, pad_id)
                _, s = block_loss(draft, target, ids.to(dev), tgt_w.to(dev), args, g)
                tot["ce"] += float(s["ce"])
                tot["tv"] += float(s["tv"])
                tot["n"] += 1
                agree += s["agree_k"]
                nk += s["n_k"]
        draft.train()
        return tot["ce"] / max(tot["n"], 1), tot["tv"] / max(tot["n"], 1), (agree / nk.clamp(min=1)).tolist()

    step, epoch = 0, 0
    batches = data.epoch_batches(data.samples, epoch, args.seed, args.batch_tokens)
    bi = 0
    t_train = time.time()
    win = {"loss": 0.0, "ce": 0.0, "tv": 0.0, "bce": 0.0, "steps": 0, "t": time.time()}
    agree, nk = torch.zeros(B, device=dev), torch.zeros(B, device=dev)
    while step < args.max_steps:
        frac = (time.time() - t_train) / (args.schedule_minutes * 60)
        if frac >= 1.0:
            break
        if bi >= len(batches):
            epoch += 1
            bi = 0
            batches = data.epoch_batches(data.samples, epoch, args.seed, args.batch_tokens)
        ids, tgt_w, _, _ = data.collate(data.samples, batches[bi], pad_id)
        bi += 1
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, frac)
        loss, s = block_loss(draft, target, ids.to(dev, non_blocking=True), tgt_w.to(dev, non_blocking=True),
                             args, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(draft.parameters(), args.grad_clip)
        opt.step()
        step += 1
        win["loss"] += loss.detach()
        for k in ("ce", "tv", "bce"):
            win[k] += s[k]
        win["steps"] += 1
        agree += s["agree_k"]
        nk += s["n_k"]
        if step % args.log_every == 0:
            n = win["steps"]
            dt = time.time() - win["t"]
            acc = (agree / nk.clamp(min=1)).tolist()
            log(f"step {step:5d} loss {float(win['loss']) / n:.4f} ce {float(win['ce']) / n:.3f} "
                f"tv {float(win['tv']) / n:.3f} bce {float(win['bce']) / n:.3f} lr {lr_at(step, frac):.2e} "
                f"gnorm {float(gnorm):.2f} {dt / n:.3f} s/step agree " + " ".join(f"{a:.2f}" for a in acc)
                + f" [{time.time() - t_start:.0f}s]",
                step=step, loss=float(win["loss"]) / n, ce=float(win["ce"]) / n, tv=float(win["tv"]) / n,
                bce=float(win["bce"]) / n, agree=acc, s_per_step=dt / n)
            win = {"loss": 0.0, "ce": 0.0, "tv": 0.0, "bce": 0.0, "steps": 0, "t": time.time()}
            agree.zero_()
            nk.zero_()
    train_s = time.time() - t_train
    vce, vtv, vacc = evaluate() if val else (None, None, None)
    log(f"done: {step} steps in {train_s / 60:.2f} min; held-out ce {vce} tv {vtv} "
        f"teacher-forced agreement per slot {vacc}",
        final=True, steps=step, train_minutes=train_s / 60, val_ce=vce, val_tv=vtv, val_agree=vacc)
    torch.save({"model": {k: v.detach().float().cpu() for k, v in draft.state_dict().items()},
                "config": c.to_json(), "steps": step, "train_minutes": train_s / 60},
               os.path.join(args.out, "dspark.pt"))


if __name__ == "__main__":
    main()
