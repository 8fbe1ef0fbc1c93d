"""Train the K3-architecture demo model (training/demo_config.py) on a token data dir.

  python3 training/train.py --data DATA --out RUN --total-steps 3000 --minutes 8 [--resume RUN/ckpt.pt]

DATA holds
  ids.u32   little-endian uint32 token ids, all documents concatenated
  mask.u8   same length; 1 where the token is a training target (the loss for predicting
            token t counts when mask[t] == 1)
  docs.json {"vocab_size": V, "docs": [{"offset": o, "length": n, "images": [...]}, ...]}
            images (hook, see vision_rows): {"grid_hw": [h, w], "n_rows", "row_positions": [...]
            or "first_row_position", and the pixels ("pixels_offset" into pixels.f32 or "data_url")}.
V is the model's vocabulary (tokenizer ranks + 256 specials); --tokenizer DIR cross-checks it.

Batches: documents (split at --max-len with one token of overlap when longer) bucketed by
length, right-padded to a multiple of 64, about --batch-tokens tokens per batch; the batch
order is a seeded shuffle per epoch, so --resume continues exactly where a run stopped.
AdamW (fp32 master weights), linear warmup + cosine to --min-lr-ratio, grad clip, bf16
autocast on CUDA, MoE balance = --aux-coef * load-balancing loss plus the aux-loss-free
correction-bias update (--bias-update-rate), MXFP4 fake-quant of the routed experts for the
last --qat-fraction of --total-steps. Stops before --minutes of wall clock and saves
RUN/ckpt.pt (model, optimizer, step, data position, config); also every --save-every-min.

Smoke test (CPU):  python3 training/train.py --make-random-data /tmp/rd && \
                   python3 training/train.py --data /tmp/rd --out /tmp/run --total-steps 10 --batch-tokens 1024
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
import demo_config  # noqa: E402
import k3_torch as K  # noqa: E402
import moonvit_torch as MV  # noqa: E402

PAD_TO = 64  # the KDA chunk


# ---------------------------------------------------------------------------- data


class Data:
    def __init__(self, path, max_len, log=print):
        with open(os.path.join(path, "docs.json")) as f:
            meta = json.load(f)
        self.vocab_size = meta["vocab_size"]
        self.ids = np.memmap(os.path.join(path, "ids.u32"), dtype="<u4", mode="r")
        self.mask = np.memmap(os.path.join(path, "mask.u8"), dtype=np.uint8, mode="r")
        assert len(self.ids) == len(self.mask), "ids.u32 and mask.u8 differ in length"
        px = os.path.join(path, "pixels.f32")
        self.pixels = np.memmap(px, dtype="<f4", mode="r") if os.path.exists(px) else None
        # samples: (offset, length, images with sample-relative positions)
        self.samples = []
        dropped_img = 0
        for d in meta["docs"]:
            o, n, imgs = d["offset"], d["length"], d.get("images") or []
            assert o + n <= len(self.ids), f"doc at {o} runs past ids.u32"
            if n < 2:
                continue
            if n <= max_len:
                self.samples.append((o, n, imgs))
                continue
            if imgs:  # an image's rows must stay in one sample
                dropped_img += 1
                continue
            s = 0
            while s < n - 1:
                L = min(max_len, n - s)
                self.samples.append((o + s, L, []))
                s += max_len - 1
        lengths = np.array([L for _, L, _ in self.samples])
        tgt = sum(int(self.mask[o + 1:o + L].sum()) for o, L, _ in self.samples) if len(self.samples) < 200000 \
            else None
        log(f"data: {len(meta['docs'])} docs -> {len(self.samples)} samples, {int(lengths.sum())} tokens"
            + (f", {tgt} target tokens" if tgt is not None else "")
            + f", mean length {lengths.mean():.0f}" + (f"; dropped {dropped_img} over-long docs with images"
                                                       if dropped_img else ""))

    def split_validation(self, n_val, seed):
        g = np.random.default_rng(seed + 7777)
        idx = g.permutation(len(self.samples))
        val = [self.samples[i] for i in sorted(idx[:n_val])]
        self.samples = [self.samples[i] for i in sorted(idx[n_val:])]
        return val

    def epoch_batches(self, samples, epoch, seed, batch_tokens):
        """The batches of one epoch: lists of sample indices (bucketed by length, shuffled)."""
        g = np.random.default_rng([seed, epoch])
        lengths = np.array([s[1] for s in samples])
        order = np.lexsort((g.random(len(samples)), lengths))  # by length, random among equals
        batches, cur, cur_len = [], [], 0
        for i in order:
            L = int(math.ceil(lengths[i] / PAD_TO) * PAD_TO)
            if cur and (len(cur) + 1) * max(cur_len, L) > batch_tokens:
                batches.append(cur)
                cur, cur_len = [], 0
            cur.append(int(i))
            cur_len = max(cur_len, L)
        if cur:
            batches.append(cur)
        perm = g.permutation(len(batches))
        return [batches[i] for i in perm]

    def collate(self, samples, idx, pad_id):
        L = max(samples[i][1] for i in idx)
        T = int(math.ceil(L / PAD_TO) * PAD_TO)
        ids = np.full((len(idx), T), pad_id, dtype=np.int64)
        tgt_w = np.zeros((len(idx), T), dtype=np.bool_)   # weight of the loss at predicting position t
        real = np.zeros((len(idx), T), dtype=np.bool_)
        images = []
        for b, i in enumerate(idx):
            o, n, imgs = samples[i]
            ids[b, :n] = self.ids[o:o + n]
            tgt_w[b, 1:n] = self.mask[o + 1:o + n] != 0
            real[b, :n] = True
            for im in imgs:
                images.append((b, image_row_positions(im), im))  # doc-relative (docs with images are never split)
        return torch.from_numpy(ids), torch.from_numpy(tgt_w), torch.from_numpy(real), images


def image_row_positions(im):
    """Doc-relative positions of an image's rows: "row_positions", or n_rows from
    "first_row_position" (the layout `moonrun make-train-data` writes)."""
    if "row_positions" in im:
        return list(im["row_positions"])
    return list(range(im["first_row_position"], im["first_row_position"] + im["n_rows"]))


class ImageRows:
    """The image rows of a batch: each entry's PNG (its data_url, as the request sent it)
    decoded once and cached as 8-bit RGB, preprocessed as moonrun does (moonvit_torch's
    make_pixel_values, checked against the C++ processor's checksum on first use), and run
    through the tower, images of one grid together."""

    def __init__(self, tower):
        self.tower = tower
        self.rgb = {}

    def pixel_values(self, im):
        key = im["data_url"]
        if key not in self.rgb:
            import base64
            rgb = MV.decode_png(base64.b64decode(key.split(",", 1)[1]))[..., :3]
            pv, grid = MV.make_pixel_values(np.ascontiguousarray(rgb))
            assert list(grid) == list(im["grid_hw"]), (grid, im["grid_hw"])
            if "pixel_sum_sq" in im:  # the C++ processor's checksum (make-train-data)
                got = float((pv.double() ** 2).sum())
                assert abs(got - im["pixel_sum_sq"]) <= 1e-6 * max(1.0, im["pixel_sum_sq"]), (got, im["pixel_sum_sq"])
            self.rgb[key] = np.ascontiguousarray(rgb)
            return pv
        return MV.make_pixel_values(self.rgb[key])[0]

    def __call__(self, images, device):
        pvs = [self.pixel_values(im).to(device) for _, _, im in images]
        grids = [tuple(im["grid_hw"]) for _, _, im in images]
        return self.tower.forward_images(pvs, grids)


def vision_rows(model, images, pixels, device):
    """(b_idx, t_idx, rows [n, hidden]) replacing the placeholders' embeddings, or None
    (no images in the batch, or a text-only model: placeholders keep their embeddings)."""
    fn = getattr(model, "image_rows", None)
    if not images or fn is None:
        return None
    rows = fn(images, device)
    b_idx, t_idx = [], []
    for (b, positions, im), r in zip(images, rows):
        assert r.shape[0] == len(positions) == im["n_rows"], "image rows and placeholders differ"
        b_idx += [b] * len(positions)
        t_idx += positions
    return (torch.tensor(b_idx, device=device), torch.tensor(t_idx, device=device), torch.cat(rows, 0))


def attach_vision_tower(model, config, seed, log):
    """The MoonViT-V2 tower and projector as model.vision_tower / model.mm_projector (the
    checkpoint names), and model.image_rows to run them."""
    vc = config.get("vision_config") or {}
    if "vt_hidden_size" not in vc:
        return
    tower = MV.VisionTower(vc, torch_dtype=config.get("torch_dtype", "bfloat16"),
                           text_hidden_size=config["text_config"]["hidden_size"])
    tower.init_weights(seed)
    model.vision_tower = tower.vision_tower
    model.mm_projector = tower.mm_projector
    object.__setattr__(model, "image_rows", ImageRows(tower))
    object.__setattr__(model, "_tower", tower)
    n = sum(p.numel() for p in tower.parameters())
    log(f"vision tower: {n / 1e6:.2f}M parameters")


def make_random_data(path, vocab=1280, n_docs=300, seed=0):
    """A tiny random data dir in the training format (for smoke tests)."""
    os.makedirs(path, exist_ok=True)
    g = np.random.default_rng(seed)
    lengths = g.integers(8, 1500, n_docs)
    lengths[:3] = [1024, 1025, 3000]  # the max-len boundary and a split
    ids = g.integers(0, vocab - 256, int(lengths.sum())).astype("<u4")
    mask = (g.random(len(ids)) < 0.8).astype(np.uint8)
    docs, o = [], 0
    for n in lengths:
        docs.append({"offset": int(o), "length": int(n), "images": []})
        o += int(n)
    ids.tofile(os.path.join(path, "ids.u32"))
    mask.tofile(os.path.join(path, "mask.u8"))
    with open(os.path.join(path, "docs.json"), "w") as f:
        json.dump({"vocab_size": vocab, "docs": docs}, f)
    print(f"wrote {path}: {n_docs} docs, {len(ids)} tokens, vocab {vocab}")


# ---------------------------------------------------------------------------- training


def progress(step, args):
    """Fraction of the schedule done: by wall-clock training time with --schedule-minutes
    (one fixed-length GPU run whose step count is not known in advance), else by step."""
    if args.schedule_minutes:
        return min(1.0, args.train_seconds_now() / (args.schedule_minutes * 60))
    return min(1.0, (step - args.warmup) / max(1, args.total_steps - args.warmup))


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    lo = args.lr * args.min_lr_ratio
    return lo + (args.lr - lo) * 0.5 * (1 + math.cos(math.pi * progress(step, args)))


def param_groups(model, wd):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim == 2 and "res_proj" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def compute_loss(model, batch, device, use_autocast, fake_quant, aux_coef, pixels):
    ids, tgt_w, real, images = batch
    ids = ids.to(device, non_blocking=True)
    tgt_w = tgt_w.to(device, non_blocking=True)
    real = real.to(device, non_blocking=True)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if use_autocast else torch.autocast("cpu", enabled=False)
    with ctx:
        er = vision_rows(model, images, pixels, device)
        out = model(ids, embed_rows=er, token_mask=real, fake_quant=fake_quant, compute_logits=False)
        h = out.hidden[:, :-1][tgt_w[:, 1:]]            # positions whose next token is a target
        targets = ids[:, 1:][tgt_w[:, 1:]]
        logits = model.language_model.lm_head(h)
    ce = F.cross_entropy(logits.float(), targets, reduction="sum")
    n = targets.numel()
    loss = ce / max(n, 1) + aux_coef * out.aux_loss
    return loss, ce.detach(), n, out.aux_loss.detach(), out.expert_load


@torch.no_grad()
def update_router_bias(model, loads, rate):
    """Aux-loss-free balancing (noaux_tc): nudge each expert's correction bias toward equal load."""
    if rate <= 0 or not loads:
        return
    moes = [m for m in model.modules() if isinstance(m, K.MoE)]
    for m, load in zip(moes, loads):
        b = m.gate.e_score_correction_bias
        b.add_(rate * torch.sign(load.mean() - load).to(b.dtype))


@torch.no_grad()
def evaluate(model, data, val, args, device, use_autocast):
    model.eval()
    tot, n = 0.0, 0
    for idx in data.epoch_batches(val, 0, args.seed, args.batch_tokens):
        _, ce, k, _, _ = compute_loss(model, data.collate(val, idx, args.pad_id), device, use_autocast,
                                      args.qat_now, 0.0, data.pixels)
        tot += float(ce)
        n += k
    model.train()
    return tot / max(n, 1)


def write_weight_parts(out, model, config, state, part_bytes=15 << 20):
    """The fp32 weights (and config, in part 0) as weights-K.pt files of at most part_bytes:
    what comes back from a GPU machine that returns files of at most 16 MiB."""
    os.makedirs(out, exist_ok=True)
    parts, cur, size = [], {}, 0
    for k, v in model.state_dict().items():
        nb = v.numel() * v.element_size()
        if cur and size + nb > part_bytes:
            parts.append(cur)
            cur, size = {}, 0
        cur[k] = v.detach().float().cpu()
        size += nb
    parts.append(cur)
    for i, p in enumerate(parts):
        blob = {"model": p}
        if i == 0:
            blob.update(config=config, step=state["step"], n_parts=len(parts))
        torch.save(blob, os.path.join(out, f"weights-{i}.pt"))


def load_weight_parts(out):
    """weights-K.pt parts -> {"model": state dict, "config": ..., "step": ...} (as ckpt.pt)."""
    first = torch.load(os.path.join(out, "weights-0.pt"), map_location="cpu")
    sd = dict(first["model"])
    for i in range(1, first["n_parts"]):
        sd.update(torch.load(os.path.join(out, f"weights-{i}.pt"), map_location="cpu")["model"])
    return {"model": sd, "config": first["config"], "step": first["step"]}


def save_ckpt(path, model, opt, state, config, args):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "config": config, "args": {k: v for k, v in vars(args).items() if not callable(v)},
                **state}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data")
    ap.add_argument("--out")
    ap.add_argument("--tokenizer", help="tokenizer dir: checks tiktoken ranks + 256 == vocab_size")
    ap.add_argument("--resume", help="ckpt.pt to continue from")
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-clock bound of this run")
    ap.add_argument("--total-steps", type=int, default=2000, help="length of the LR schedule (whole training)")
    ap.add_argument("--batch-tokens", type=int, default=32768, help="padded tokens per batch")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--aux-coef", type=float, default=1e-3, help="weight of the MoE load-balancing loss")
    ap.add_argument("--bias-update-rate", type=float, default=1e-3, help="aux-loss-free router bias step")
    ap.add_argument("--qat-fraction", type=float, default=0.1, help="MXFP4 fake-quant for the last part of training")
    ap.add_argument("--schedule-minutes", type=float, default=0,
                    help="LR schedule and QAT by training wall-clock time (stops when done), not by step")
    ap.add_argument("--init-from", help="start from the weights of a moonrun checkpoint dir (fine-tuning)")
    ap.add_argument("--weights-out", help="also write the model's fp32 weights as weights-K.pt parts of <= 15 MB")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--val-samples", type=int, default=64, help="held-out samples (0: none)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--save-every-min", type=float, default=3.0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-autocast", action="store_true", help="fp32 forward on CUDA too")
    ap.add_argument("--config", help="config.json to train instead of demo_config (experiments)")
    ap.add_argument("--make-random-data", metavar="DIR", help="write a random data dir and exit")
    args = ap.parse_args()
    if args.make_random_data:
        make_random_data(args.make_random_data)
        return
    assert args.data and args.out, "--data and --out are required"
    t_start = time.time()
    deadline = t_start + args.minutes * 60
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    use_autocast = device.type == "cuda" and not args.no_autocast
    if device.type == "cpu":
        torch.set_num_threads(max(torch.get_num_threads(), os.cpu_count() or 1))
    logf = open(os.path.join(args.out, "train_log.jsonl"), "a")

    def log(msg, **kv):
        print(msg, flush=True)
        if kv:
            logf.write(json.dumps(kv) + "\n")
            logf.flush()

    data = Data(args.data, args.max_len, log)
    n_base = data.vocab_size - demo_config.NUM_RESERVED_SPECIAL_TOKENS
    if args.tokenizer:
        nb = demo_config.count_base_tokens(os.path.join(args.tokenizer, "tiktoken.model"))
        assert nb == n_base, f"tokenizer has {nb} ranks but docs.json vocab_size {data.vocab_size} implies {n_base}"
    ckpt = None
    if args.resume:
        try:
            ckpt = torch.load(args.resume, map_location="cpu", weights_only=False)
        except TypeError:  # torch without weights_only
            ckpt = torch.load(args.resume, map_location="cpu")
    if ckpt is not None:
        config = ckpt["config"]
    elif args.config:
        with open(args.config) as f:
            config = json.load(f)
    else:
        config = demo_config.demo_config(n_base)
    cfg = K.K3Config.from_json(config)
    assert cfg.vocab_size == data.vocab_size, (cfg.vocab_size, data.vocab_size)
    args.pad_id = config.get("pad_token_id", cfg.vocab_size - 1)

    torch.manual_seed(args.seed)
    model = K.K3ForConditionalGeneration(cfg)
    model.init_weights(seed=args.seed, std=args.init_std)
    attach_vision_tower(model, config, args.seed, log)
    if args.init_from and ckpt is None:
        import safetensors_io
        sd = K.load_checkpoint_state(safetensors_io.load(args.init_from))
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not missing and not unexpected, (missing[:5], unexpected[:5])
        log(f"initialised from {args.init_from} ({len(sd)} tensors)")
    model.to(device)
    if getattr(model, "_tower", None) is not None:
        model._tower.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    log(f"model: {n_params / 1e6:.2f}M parameters ({n_expert / 1e6:.2f}M in routed experts), device {device}, "
        f"autocast {'bf16' if use_autocast else 'off'}")
    fused = {"fused": True} if device.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames \
        else {}
    opt = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, args.beta2), eps=1e-8,
                            **fused)
    val = data.split_validation(min(args.val_samples, len(data.samples) // 10), args.seed) if args.val_samples else []
    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "tokens_seen": 0, "train_seconds": 0.0}
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        for k in state:
            state[k] = ckpt.get(k, state[k])
        if "rng" in ckpt:
            torch.set_rng_state(ckpt["rng"])
        log(f"resumed {args.resume} at step {state['step']} (epoch {state['epoch']}, batch {state['batch_in_epoch']})")
        del ckpt
    ckpt_path = os.path.join(args.out, "ckpt.pt")

    def snapshot():
        s = dict(state)
        s["rng"] = torch.get_rng_state()
        save_ckpt(ckpt_path, model, opt, s, config, args)

    model.train()
    qat_start = int(args.total_steps * (1 - args.qat_fraction)) if args.qat_fraction > 0 else args.total_steps + 1
    t_run = time.time()
    args.train_seconds_now = lambda: state["train_seconds"] + (time.time() - t_run)

    def qat_on(step):
        if args.schedule_minutes:
            return args.qat_fraction > 0 and progress(step, args) >= 1 - args.qat_fraction
        return step >= qat_start
    batches = data.epoch_batches(data.samples, state["epoch"], args.seed, args.batch_tokens)
    last_save = time.time()
    win = {"ce": 0.0, "n": 0, "aux": 0.0, "steps": 0, "tok": 0, "t": time.time()}
    step_times = []
    stopped_by_clock = False
    while state["step"] < args.total_steps and not (args.schedule_minutes and progress(state["step"], args) >= 1):
        est = (np.median(step_times) if step_times else 5.0) * 1.5 + 20.0  # next step + a save
        if time.time() + est > deadline:
            stopped_by_clock = True
            break
        if state["batch_in_epoch"] >= len(batches):
            state["epoch"] += 1
            state["batch_in_epoch"] = 0
            batches = data.epoch_batches(data.samples, state["epoch"], args.seed, args.batch_tokens)
        t0 = time.time()
        step = state["step"]
        args.qat_now = qat_on(step)
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, args)
        batch = data.collate(data.samples, batches[state["batch_in_epoch"]], args.pad_id)
        loss, ce, n, aux, loads = compute_loss(model, batch, device, use_autocast, args.qat_now, args.aux_coef,
                                               data.pixels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        update_router_bias(model, loads, args.bias_update_rate)
        state["step"] += 1
        state["batch_in_epoch"] += 1
        real_tokens = int(batch[2].sum())
        state["tokens_seen"] += real_tokens
        win["ce"] += ce
        win["aux"] += aux
        win["n"] += n
        win["steps"] += 1
        win["tok"] += real_tokens
        if device.type == "cuda" and (state["step"] % args.log_every == 0 or len(step_times) < 3):
            torch.cuda.synchronize()
        step_times.append(time.time() - t0)
        step_times = step_times[-50:]
        if state["step"] % args.log_every == 0 or state["step"] == args.total_steps:
            dt = time.time() - win["t"]
            ce_mean = float(win["ce"]) / max(win["n"], 1)
            aux_mean = float(win["aux"]) / win["steps"]
            log(f"step {state['step']:6d} loss {ce_mean:.4f} aux {aux_mean:.3f} lr {lr_at(step, args):.2e} "
                f"gnorm {float(gnorm):.2f} {win['tok'] / dt:,.0f} tok/s {dt / win['steps']:.3f} s/step "
                f"{'qat ' if args.qat_now else ''}T{batch[0].shape[1]}x{batch[0].shape[0]} "
                f"[{time.time() - t_start:.0f}s]",
                step=state["step"], loss=ce_mean, aux=aux_mean, lr=lr_at(step, args), gnorm=float(gnorm),
                tok_per_s=win["tok"] / dt, s_per_step=dt / win["steps"], qat=args.qat_now,
                tokens_seen=state["tokens_seen"])
            win = {"ce": 0.0, "n": 0, "aux": 0.0, "steps": 0, "tok": 0, "t": time.time()}
        if val and args.eval_every and state["step"] % args.eval_every == 0:
            vl = evaluate(model, data, val, args, device, use_autocast)
            log(f"step {state['step']:6d} val_loss {vl:.4f}", step=state["step"], val_loss=vl)
        if time.time() - last_save > args.save_every_min * 60:
            snapshot()
            last_save = time.time()
    state["train_seconds"] = args.train_seconds_now()
    args.train_seconds_now = lambda: state["train_seconds"]
    if val:
        args.qat_now = qat_on(state["step"])
        vl = evaluate(model, data, val, args, device, use_autocast)
        log(f"final val_loss {vl:.4f} at step {state['step']}", step=state["step"], val_loss=vl)
    snapshot()
    if args.weights_out:
        write_weight_parts(args.weights_out, model, config, state)
    log(f"saved {ckpt_path} at step {state['step']}/{args.total_steps}"
        + (" (stopped by --minutes; continue with --resume)" if stopped_by_clock else " (done)"))


if __name__ == "__main__":
    main()
