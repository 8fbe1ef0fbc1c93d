"""MoonViT-V2 vision tower + `patchmergerv2` projector, in PyTorch, as moonrun runs them.

Mirrors src/model/vision/moonvit.cpp (and vision_config.cpp, preprocess.cpp); see
/work/shared/K3_SPEC.md section 6. Works with torch 1.13 and 2.x; differentiable.

  patches [N, 3, p, p] -> patch embedding (Conv2d with stride = kernel, no bias, done as a
  linear over the patch's (c, y, x) values) + the learned position table [ph, pw, H],
  bilinearly resized (align_corners=False) to the image's grid (skipped at its own size)
  -> L x [RMSNorm -> wqkv -> 2-D RoPE -> bidirectional attention (per image) -> wo, residual;
          RMSNorm -> fc0 -> GELU(tanh) -> fc1, residual]
  -> final RMSNorm -> 2x2 merge (4 neighbouring patches side by side, slot k = ky*2 + kx)
  -> projector: Linear(4H, 4H) -> GELU(exact) -> Linear(4H, T) -> RMSNorm(eps projector_ln_eps)

Tower RMSNorm eps = float32's machine epsilon, 2^-23 (torch's nn.RMSNorm() for bf16/fp16/fp32).
No biases anywhere. RoPE: head_dim/2 complex pairs (x[2i], x[2i+1]); pair 2j turns by
column * theta^(-4j/d), pair 2j+1 by row * theta^(-4j/d), theta = 10000.
wqkv's output is [q (heads x d) | k | v], head h at columns h*d .. h*d+d of each.

Parameter names (VisionTower.state_dict()) are exactly the checkpoint's tensor names:
  vision_tower.patch_embed.proj.weight          [H, 3, p, p]
  vision_tower.patch_embed.pos_emb.weight       [ph, pw, H]
  vision_tower.encoder.blocks.{i}.norm0.weight  [H]
  vision_tower.encoder.blocks.{i}.norm1.weight  [H]
  vision_tower.encoder.blocks.{i}.wqkv.weight   [3 * qkv_hidden, H]
  vision_tower.encoder.blocks.{i}.wo.weight     [H, qkv_hidden]
  vision_tower.encoder.blocks.{i}.mlp.fc0.weight [I, H]
  vision_tower.encoder.blocks.{i}.mlp.fc1.weight [H, I]
  vision_tower.encoder.final_layernorm.weight   [H]
  mm_projector.proj.0.weight                    [4H, 4H]
  mm_projector.proj.2.weight                    [T, 4H]
  mm_projector.post_norm.weight                 [T]
All stored BF16 in the checkpoint (the C++ loader reads them as BF16 and widens to F32).
"""

import json
import math
import struct
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# nn.RMSNorm() without eps, as torch runs it: the machine epsilon of the type rms_norm
# computes in, float32 for bfloat16, float16 and float32 inputs alike (not the input dtype's
# own epsilon): 2^-23 whichever the checkpoint's torch_dtype.
NORM_EPS_BY_DTYPE = {
    "bfloat16": 2.0 ** -23,
    "float16": 2.0 ** -23,
    "float32": 2.0 ** -23,
}
CHECKPOINT_DTYPE = "BF16"  # every vision_tower.* / mm_projector.* tensor

_HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# ---- config ------------------------------------------------------------------------------

def _merge_kernel(vc):
    m = vc.get("merge_kernel_size", [2, 2])
    if isinstance(m, int):
        return m, m
    return int(m[0]), int(m[1])


def _resolved(vc, torch_dtype="bfloat16", text_hidden_size=None):
    """The fields the tower needs, with the reference's defaults (as vision_config.cpp)."""
    for key, want in (("norm_type", "rmsnorm"), ("attn_bias", False), ("linear_bias", False),
                      ("patch_embed_proj_bias", False), ("mlp_type", "mlp2"),
                      ("activation_func", "gelu_pytorch_tanh"), ("pos_emb_type", "divided_fixed"),
                      ("pos_emb_interpolation_mode", "bilinear"), ("merge_type", "sd2_tpool"),
                      ("mm_projector_type", "patchmergerv2"), ("projector_hidden_act", "gelu")):
        got = vc.get(key, want)
        if got is None:
            got = want
        if got != want:
            raise ValueError("vision_config.%s is %r; moonrun runs only %r" % (key, got, want))
    hidden = int(vc["vt_hidden_size"])
    qkv = vc.get("qkv_hidden_size", 1536)
    qkv = hidden if qkv is None else int(qkv)
    mh, mw = _merge_kernel(vc)
    th = text_hidden_size if text_hidden_size is not None else vc.get("text_hidden_size")
    if th is None:
        raise ValueError("text_hidden_size: give it or put it in vision_config")
    if vc.get("mm_hidden_size") not in (None, hidden):
        raise ValueError("vision_config.mm_hidden_size must equal vt_hidden_size")
    r = dict(
        patch_size=int(vc.get("patch_size", 14)),
        merge_h=mh, merge_w=mw,
        pos_h=int(vc.get("init_pos_emb_height", 64)),
        pos_w=int(vc.get("init_pos_emb_width", 64)),
        num_heads=int(vc.get("vt_num_attention_heads", 12)),
        num_layers=int(vc.get("vt_num_hidden_layers", 27)),
        hidden=hidden,
        intermediate=int(vc.get("vt_intermediate_size", 4096)),
        qkv_hidden=qkv,
        norm_eps=NORM_EPS_BY_DTYPE[torch_dtype or "bfloat16"],
        projector_eps=float(vc.get("projector_ln_eps", 1e-5) or 1e-5),
        text_hidden=int(th),
    )
    if r["qkv_hidden"] % r["num_heads"] or (r["qkv_hidden"] // r["num_heads"]) % 4:
        raise ValueError("qkv_hidden_size must split into heads of a multiple of 4 (2-D RoPE)")
    return r


# ---- building blocks ---------------------------------------------------------------------

class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight; computed in float32 for 16-bit inputs."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight.to(x.dtype)


class PosEmb(nn.Module):
    """The learned [ph, pw, H] table, resized bilinearly to each image's grid."""

    def __init__(self, h, w, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(h, w, dim))

    def for_grid(self, gh, gw):
        t = self.weight
        if (gh, gw) != tuple(t.shape[:2]):
            src = t.permute(2, 0, 1).unsqueeze(0)  # [1, H, ph, pw]
            cast = src.dtype in (torch.float16, torch.bfloat16)
            r = F.interpolate(src.float() if cast else src, size=(gh, gw), mode="bilinear", align_corners=False)
            t = r[0].permute(1, 2, 0).to(t.dtype)
        return t.reshape(gh * gw, t.shape[-1])  # raster order


class PatchEmbed(nn.Module):
    def __init__(self, c):
        super().__init__()
        p, H = c["patch_size"], c["hidden"]
        self.proj = nn.Conv2d(3, H, kernel_size=p, stride=p, bias=False)  # weight [H, 3, p, p]
        self.pos_emb = PosEmb(c["pos_h"], c["pos_w"], H)

    def forward(self, pv, gh, gw):
        # pv [B, n, 3, p, p] -> [B, n, H]: Conv2d at stride = kernel is one dot product per patch.
        B, n = pv.shape[:2]
        x = F.linear(pv.reshape(B, n, -1), self.proj.weight.reshape(self.proj.weight.shape[0], -1))
        return x + self.pos_emb.for_grid(gh, gw).to(x.dtype)


class MLP2(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.fc0 = nn.Linear(H, I, bias=False)
        self.fc1 = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.fc1(F.gelu(self.fc0(x), approximate="tanh"))


def _rotate(x, cos, sin):
    # x [B, heads, n, d]; cos/sin [n, d/2]: pair i = (x[2i], x[2i+1]) times (cos + i sin).
    # 16-bit inputs (autocast) rotate in float32 and are rounded back.
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    return torch.stack((y0, y1), dim=-1).flatten(-2).to(x.dtype)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, Q = c["hidden"], c["qkv_hidden"]
        self.num_heads = c["num_heads"]
        self.head_dim = Q // c["num_heads"]
        self.norm0 = RMSNorm(H, c["norm_eps"])
        self.norm1 = RMSNorm(H, c["norm_eps"])
        self.wqkv = nn.Linear(H, 3 * Q, bias=False)
        self.wo = nn.Linear(Q, H, bias=False)
        self.mlp = MLP2(H, c["intermediate"])
        self.use_sdpa = _HAS_SDPA

    def attention(self, x, cos, sin):
        B, n, _ = x.shape
        nh, d = self.num_heads, self.head_dim
        qkv = self.wqkv(x).reshape(B, n, 3, nh, d).permute(2, 0, 3, 1, 4)  # [3, B, heads, n, d]
        q, k, v = qkv[0], qkv[1], qkv[2]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.use_sdpa:
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
            if s.dtype in (torch.float16, torch.bfloat16):
                p = torch.softmax(s.float(), dim=-1).to(v.dtype)
            else:
                p = torch.softmax(s, dim=-1)
            o = torch.matmul(p, v)
        return self.wo(o.transpose(1, 2).reshape(B, n, nh * d))

    def forward(self, x, cos, sin):
        x = x + self.attention(self.norm0(x), cos, sin)
        return x + self.mlp(self.norm1(x))


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.blocks = nn.ModuleList([Block(c) for _ in range(c["num_layers"])])
        self.final_layernorm = RMSNorm(c["hidden"], c["norm_eps"])

    def forward(self, x, cos, sin):
        for b in self.blocks:
            x = b(x, cos, sin)
        return self.final_layernorm(x)


class MoonViT(nn.Module):
    """`vision_tower.*`: patches of B same-grid images -> [B, gh*gw, H] (final-normed)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.patch_embed = PatchEmbed(c)
        self.encoder = Encoder(c)
        self._rope_cache = {}

    def rope(self, gh, gw, device, dtype, theta=10000.0):
        key = (gh, gw, str(device), dtype)
        if key not in self._rope_cache:
            d = self.c["qkv_hidden"] // self.c["num_heads"]
            quarter = d // 4
            # As rope_table(): freqs and angles in float32.
            freqs = 1.0 / torch.pow(torch.tensor(theta, dtype=torch.float32),
                                    torch.arange(quarter, dtype=torch.float32) * 4.0 / d)
            ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float32),
                                    torch.arange(gw, dtype=torch.float32), indexing="ij")
            ax = xs.reshape(-1, 1) * freqs  # [n, d/4] column angles: pairs 2j
            ay = ys.reshape(-1, 1) * freqs  # row angles: pairs 2j+1
            ang = torch.stack((ax, ay), dim=-1).reshape(gh * gw, d // 2)
            self._rope_cache[key] = (torch.cos(ang).to(device=device, dtype=dtype),
                                     torch.sin(ang).to(device=device, dtype=dtype))
        return self._rope_cache[key]

    def forward(self, pv, gh, gw):
        x = self.patch_embed(pv, gh, gw)
        # The angles in float32 (float64 when the tower runs in float64).
        cos, sin = self.rope(gh, gw, x.device, torch.float64 if x.dtype == torch.float64 else torch.float32)
        return self.encoder(x, cos, sin)


class PatchMergerV2(nn.Module):
    """`mm_projector.*`: merged rows [.., 4H] -> Linear -> GELU(exact) -> Linear -> RMSNorm."""

    def __init__(self, c):
        super().__init__()
        M = c["hidden"] * c["merge_h"] * c["merge_w"]
        self.proj = nn.Sequential(nn.Linear(M, M, bias=False), nn.GELU(), nn.Linear(M, c["text_hidden"], bias=False))
        self.post_norm = RMSNorm(c["text_hidden"], c["projector_eps"])

    def forward(self, x):
        return self.post_norm(self.proj(x))


def merge_patches(h, gh, gw, mh=2, mw=2):
    """sd2_tpool for one frame: [B, gh*gw, H] -> [B, (gh/mh)*(gw/mw), mh*mw*H], tokens in raster
    order of (gh/mh, gw/mw) blocks, each token's patches (ky, kx) side by side."""
    B, _, H = h.shape
    h = h.reshape(B, gh // mh, mh, gw // mw, mw, H).permute(0, 1, 3, 2, 4, 5)
    return h.reshape(B, (gh // mh) * (gw // mw), mh * mw * H)


# ---- the whole thing ---------------------------------------------------------------------

class VisionTower(nn.Module):
    """Vision tower + projector. state_dict() names = checkpoint names (see module doc).

    VisionTower(vision_config, torch_dtype="bfloat16", text_hidden_size=None)
      vision_config: config.json's "vision_config" dict; torch_dtype: the checkpoint's dtype
      (sets the tower's RMSNorm eps); text_hidden_size: overrides vision_config's.
    """

    def __init__(self, vision_config, torch_dtype="bfloat16", text_hidden_size=None):
        super().__init__()
        self.cfg = _resolved(vision_config, torch_dtype, text_hidden_size)
        self.vision_tower = MoonViT(self.cfg)
        self.mm_projector = PatchMergerV2(self.cfg)

    # -- shapes
    @property
    def patch_size(self):
        return self.cfg["patch_size"]

    def num_tokens(self, grid_hw):
        gh, gw = grid_hw
        return (gh // self.cfg["merge_h"]) * (gw // self.cfg["merge_w"])

    def set_sdpa(self, on):
        """Use F.scaled_dot_product_attention (torch >= 2) or the explicit softmax."""
        for b in self.vision_tower.encoder.blocks:
            b.use_sdpa = bool(on) and _HAS_SDPA

    # -- forward
    def forward_same_grid(self, pixel_values, grid_hw):
        """pixel_values [B, gh*gw, 3, p, p] (B images of one grid) -> [B, n_tokens, text_hidden]."""
        gh, gw = int(grid_hw[0]), int(grid_hw[1])
        c = self.cfg
        if pixel_values.dim() != 5 or pixel_values.shape[1] != gh * gw:
            raise ValueError("pixel_values %s do not fit grid %dx%d" % (tuple(pixel_values.shape), gh, gw))
        if gh % c["merge_h"] or gw % c["merge_w"]:
            raise ValueError("grid %dx%d is not a multiple of the merge kernel" % (gh, gw))
        h = self.vision_tower(pixel_values, gh, gw)
        return self.mm_projector(merge_patches(h, gh, gw, c["merge_h"], c["merge_w"]))

    def forward(self, pixel_values, grid_hw):
        """One image: pixel_values [gh*gw, 3, p, p] (raster order of patches), grid_hw = (gh, gw)
        (rows, columns of patches) -> [n_tokens, text_hidden], tokens in raster order."""
        return self.forward_same_grid(pixel_values.unsqueeze(0), grid_hw)[0]

    def forward_images(self, pixel_values_list, grids):
        """Several images (any grids): a list of [gh*gw, 3, p, p] and a list of (gh, gw) ->
        a list of [n_tokens_i, text_hidden] in the input order. Images sharing a grid run as
        one batch."""
        groups = {}
        for i, g in enumerate(grids):
            groups.setdefault((int(g[0]), int(g[1])), []).append(i)
        out = [None] * len(pixel_values_list)
        for g, idx in groups.items():
            rows = self.forward_same_grid(torch.stack([pixel_values_list[i] for i in idx]), g)
            for j, i in enumerate(idx):
                out[i] = rows[j]
        return out

    def encode(self, pixel_values_list, grids):
        """As MoonVit::encode: all images' rows concatenated in order, [sum n_tokens, text_hidden]."""
        return torch.cat(self.forward_images(pixel_values_list, grids), dim=0)

    # -- weights
    @torch.no_grad()
    def init_weights(self, seed=0):
        """Small-transformer init: norm weights 1; input-side projections N(0, 1/fan_in)
        (patch embed, wqkv, fc0, projector); residual outputs (wo, fc1) additionally / sqrt(2L);
        position table N(0, 0.02^2 * 25) (std 0.1, comparable to a patch embedding's scale)."""
        g = torch.Generator().manual_seed(int(seed))
        L = self.cfg["num_layers"]

        def normal_(p, std):
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std)

        for name, p in self.named_parameters():
            if name.endswith("norm0.weight") or name.endswith("norm1.weight") or "layernorm" in name \
                    or name.endswith("post_norm.weight"):
                p.fill_(1.0)
            elif name.endswith("pos_emb.weight"):
                normal_(p, 0.1)
            else:
                fan_in = p[0].numel()
                std = fan_in ** -0.5
                if name.endswith("wo.weight") or name.endswith("fc1.weight"):
                    std /= math.sqrt(2 * L)
                normal_(p, std)
        return self

    def checkpoint_tensors(self):
        """{checkpoint name: float32 CPU tensor}; the exporter stores each as BF16."""
        return {k: v.detach().float().cpu().contiguous() for k, v in self.state_dict().items()}

    @torch.no_grad()
    def load_checkpoint_tensors(self, tensors, strict=True):
        """Copy vision_tower.* / mm_projector.* tensors (any float dtype) into the parameters;
        other names are ignored. strict: every parameter must be present."""
        own = dict(self.named_parameters())
        seen = set()
        for name, t in tensors.items():
            if name not in own:
                continue
            if tuple(t.shape) != tuple(own[name].shape):
                raise ValueError("%s: shape %s, expected %s" % (name, tuple(t.shape), tuple(own[name].shape)))
            own[name].copy_(t.to(own[name].dtype))
            seen.add(name)
        missing = sorted(set(own) - seen)
        if strict and missing:
            raise KeyError("missing vision tensors: %s" % missing)
        return self


# ---- a private safetensors reader (float32 out) ---------------------------------------------

def read_safetensors(path, prefixes=("vision_tower.", "mm_projector.")):
    """{name: float32 torch tensor} for the tensors whose name starts with one of prefixes
    (None: all). BF16/F16/F32/F64 only."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or (prefixes and not name.startswith(tuple(prefixes))):
            continue
        a, b = meta["data_offsets"]
        raw, shape, dt = data[a:b], meta["shape"], meta["dtype"]
        if dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif dt == "F64":
            arr = np.frombuffer(raw, dtype="<f8").astype(np.float32)
        else:
            raise ValueError("%s: dtype %s not handled" % (name, dt))
        out[name] = torch.from_numpy(arr.reshape(shape).copy())
    return out


# ---- preprocessing (preprocess.cpp, for images that need no resize) -------------------------

DEFAULT_MEDIA_PROC_CFG = {  # the K3 release's media_proc_cfg (preprocess.h)
    "patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 65536, "patch_limit_on_one_side": 512,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}


def _media_cfg(cfg):
    if cfg is None:
        return dict(DEFAULT_MEDIA_PROC_CFG)
    if "media_proc_cfg" in cfg:
        cfg = cfg["media_proc_cfg"]
    out = dict(DEFAULT_MEDIA_PROC_CFG)
    out.update({k: v for k, v in cfg.items() if v is not None})
    return out


def plan_resize(width, height, media_proc_cfg=None):
    """plan_resize() of preprocess.cpp: dict(new_width, new_height, pad_width, pad_height,
    grid_h, grid_w, num_tokens)."""
    c = _media_cfg(media_proc_cfg)
    p, side, m = c["patch_size"], c["patch_limit_on_one_side"], c["merge_kernel_size"]
    s1 = math.sqrt(c["in_patch_limit"] / (max(1.0, float(width // p)) * max(1.0, float(height // p))))
    scale = min(1.0, s1, side * p / width, side * p / height)
    nw = min(max(1, int(width * scale)), side * p)
    nh = min(max(1, int(height * scale)), side * p)
    f = m * p
    ph, pw = (f - nh % f) % f, (f - nw % f) % f
    gh, gw = (nh + ph) // p, (nw + pw) // p
    if (gh // m) * m > side or (gw // m) * m > side:
        raise ValueError("image %dx%d does not fit %d patches a side" % (width, height, side))
    return dict(new_width=nw, new_height=nh, pad_width=pw, pad_height=ph, grid_h=gh, grid_w=gw,
                num_tokens=(gh // m) * (gw // m))


def _norm_lut(c):
    """[3, 256] float32: float32(v/255), then float32(x - mean), then float32(x * (1/std)) (the
    float64 steps of preprocess.cpp)."""
    lut = np.empty((3, 256), dtype=np.float32)
    v = np.arange(256, dtype=np.float64)
    for ch in range(3):
        x = (v / 255.0).astype(np.float32).astype(np.float64)
        x = (x - float(c["image_mean"][ch])).astype(np.float32).astype(np.float64)
        lut[ch] = (x * (1.0 / float(c["image_std"][ch]))).astype(np.float32)
    return lut


def make_pixel_values(rgb, media_proc_cfg=None):
    """8-bit RGB pixels -> what moonrun's preprocess gives the tower, for images that need no
    resize (at most in_patch_limit patches, at most patch_limit_on_one_side per side).

    rgb: uint8 array [H, W, 3] (one image) or [B, H, W, 3] (B images of one size).
    Returns (pixel_values, (grid_h, grid_w)): float32 torch tensor [gh*gw, 3, p, p] (or
    [B, gh*gw, 3, p, p]); patches in raster order (row of patches, then column), each patch's
    values as (channel, y, x). Padding (right and bottom, to a multiple of merge*patch = 28 px)
    is black before normalisation, i.e. -1 with mean = std = 0.5."""
    a = np.asarray(rgb)
    single = a.ndim == 3
    if single:
        a = a[None]
    if a.ndim != 4 or a.shape[-1] != 3 or a.dtype != np.uint8:
        raise ValueError("rgb must be uint8 [H, W, 3] or [B, H, W, 3], got %s %s" % (a.dtype, a.shape))
    c = _media_cfg(media_proc_cfg)
    B, H, W, _ = a.shape
    plan = plan_resize(W, H, c)
    if plan["new_width"] != W or plan["new_height"] != H:
        raise ValueError("image %dx%d would be resized to %dx%d (PIL bicubic); only images that need no "
                         "resize are handled here" % (W, H, plan["new_width"], plan["new_height"]))
    p, gh, gw = c["patch_size"], plan["grid_h"], plan["grid_w"]
    padded = np.zeros((B, gh * p, gw * p, 3), dtype=np.uint8)
    padded[:, :H, :W] = a
    lut = _norm_lut(c)
    vals = np.stack([lut[ch][padded[..., ch]] for ch in range(3)], axis=1)  # [B, 3, gh*p, gw*p]
    vals = vals.reshape(B, 3, gh, p, gw, p).transpose(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, 3, p, p)
    t = torch.from_numpy(np.ascontiguousarray(vals))
    return (t[0] if single else t), (gh, gw)


def decode_png(path_or_bytes):
    """A small PNG decoder: 8-bit gray / RGB / gray+alpha / RGBA, not interlaced -> uint8 [H, W, C]."""
    data = path_or_bytes
    if not isinstance(data, (bytes, bytearray)):
        with open(path_or_bytes, "rb") as f:
            data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    W, H, depth, ctype, _, _, interlace = ihdr
    chans = {0: 1, 2: 3, 4: 2, 6: 4}.get(ctype)
    if depth != 8 or chans is None or interlace:
        raise ValueError("PNG: only 8-bit gray/RGB/RGBA without interlace (depth %d, type %d)" % (depth, ctype))
    raw = zlib.decompress(b"".join(idat))
    stride = W * chans
    out = np.zeros((H, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(H):
        row = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        ft, line = row[0], np.frombuffer(row[1:], dtype=np.uint8).astype(np.int32)
        if ft == 0:
            cur = line
        elif ft == 2:
            cur = (line + prev) & 255
        else:  # 1 (sub), 3 (average), 4 (paeth): depend on the left neighbour, run bytewise
            cur = np.zeros(stride, dtype=np.int32)
            for i in range(stride):
                left = cur[i - chans] if i >= chans else 0
                up = prev[i]
                if ft == 1:
                    pred = left
                elif ft == 3:
                    pred = (left + up) >> 1
                else:
                    ul = prev[i - chans] if i >= chans else 0
                    pa, pb, pc = abs(up - ul), abs(left - ul), abs(left + up - 2 * ul)
                    pred = left if (pa <= pb and pa <= pc) else (up if pb <= pc else ul)
                cur[i] = (line[i] + pred) & 255
        out[y] = cur
        prev = cur
    return out.reshape(H, W, chans)
