"""The Kimi K3 text model in plain PyTorch (K3_SPEC.md section 2), for training and checking.

Parameter names map 1:1 onto the checkpoint tensor names (`language_model.model.*`,
`language_model.lm_head.weight`); routed experts are held dequantised as
`...experts.E.w{1,2,3}.weight` (the checkpoint stores them as MXFP4 `weight_packed` +
`weight_scale`, see mxfp4_quantize / mxfp4_dequantize and load_checkpoint_state).

Two forward paths share the modules:
  * kda_mode="chunked": the training path. KDA in the chunked WY form (chunk 64) with fp32
    math (fp64 when the model is float64), causal MLA over the whole padded batch. Right
    padding needs no attention mask (every layer is causal); `token_mask` only keeps padding
    out of the MoE balance statistics.
  * kda_mode="recurrent": the defining token-by-token KDA recurrence; with model.double()
    this is the float64 reference used by check_text.py / export.py.
Works on torch 1.13 (CPU) and torch 2.x (CUDA, bf16 autocast with fp32 master weights).
"""

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------- config


@dataclass
class K3Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    situ_beta: float = 1.0
    situ_linear_beta: float = 0.0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mla_use_output_gate: bool = False
    layer_is_kda: List[bool] = field(default_factory=list)
    kda_num_heads: int = 0
    kda_head_dim: int = 0
    kda_conv_kernel: int = 4
    gate_lower_bound: Optional[float] = None
    kda_full_rank_gate: bool = False
    attn_res_block_size: int = 0
    num_experts: int = 0
    num_experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    routed_expert_hidden_size: int = 0
    latent_moe_use_norm: bool = False
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    moe_renormalize: bool = True
    routed_scaling_factor: float = 1.0
    num_expert_group: int = 1
    topk_group: int = 1
    mxfp4_experts: bool = False
    tie_word_embeddings: bool = False

    @staticmethod
    def from_json(cfg):
        """From a config.json dict: top-level kimi_k3 (nested text_config) or the text config."""
        tc = cfg.get("text_config", cfg)
        n = tc["num_hidden_layers"]
        la = tc.get("linear_attn_config") or {}
        kda_layers = set(la.get("kda_layers") or [])
        full = set(la.get("full_attn_layers") or [])
        assert not (kda_layers & full)
        is_kda = [(i + 1) in kda_layers for i in range(n)]
        q = tc.get("quantization_config") or cfg.get("quantization_config") or {}
        act = tc.get("hidden_act", "silu")
        assert act in ("situ", "silu"), act
        assert tc.get("moe_router_activation_func", "sigmoid") == "sigmoid"
        assert tc.get("mla_use_nope", False), "K3 MLA is NoPE"
        return K3Config(
            vocab_size=tc["vocab_size"],
            hidden_size=tc["hidden_size"],
            num_hidden_layers=n,
            num_attention_heads=tc["num_attention_heads"],
            intermediate_size=tc.get("intermediate_size") or 0,
            rms_norm_eps=tc.get("rms_norm_eps", 1e-6),
            hidden_act=act,
            situ_beta=(tc.get("activation_situ_beta") or 1.0) if act == "situ" else 1.0,
            situ_linear_beta=(tc.get("activation_situ_linear_beta") or 0.0) if act == "situ" else 0.0,
            q_lora_rank=tc.get("q_lora_rank") or 0,
            kv_lora_rank=tc["kv_lora_rank"],
            qk_nope_head_dim=tc["qk_nope_head_dim"],
            qk_rope_head_dim=tc.get("qk_rope_head_dim") or 0,
            v_head_dim=tc["v_head_dim"],
            mla_use_output_gate=bool(tc.get("mla_use_output_gate", False)),
            layer_is_kda=is_kda,
            kda_num_heads=la.get("num_heads", 0),
            kda_head_dim=la.get("head_dim", 0),
            kda_conv_kernel=la.get("short_conv_kernel_size", 4),
            gate_lower_bound=la.get("gate_lower_bound"),
            kda_full_rank_gate=bool(la.get("use_full_rank_gate", False)),
            attn_res_block_size=tc.get("attn_res_block_size") or 0,
            num_experts=tc.get("num_experts") or 0,
            num_experts_per_token=tc.get("num_experts_per_token") or 0,
            num_shared_experts=tc.get("num_shared_experts") or 0,
            moe_intermediate_size=tc.get("moe_intermediate_size") or 0,
            routed_expert_hidden_size=tc.get("routed_expert_hidden_size") or 0,
            latent_moe_use_norm=bool(tc.get("latent_moe_use_norm", False)),
            first_k_dense_replace=tc.get("first_k_dense_replace") or 0,
            moe_layer_freq=tc.get("moe_layer_freq") or 1,
            moe_renormalize=bool(tc.get("moe_renormalize", True)),
            routed_scaling_factor=float(tc.get("routed_scaling_factor") or 1.0),
            num_expert_group=tc.get("num_expert_group") or 1,
            topk_group=tc.get("topk_group") or 1,
            mxfp4_experts=q.get("format") == "mxfp4-pack-quantized",
            tie_word_embeddings=bool(tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        )

    def layer_is_moe(self, i):
        return self.num_experts > 0 and i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0

    @property
    def expert_io_dim(self):
        return self.routed_expert_hidden_size or self.hidden_size


# ---------------------------------------------------------------------------- helpers


def _cdt(x):
    """The compute dtype of the fp32 islands: float32, or float64 in the reference."""
    return x if x.dtype == torch.float64 else x.float()


class _NoAutocast:
    """Disables autocast for an fp32 island (works on torch 1.13 and 2.x)."""

    def __init__(self, device_type):
        self.ctx = torch.autocast(device_type=device_type, enabled=False)

    def __enter__(self):
        self.ctx.__enter__()

    def __exit__(self, *a):
        return self.ctx.__exit__(*a)


def no_autocast(x):
    return _NoAutocast("cuda" if x.is_cuda else "cpu")


class RMSNorm(nn.Module):
    """w * cast_back(x / sqrt(mean(x^2) + eps)), normalised in fp32 (fp64 in the reference)."""

    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        xf = _cdt(x)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def gated_activation(g, u, cfg):
    g, u = _cdt(g), _cdt(u)
    if cfg.hidden_act == "situ":
        b, lin = cfg.situ_beta, cfg.situ_linear_beta
        a = b * torch.tanh(g / b) * torch.sigmoid(g)
        return a * (lin * torch.tanh(u / lin) if lin > 0 else u)
    return F.silu(g) * u


def _linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)


# ---------------------------------------------------------------------------- MXFP4

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def mxfp4_quantize(w):
    """w [..., n] (n % 32 == 0) -> (codes u8 [..., n] one nibble per element, scales u8 [..., n/32]).

    Per 32 consecutive inputs: the E8M0 scale 2^e is the smallest power of two with
    max|w| / 2^e <= 6; each element rounds to the nearest e2m1 magnitude (ties toward the
    smaller one), bit 3 = sign (set for negative w, also when the magnitude rounds to 0).
    """
    *lead, n = w.shape
    assert n % 32 == 0, w.shape
    g = w.detach().double().reshape(*lead, n // 32, 32)
    amax = g.abs().amax(-1)
    # e = ceil(log2(amax / 6)): frexp gives amax/6 = m * 2^p, m in [0.5, 1).
    m, p = torch.frexp(amax / 6.0)
    e = torch.where(m == 0.5, p - 1, p)
    e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)
    scaled = g / torch.pow(2.0, e.double()).unsqueeze(-1)
    mids = torch.tensor(_FP4_MIDPOINTS, dtype=torch.float64, device=w.device)
    idx = torch.bucketize(scaled.abs().contiguous(), mids)  # 0..7, ties go to the lower code
    codes = idx + 8 * (g < 0).to(idx.dtype)
    return codes.reshape(*lead, n).to(torch.uint8), (e + 127).to(torch.uint8)


def mxfp4_dequantize(codes, scales, dtype=torch.float32):
    """Inverse of mxfp4_quantize: codes u8 [..., n] (one nibble each), scales u8 [..., n/32]."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float64, device=codes.device)
    c = codes.long()
    v = lut[c & 7] * (1.0 - 2.0 * ((c >> 3) & 1).double())
    s = torch.pow(2.0, scales.double() - 127.0)
    *lead, n = c.shape
    v = v.reshape(*lead, n // 32, 32) * s.unsqueeze(-1)
    return v.reshape(*lead, n).to(dtype)


def mxfp4_pack(codes):
    """codes u8 [out, in] -> weight_packed u8 [out, in/2] (low nibble = even element)."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def mxfp4_unpack(packed):
    p = packed.to(torch.uint8)
    return torch.stack([p & 15, p >> 4], dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


def mxfp4_fake_quant(w):
    """Quantise-dequantise with a straight-through gradient (training QAT)."""
    codes, scales = mxfp4_quantize(w)
    q = mxfp4_dequantize(codes, scales, dtype=w.dtype)
    return w + (q - w).detach()


# ---------------------------------------------------------------------------- KDA core


def kda_recurrent(q, k, v, g, beta, initial_state=None):
    """The defining recurrence. q, k [B,T,H,K] (normalised, q scaled), v [B,T,H,V],
    g [B,T,H,K] log-decay (<= 0), beta [B,T,H] in (0,1). Returns o [B,T,H,V], state [B,H,K,V]."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state
    outs = []
    for t in range(T):
        S = S * g[:, t].exp().unsqueeze(-1)
        k_t = k[:, t]
        pred = torch.einsum("bhk,bhkv->bhv", k_t, S)
        delta = (v[:, t] - pred) * beta[:, t].unsqueeze(-1)
        S = S + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(outs, 1), S


def _decayed_products(a, b, G, sub):
    """P[..., r, j] = sum_c a_r[c] b_j[c] exp(G_r[c] - G_j[c]) for j <= r (0 above the diagonal).

    a, b, G: [..., C, K]; G is the cumulative log-decay inside the chunk (non-increasing).
    Computed as matmuls over sub-chunks of `sub` rows so no exponent overflows: an
    off-diagonal block (rows of sub-chunk x, columns of sub-chunk y < x) splits the decay at
    the last row of y (both factors <= 1); a diagonal block splits it at its middle row
    (|exponent| <= sub/2 * max|g|, 40 for K3's bound -5 in 16 rows).
    """
    C, K = a.shape[-2:]
    ns = C // sub
    a4 = a.reshape(*a.shape[:-2], ns, sub, K)
    b4 = b.reshape(*b.shape[:-2], ns, sub, K)
    G4 = G.reshape(*G.shape[:-2], ns, sub, K)
    lim = 80.0 if G.dtype != torch.float64 else 700.0
    # Off-diagonal: [..., x, y, r, K] * [..., y, j, K].
    ref = G4[..., -1, :]                                                   # [..., y, K]
    left = a4.unsqueeze(-3) * torch.exp((G4.unsqueeze(-3) - ref.unsqueeze(-2).unsqueeze(-4)).clamp(max=0.0))
    right = b4 * torch.exp(ref.unsqueeze(-2) - G4)                          # [..., y, j, K]
    off = torch.matmul(left, right.unsqueeze(-4).transpose(-1, -2))        # [..., x, y, r, j]
    # Diagonal: split at the middle row.
    mid = G4[..., sub // 2:sub // 2 + 1, :]
    dl = a4 * torch.exp((G4 - mid).clamp(-lim, lim))
    dr = b4 * torch.exp((mid - G4).clamp(-lim, lim))
    diag = torch.matmul(dl, dr.transpose(-1, -2))                          # [..., x, r, j]
    eye_s = torch.eye(ns, dtype=torch.bool, device=a.device)
    full = torch.where(eye_s[:, :, None, None], diag.unsqueeze(-3), off)    # [..., x, y, r, j]
    full = full.transpose(-3, -2).reshape(*a.shape[:-2], C, C)             # [..., (x r), (y j)]
    keep = torch.ones(C, C, dtype=torch.bool, device=a.device).tril()
    return torch.where(keep, full, torch.zeros((), dtype=full.dtype, device=full.device))


def kda_chunked(q, k, v, g, beta, chunk=64, sub=16, initial_state=None):
    """The same map as kda_recurrent in the chunked WY form (matmuls; loops over T/chunk).

    Inside a chunk with cumulative decay G_r (per channel) and entry state S0:
      u_r  = beta_r (v_r - S0^T (k_r e^{G_r}) - sum_{j<r} [k_r . k_j e^{G_r-G_j}] u_j)
           => U = (I + A)^{-1} diag(beta) (V - K~ S0),  A_rj = beta_r k_r.k_j e^{G_r-G_j} (j<r)
      o_r  = S0^T (q_r e^{G_r}) + sum_{j<=r} [q_r . k_j e^{G_r-G_j}] u_j
      S_C  = e^{G_C} * S0 + sum_j (k_j e^{G_C-G_j}) u_j^T
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    N = (T + pad) // chunk
    C = chunk

    def split(x):  # [B, N*C, H, D] -> [B, H, N, C, D]
        return x.reshape(B, N, C, H, x.shape[-1]).permute(0, 3, 1, 2, 4)

    q, k, v, g = split(q), split(k), split(v), split(g)
    beta = beta.reshape(B, N, C, H).permute(0, 3, 1, 2).unsqueeze(-1)    # [B, H, N, C, 1]
    G = g.cumsum(-2)
    Akk = _decayed_products(k, k, G, sub)
    Aqk = _decayed_products(q, k, G, sub)
    A = (Akk * beta).tril(-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    L = eye + A
    eG = torch.exp(G)
    W = torch.linalg.solve_triangular(L, k * eG * beta, upper=False, unitriangular=True)
    U0 = torch.linalg.solve_triangular(L, v * beta, upper=False, unitriangular=True)
    Qt = q * eG
    Kend = k * torch.exp(G[..., -1:, :] - G)
    dend = eG[..., -1, :].unsqueeze(-1)                                    # [B, H, N, K, 1]
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state
    outs = []
    # unbind once: per-chunk slicing would make autograd build a full-size gradient per slice
    for U0n, Wn, Qn, An, Kn, dn in zip(U0.unbind(2), W.unbind(2), Qt.unbind(2), Aqk.unbind(2),
                                       Kend.transpose(-1, -2).unbind(2), dend.unbind(2)):
        U = U0n - torch.matmul(Wn, S)
        outs.append(torch.matmul(Qn, S) + torch.matmul(An, U))
        S = dn * S + torch.matmul(Kn, U)
    o = torch.stack(outs, 2)                                               # [B, H, N, C, V]
    o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)
    return o[:, :T], S


# ---------------------------------------------------------------------------- layers


class ShortConv(nn.Module):
    """Causal depthwise conv1d (no bias) + SiLU; weight [D, 1, W] (fp32 in the checkpoint)."""

    def __init__(self, dim, kernel):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel))
        nn.init.uniform_(self.weight, -1.0 / math.sqrt(kernel), 1.0 / math.sqrt(kernel))

    def forward(self, x):  # [B, T, D]
        T, W = x.shape[1], self.weight.shape[-1]
        with no_autocast(x):
            xf = _cdt(x)
            w = self.weight[:, 0, :].to(xf.dtype)                  # [D, W]
            xp = F.pad(xf, (0, 0, W - 1, 0))                       # W-1 zero rows before t = 0
            # output t = sum_j w[:, j] * x[t - W + 1 + j] (shifted adds: cheap forward and backward)
            y = xp[:, W - 1:W - 1 + T] * w[:, W - 1]
            for j in range(W - 1):
                y = y + xp[:, j:j + T] * w[:, j]
            return F.silu(y)


class KDA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nh, d = cfg.hidden_size, cfg.kda_num_heads, cfg.kda_head_dim
        P = nh * d
        self.nh, self.d, self.eps = nh, d, cfg.rms_norm_eps
        self.lower_bound = cfg.gate_lower_bound
        self.q_proj, self.k_proj, self.v_proj = _linear(H, P), _linear(H, P), _linear(H, P)
        self.q_conv1d = ShortConv(P, cfg.kda_conv_kernel)
        self.k_conv1d = ShortConv(P, cfg.kda_conv_kernel)
        self.v_conv1d = ShortConv(P, cfg.kda_conv_kernel)
        self.A_log = nn.Parameter(torch.zeros(nh))
        self.dt_bias = nn.Parameter(torch.zeros(P))
        self.f_a_proj, self.f_b_proj = _linear(H, d), _linear(d, P)
        self.b_proj = _linear(H, nh)
        if cfg.kda_full_rank_gate:
            self.g_proj = _linear(H, P)
        else:
            self.g_a_proj, self.g_b_proj = _linear(H, d), _linear(d, P)
        self.o_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.o_proj = _linear(P, H)

    def forward(self, x, mode="chunked"):
        B, T, _ = x.shape
        nh, d = self.nh, self.d
        q = self.q_conv1d(self.q_proj(x))
        k = self.k_conv1d(self.k_proj(x))
        v = self.v_conv1d(self.v_proj(x))
        g_raw = self.f_b_proj(self.f_a_proj(x))
        beta = self.b_proj(x)
        gate = self.g_proj(x) if hasattr(self, "g_proj") else self.g_b_proj(self.g_a_proj(x))
        with no_autocast(x):
            cd = q.dtype  # fp32 (fp64 in the reference)
            q = q.reshape(B, T, nh, d)
            k = k.reshape(B, T, nh, d)
            v = v.reshape(B, T, nh, d)
            q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * (d ** -0.5)
            k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
            raw = g_raw.to(cd).reshape(B, T, nh, d) + self.dt_bias.to(cd).reshape(nh, d)
            a = self.A_log.to(cd).exp().reshape(nh, 1)
            if self.lower_bound is not None:
                g = self.lower_bound * torch.sigmoid(a * raw)
            else:
                g = -a * F.softplus(raw)
            beta = torch.sigmoid(beta.to(cd))
            if mode == "recurrent":
                o, _ = kda_recurrent(q, k, v, g, beta)
            else:
                o, _ = kda_chunked(q, k, v, g, beta)
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm.weight.to(cd)
            o = o * torch.sigmoid(gate.to(cd).reshape(B, T, nh, d))
        return self.o_proj(o.reshape(B, T, nh * d))


def causal_attention(q, k, v, scale):
    """q, k [B,T,h,E], v [B,T,h,Ev] -> [B,T,h,Ev]; softmax in fp32 (fp64 in the reference)."""
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None and q.dtype != torch.float64 and q.is_cuda:
        o = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale)
        return o.transpose(1, 2)
    T = q.shape[1]
    s = torch.einsum("bthe,bshe->bhts", q, k)
    with no_autocast(s):
        s = _cdt(s) * scale
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
    return torch.einsum("bhts,bshe->bthe", p.to(v.dtype), v)


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        self.nh, self.nope, self.rope, self.vd = nh, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_lora = cfg.kv_lora_rank
        qd = self.nope + self.rope
        if cfg.q_lora_rank:
            self.q_a_proj = _linear(H, cfg.q_lora_rank)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)
            self.q_b_proj = _linear(cfg.q_lora_rank, nh * qd)
        else:
            self.q_proj = _linear(H, nh * qd)
        self.kv_a_proj_with_mqa = _linear(H, cfg.kv_lora_rank + self.rope)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, 1e-6)
        self.kv_b_proj = _linear(cfg.kv_lora_rank, nh * (self.nope + self.vd))
        self.o_proj = _linear(nh * self.vd, H)
        if cfg.mla_use_output_gate:
            self.g_proj = _linear(H, nh * self.vd)

    def forward(self, x, mode="chunked"):
        B, T, _ = x.shape
        nh = self.nh
        if hasattr(self, "q_a_proj"):
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.reshape(B, T, nh, self.nope + self.rope)
        ckv = self.kv_a_proj_with_mqa(x)
        latent, k_pe = ckv[..., :self.kv_lora], ckv[..., self.kv_lora:]
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).reshape(B, T, nh, self.nope + self.vd)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        k = torch.cat([k_nope, k_pe.unsqueeze(2).expand(B, T, nh, self.rope).to(k_nope.dtype)], -1)
        q = q.to(k.dtype)
        qd = self.nope + self.rope
        if q.is_cuda and self.vd < qd and q.dtype != torch.float64:
            v = F.pad(v, (0, qd - self.vd))  # equal head dims let SDPA take its fastest kernel
        o = causal_attention(q, k, v, qd ** -0.5)[..., :self.vd]
        o = o.reshape(B, T, nh * self.vd)
        if hasattr(self, "g_proj"):
            o = o * torch.sigmoid(self.g_proj(x)).to(o.dtype)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg, hidden, inter):
        super().__init__()
        self.cfg = cfg
        self.gate_proj, self.up_proj, self.down_proj = _linear(hidden, inter), _linear(hidden, inter), _linear(inter, hidden)

    def forward(self, x):
        return self.down_proj(gated_activation(self.gate_proj(x), self.up_proj(x), self.cfg))


class Router(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.num_experts))


class Expert(nn.Module):
    def __init__(self, io, inter):
        super().__init__()
        self.w1, self.w2, self.w3 = _linear(io, inter), _linear(inter, io), _linear(io, inter)


class MoE(nn.Module):
    """LatentMoE: sigmoid router + correction bias, grouped top-k, routed experts in the latent
    space, latent norm, up-projection, plus the shared experts. Every expert runs on every token
    (dense), weighted by the routing weights (0 for unchosen experts)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, D, I = cfg.hidden_size, cfg.expert_io_dim, cfg.moe_intermediate_size
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(Expert(D, I) for _ in range(cfg.num_experts))
        if cfg.num_shared_experts:
            self.shared_experts = MLP(cfg, H, I * cfg.num_shared_experts)
        if cfg.routed_expert_hidden_size:
            self.routed_expert_down_proj = _linear(H, D)
            self.routed_expert_up_proj = _linear(D, H)
            if cfg.latent_moe_use_norm:
                self.routed_expert_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.margins = None  # set to a list to record routing margins (check/export)

    def route(self, x, token_mask=None):
        """x [N, H] -> (dense weights [N, E], sigmoid scores [N, E], chosen ids [N, k])."""
        cfg = self.cfg
        E, k = cfg.num_experts, cfg.num_experts_per_token
        with no_autocast(x):
            xf = _cdt(x)
            logits = F.linear(xf, self.gate.weight.to(xf.dtype))
            s = torch.sigmoid(logits)
            choice = s + self.gate.e_score_correction_bias.to(s.dtype)
            G, kg = cfg.num_expert_group, cfg.topk_group
            group_margin = None
            if G > 1 and G > kg:
                gs = choice.reshape(-1, G, E // G).topk(2, dim=-1).values.sum(-1)       # [N, G]
                top = gs.topk(kg, dim=-1)
                keep = torch.zeros_like(gs, dtype=torch.bool).scatter(1, top.indices, True)
                choice = choice.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
                if self.margins is not None:
                    srt = gs.sort(dim=-1, descending=True).values
                    group_margin = srt[:, kg - 1] - srt[:, kg]
            ids = choice.topk(k, dim=-1).indices
            w = s.gather(1, ids)
            if cfg.moe_renormalize and k > 1:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            w = w * cfg.routed_scaling_factor
            dense = torch.zeros_like(s).scatter(1, ids, w)
            if self.margins is not None:
                srt = choice.sort(dim=-1, descending=True).values
                m = srt[:, k - 1] - srt[:, k] if k < E else torch.full_like(srt[:, 0], float("inf"))
                if group_margin is not None:
                    m = torch.minimum(m, group_margin)
                if token_mask is not None:
                    m = m[token_mask]
                if m.numel():
                    self.margins.append(float(m.min()))
        return dense, s, ids

    def forward(self, x, fake_quant=False, token_mask=None):
        """x [B, T, H] (normed). Returns (out [B, T, H], aux loss scalar, expert load [E])."""
        cfg = self.cfg
        B, T, H = x.shape
        xf = x.reshape(B * T, H)
        tm = token_mask.reshape(-1) if token_mask is not None else None
        dense, s, ids = self.route(xf, tm)
        z = self.routed_expert_down_proj(xf) if hasattr(self, "routed_expert_down_proj") else xf
        E, I = cfg.num_experts, cfg.moe_intermediate_size
        D = z.shape[-1]
        W1 = torch.stack([e.w1.weight for e in self.experts])   # [E, I, D]
        W3 = torch.stack([e.w3.weight for e in self.experts])   # [E, I, D]
        W2 = torch.stack([e.w2.weight for e in self.experts])   # [E, D, I]
        if fake_quant:
            W1, W3, W2 = mxfp4_fake_quant(W1), mxfp4_fake_quant(W3), mxfp4_fake_quant(W2)
        W13 = torch.cat([W1.reshape(E * I, D), W3.reshape(E * I, D)], 0)
        h = F.linear(z, W13)                                      # [N, 2*E*I]
        a = gated_activation(h[:, :E * I], h[:, E * I:], cfg)     # [N, E*I] fp32
        a = (a.reshape(-1, E, I) * dense.to(a.dtype).unsqueeze(-1)).reshape(-1, E * I)
        y = F.linear(a, W2.permute(1, 0, 2).reshape(D, E * I))   # sum_e w_e * E_e(z)
        y = _cdt(y)
        if hasattr(self, "routed_expert_norm"):
            y = self.routed_expert_norm(y)
        if hasattr(self, "routed_expert_up_proj"):
            y = self.routed_expert_up_proj(y)
        out = _cdt(y)
        if hasattr(self, "shared_experts"):
            out = out + _cdt(self.shared_experts(xf))
        # Load balance (Switch-style): E * sum_e f_e * P_e over the real tokens.
        with no_autocast(s):
            p = s / s.sum(-1, keepdim=True)
            chosen = torch.zeros_like(s).scatter(1, ids, 1.0)
            if tm is not None:  # weights, not indexing: no host sync
                w = tm.to(s.dtype).unsqueeze(-1)
                p, chosen = p * w, chosen * w
                n = w.sum().clamp(min=1.0)
            else:
                n = float(max(p.shape[0], 1))
            load = chosen.sum(0).detach()
            aux = E * ((chosen.sum(0) / (n * cfg.num_experts_per_token)) * p.sum(0) / n).sum()
        return out.reshape(B, T, H), aux, load


class DecoderLayer(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        H = cfg.hidden_size
        self.is_kda = cfg.layer_is_kda[i]
        self.is_moe = cfg.layer_is_moe(i)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        if cfg.attn_res_block_size:
            self.self_attention_res_norm = RMSNorm(H, cfg.rms_norm_eps)
            self.self_attention_res_proj = _linear(H, 1)
            self.mlp_res_norm = RMSNorm(H, cfg.rms_norm_eps)
            self.mlp_res_proj = _linear(H, 1)
        self.self_attn = KDA(cfg) if self.is_kda else MLA(cfg)
        if self.is_moe:
            self.block_sparse_moe = MoE(cfg)
        else:
            self.mlp = MLP(cfg, H, cfg.intermediate_size)


def attn_res_mix(p, blocks, norm, proj, eps):
    """softmax over depth of (RMSNorm(V_i) . w_proj), applied to the raw V = [blocks..., p]."""
    with no_autocast(p):
        V = torch.stack([_cdt(b) for b in blocks] + [_cdt(p)], 0)          # [n, B, T, H]
        w = (norm.weight * proj.weight[0]).to(V.dtype)
        score = (V * w).sum(-1) * torch.rsqrt(V.pow(2).mean(-1) + eps)     # [n, B, T]
        prob = torch.softmax(score, 0)
        return (prob.unsqueeze(-1) * V).sum(0)


class K3Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.attn_res_block_size:
            self.output_attn_res_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.output_attn_res_proj = _linear(cfg.hidden_size, 1)


class K3LanguageModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.model = K3Model(cfg)
        self.lm_head = _linear(cfg.hidden_size, cfg.vocab_size)


class K3Output:
    def __init__(self, logits, hidden, aux_loss, expert_load, taps=None):
        self.logits, self.hidden, self.aux_loss, self.expert_load = logits, hidden, aux_loss, expert_load
        self.taps = taps  # {layer id: h after that layer} when forward(tap_layers=...) asked for them


class K3ForConditionalGeneration(nn.Module):
    """language_model.{model,lm_head}; vision_tower / mm_projector may be attached as
    submodules (their state-dict names then match the checkpoint's `vision_tower.*`,
    `mm_projector.*`)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.language_model = K3LanguageModel(cfg)

    # -- init --------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, seed=0, std=0.02):
        cfg = self.cfg
        gen = torch.Generator().manual_seed(seed)

        def normal_(t, s):
            t.copy_(torch.randn(t.shape, generator=gen) * s)

        out_std = std / math.sqrt(2 * cfg.num_hidden_layers)
        for name, p in self.language_model.named_parameters():
            leaf = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            elif leaf in ("self_attention_res_proj", "mlp_res_proj", "output_attn_res_proj"):
                p.zero_()  # uniform attention over depth at the start
            elif leaf.endswith("conv1d"):
                normal_(p, 0.0)
                p[:, 0, -1] = 1.0  # near-identity causal conv
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            elif leaf == "A_log":
                p.zero_()
            elif leaf == "dt_bias":
                # decay exp(g) at init: g = lb * sigmoid(dt_bias); log-uniform time constants 2..1000
                lb = abs(cfg.gate_lower_bound or 5.0)
                tau = torch.exp(torch.rand(p.shape, generator=gen) * (math.log(1000.0) - math.log(2.0)) + math.log(2.0))
                sig = (1.0 / tau) / lb
                p.copy_(torch.log(sig / (1 - sig)))
            elif leaf in ("o_proj", "down_proj", "w2", "routed_expert_up_proj"):
                normal_(p, out_std)
            elif leaf == "embed_tokens":
                normal_(p, std)
            else:
                normal_(p, std)
        for m in self.modules():
            if isinstance(m, Router):
                m.e_score_correction_bias.zero_()

    # -- forward -----------------------------------------------------------------------
    def forward(self, input_ids=None, inputs_embeds=None, embed_rows=None, kda_mode="chunked", fake_quant=False,
                token_mask=None, compute_logits=True, tap_layers=None):
        """input_ids [B, T] (right-padded; padding needs no mask, every layer is causal).
        inputs_embeds [B, T, H]: used instead of the lookup. embed_rows = (b_idx, t_idx, rows [n, H]):
        those positions take the given rows (image rows at their placeholders).
        token_mask [B, T] bool: real tokens (only for the MoE balance statistics).
        tap_layers: 0-based layer ids whose output `h` (under AttnRes the in-block running sum
        prefix + mlp_out, before any later mixing: what the C++ forward holds in `h` after the
        layer) comes back in out.taps (the DSpark draft's inputs); nothing changes otherwise."""
        cfg = self.cfg
        lm = self.language_model.model
        h = lm.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if embed_rows is not None:
            b_idx, t_idx, rows = embed_rows
            h = h.index_put((b_idx, t_idx), rows.to(h.dtype))
        h = _cdt(h)
        Bk = cfg.attn_res_block_size
        blocks = []
        aux = h.new_zeros(())
        loads = []
        taps = {} if tap_layers is not None else None
        for i, layer in enumerate(lm.layers):
            block_start = Bk > 0 and i % Bk == 0
            x = attn_res_mix(h, blocks, layer.self_attention_res_norm, layer.self_attention_res_proj,
                             cfg.rms_norm_eps) if (Bk > 0 and blocks) else h
            if block_start:
                blocks.append(h)
            a = _cdt(layer.self_attn(layer.input_layernorm(x), mode=kda_mode))
            prefix = a if block_start else h + a
            y = attn_res_mix(prefix, blocks, layer.mlp_res_norm, layer.mlp_res_proj, cfg.rms_norm_eps) if Bk > 0 else prefix
            yn = layer.post_attention_layernorm(y)
            if layer.is_moe:
                m, a_l, load = layer.block_sparse_moe(yn, fake_quant=fake_quant, token_mask=token_mask)
                aux = aux + a_l
                loads.append(load)
            else:
                m = layer.mlp(yn)
            h = prefix + _cdt(m)
            if taps is not None and i in tap_layers:
                taps[i] = h
        if Bk > 0:
            h = attn_res_mix(h, blocks, lm.output_attn_res_norm, lm.output_attn_res_proj, cfg.rms_norm_eps)
        h = lm.norm(h)
        n_moe = max(len(loads), 1)
        logits = self.language_model.lm_head(h) if compute_logits else None
        return K3Output(logits, h, aux / n_moe, loads, taps)

    def set_margin_recording(self, on):
        for m in self.modules():
            if isinstance(m, MoE):
                m.margins = [] if on else None

    def routing_margins(self):
        out = []
        for m in self.modules():
            if isinstance(m, MoE) and m.margins:
                out += m.margins
        return out


# ---------------------------------------------------------------------------- checkpoint <-> state dict

F32_SUFFIXES = ("A_log", "dt_bias", "q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight", "o_norm.weight",
                "e_score_correction_bias")


def is_f32_tensor(name):
    return name.endswith(F32_SUFFIXES)


def load_checkpoint_state(tensors, dtype=torch.float32):
    """Checkpoint tensors (safetensors names) -> state dict of K3ForConditionalGeneration (MXFP4 experts
    dequantised, everything converted to `dtype`)."""
    sd = {}
    for name, t in tensors.items():
        if name.endswith(".weight_scale"):
            continue
        if name.endswith(".weight_packed"):
            base = name[: -len(".weight_packed")]
            codes = mxfp4_unpack(t)
            sd[base + ".weight"] = mxfp4_dequantize(codes, tensors[base + ".weight_scale"], dtype)
        else:
            t2 = t.to(dtype)
            if name.endswith("self_attn.A_log"):
                t2 = t2.reshape(-1)
            sd[name] = t2
    return sd


def checkpoint_tensors(state_dict, cfg):
    """State dict -> checkpoint tensors in the release storage: routed experts MXFP4
    (weight_packed / weight_scale), the F32 ones F32, everything else BF16."""
    out = {}
    for name, t in state_dict.items():
        t = t.detach().cpu()
        if cfg.mxfp4_experts and ".block_sparse_moe.experts." in name:
            assert name.endswith(".weight"), name
            base = name[: -len(".weight")]
            codes, scales = mxfp4_quantize(t.float())
            out[base + ".weight_packed"] = mxfp4_pack(codes)
            out[base + ".weight_scale"] = scales
        elif is_f32_tensor(name):
            out[name] = t.float().contiguous()
        else:
            out[name] = t.float().to(torch.bfloat16).contiguous()
    return out
