"""The DSpark block draft model in plain PyTorch: the MLA-native layout of the Kimi-K3 DSpark drafts.

A draft proposes a block of `block_size` tokens in one forward. Its inputs:
  * context rows, one per already-verified position p: hidden_norm(fc(concat of the target's
    layer outputs ("taps") at p, in target_layer_ids order)), at RoPE position p;
  * block rows for an anchor a (the last verified token x_a): [embed(x_a), embed(mask) * (B-1)]
    at positions a .. a+B-1, embed = the TARGET's embed_tokens (shared, not in the draft).
The block rows run through `num_hidden_layers` pre-norm layers (DeepSeek-style MLA attention +
SiLU MLP). In every layer the keys/values are those of the context rows (their own kv_a/kv_b
projections of the context feature rows, no input_layernorm, the same layer weights) followed
by those of the block rows; a block row sees the context rows at positions < a and every row of
its own block (bidirectional), never another block. Slot k (row a+k) predicts x_{a+k+1}:
  logits_k = lm_head_target(norm(h_k)) + markov_w2(markov_w1[prev_k])
  confidence_k = sigmoid(confidence_head.proj([norm(h_k), markov_w1[prev_k]]))
with prev_0 = x_a and prev_k = the token in slot k-1 (teacher forcing: x_{a+k}; decoding: the
draft of slot k-1).

MLA (per layer): q = q_b(rmsnorm(q_a(x))) split per head into [nope | rope];
[c | k_pe] = kv_a_proj_with_mqa(x); per head [k_nope | v] = kv_b(rmsnorm(c)); k_pe is shared
by the heads; RoPE on q's rope part and k_pe rotates INTERLEAVED pairs (2i, 2i+1) by
pos * theta^(-2i/rope_dim); score = (q_nope.k_nope + q_rope.k_pe) / sqrt(nope + rope).
Every RMSNorm (also q_a_layernorm / kv_a_layernorm) uses the config's rms_norm_eps.

Tensor names (no "model." prefix) are the parameter names of DSparkDraft: fc.weight,
hidden_norm.weight, layers.{i}.{input_layernorm,post_attention_layernorm}.weight,
layers.{i}.self_attn.{q_a_proj,q_a_layernorm,q_b_proj,kv_a_proj_with_mqa,kv_a_layernorm,
kv_b_proj,o_proj}.weight, layers.{i}.mlp.{gate,up,down}_proj.weight, norm.weight,
markov_head.markov_w{1,2}.weight ([V, r] both), confidence_head.proj.{weight,bias}.
"""

import json
import math
from dataclasses import dataclass, field
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

import k3_torch as K


@dataclass
class DSparkConfig:
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 32
    v_head_dim: int = 64
    intermediate_size: int = 768
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    vocab_size: int = 2560
    block_size: int = 8
    mask_token_id: int = 2559
    target_layer_ids: List[int] = field(default_factory=lambda: [1, 3, 5, 7])
    markov_rank: int = 64

    def to_json(self):
        return {
            "architectures": ["DSparkDraftModel"],
            "model_type": "dspark",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "torch_dtype": "bfloat16",
            "dspark_config": {
                "block_size": self.block_size,
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "markov_rank": self.markov_rank,
                "markov_head_type": "vanilla",
                "enable_confidence_head": True,
                "confidence_head_with_markov": True,
            },
        }

    @staticmethod
    def from_json(c):
        d = c["dspark_config"]
        assert c.get("model_type") == "dspark" and c.get("rope_scaling") is None
        assert c.get("num_key_value_heads", c["num_attention_heads"]) == c["num_attention_heads"]
        assert d.get("markov_head_type", "vanilla") == "vanilla" and c.get("hidden_act", "silu") == "silu"
        return DSparkConfig(
            hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"],
            num_attention_heads=c["num_attention_heads"], q_lora_rank=c["q_lora_rank"],
            kv_lora_rank=c["kv_lora_rank"], qk_nope_head_dim=c["qk_nope_head_dim"],
            qk_rope_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
            intermediate_size=c["intermediate_size"], rms_norm_eps=c["rms_norm_eps"],
            rope_theta=float(c["rope_theta"]), max_position_embeddings=c.get("max_position_embeddings", 8192),
            vocab_size=c["vocab_size"], block_size=d["block_size"], mask_token_id=d["mask_token_id"],
            target_layer_ids=list(d["target_layer_ids"]), markov_rank=d["markov_rank"])

    @staticmethod
    def load(path):
        with open(path) as f:
            return DSparkConfig.from_json(json.load(f))


def rope_interleaved(x, pos, theta):
    """x [N, T, (h,) d], pos [N, T] -> x with pairs (2i, 2i+1) rotated by pos * theta^(-2i/d)."""
    d = x.shape[-1]
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)      # [d/2]
    ang = pos.to(torch.float64).unsqueeze(-1) * inv                                        # [N, T, d/2]
    cos, sin = ang.cos().to(cd), ang.sin().to(cd)
    if x.dim() == 4:
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    xf = x.to(cd)
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)
    return out.to(x.dtype)


def masked_attention(q, k, v, visible, scale):
    """q [N,Tq,h,E], k [N,Tk,h,E], v [N,Tk,h,Ev], visible [N,Tq,Tk] bool -> [N,Tq,h,Ev]."""
    if q.is_cuda and q.dtype != torch.float64:
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=visible.unsqueeze(1), scale=scale)
        return o.transpose(1, 2)
    s = torch.einsum("nqhe,nkhe->nhqk", q, k)
    with K.no_autocast(s):
        s = K._cdt(s) * scale
        s = s.masked_fill(~visible.unsqueeze(1), float("-inf"))
        p = torch.softmax(s, -1)
    return torch.einsum("nhqk,nkhe->nqhe", p.to(v.dtype), v)


class DraftMLA(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh = c.hidden_size, c.num_attention_heads
        self.c = c
        self.nh, self.nope, self.rope, self.vd, self.kv_lora = nh, c.qk_nope_head_dim, c.qk_rope_head_dim, \
            c.v_head_dim, c.kv_lora_rank
        self.q_a_proj = nn.Linear(H, c.q_lora_rank, bias=False)
        self.q_a_layernorm = K.RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = nn.Linear(c.q_lora_rank, nh * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, c.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = K.RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(nh * self.vd, H, bias=False)

    def keys_values(self, x, pos):
        """x [N, T, H] -> k [N, T, h, nope+rope] (k_pe roped, shared), v [N, T, h, vd]."""
        N, T, _ = x.shape
        ckv = self.kv_a_proj_with_mqa(x)
        c, k_pe = ckv[..., :self.kv_lora], ckv[..., self.kv_lora:]
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).reshape(N, T, self.nh, self.nope + self.vd)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        k_pe = rope_interleaved(k_pe, pos, self.c.rope_theta).to(k_nope.dtype)
        k = torch.cat([k_nope, k_pe.unsqueeze(2).expand(N, T, self.nh, self.rope)], -1)
        return k, v

    def forward(self, x, pos, ctx, ctx_pos, visible):
        """x [N, Tb, H] (normed block rows) at pos [N, Tb]; ctx [N, Tc, H] context feature rows at
        ctx_pos [N, Tc]; visible [N, Tb, Tc + Tb] bool."""
        N, Tb, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).reshape(N, Tb, self.nh, self.nope + self.rope)
        q = torch.cat([q[..., :self.nope], rope_interleaved(q[..., self.nope:], pos, self.c.rope_theta)], -1)
        kc, vc = self.keys_values(ctx, ctx_pos)
        kb, vb = self.keys_values(x, pos)
        k, v = torch.cat([kc, kb], 1), torch.cat([vc, vb], 1)
        q = q.to(k.dtype)
        o = masked_attention(q, k, v, visible, (self.nope + self.rope) ** -0.5)
        return self.o_proj(o.reshape(N, Tb, self.nh * self.vd))


class DraftMLP(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = K.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftMLA(c)
        self.post_attention_layernorm = K.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = DraftMLP(c.hidden_size, c.intermediate_size)


class MarkovHead(nn.Module):
    def __init__(self, V, r):
        super().__init__()
        self.markov_w1 = nn.Embedding(V, r)                 # weight [V, r]
        self.markov_w2 = nn.Linear(r, V, bias=False)        # weight [V, r]


class ConfidenceHead(nn.Module):
    def __init__(self, H, r):
        super().__init__()
        self.proj = nn.Linear(H + r, 1, bias=True)


class DSparkDraft(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        H = c.hidden_size
        self.fc = nn.Linear(len(c.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = K.RMSNorm(H, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = K.RMSNorm(H, c.rms_norm_eps)
        self.markov_head = MarkovHead(c.vocab_size, c.markov_rank)
        self.confidence_head = ConfidenceHead(H, c.markov_rank)

    @torch.no_grad()
    def init_weights(self, seed=0, std=0.02):
        gen = torch.Generator().manual_seed(seed)
        out_std = std / math.sqrt(2 * self.c.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.copy_(torch.randn(p.shape, generator=gen) * out_std)
            elif name.endswith("markov_w2.weight") or name.startswith("confidence_head"):
                p.zero_()  # the Markov bias and the confidence logit start at 0
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    def context_rows(self, taps):
        """taps [N, Tc, n_taps*H] (concat in target_layer_ids order) -> [N, Tc, H]."""
        return self.hidden_norm(self.fc(taps))

    def forward(self, block_emb, block_pos, ctx, ctx_pos, visible):
        """block_emb [N, Tb, H] (target embeddings of the block inputs), ctx = context_rows(...).
        Returns norm(h) [N, Tb, H]."""
        x = block_emb
        for layer in self.layers:
            x = x + layer.self_attn(layer.input_layernorm(x), block_pos, ctx, ctx_pos, visible).to(x.dtype)
            x = x + layer.mlp(layer.post_attention_layernorm(x)).to(x.dtype)
        return self.norm(x)

    def markov_bias(self, prev):
        """prev [...] token ids -> [..., V]."""
        return self.markov_head.markov_w2(self.markov_head.markov_w1(prev))

    def confidence_logit(self, hn, prev, detach=False):
        m = self.markov_head.markov_w1(prev)
        if detach:
            m = m.detach()
        return self.confidence_head.proj(torch.cat([hn, m.to(hn.dtype)], -1))[..., 0]


def block_visibility(anchors, block_size, n_ctx):
    """anchors [N, A] -> visible [N, A*B, n_ctx + A*B]: context p < anchor, own block only."""
    N, A = anchors.shape
    B = block_size
    dev = anchors.device
    a_row = anchors.repeat_interleave(B, 1)                                   # [N, A*B]
    ctx_vis = torch.arange(n_ctx, device=dev).view(1, 1, -1) < a_row.unsqueeze(-1)
    blk = torch.arange(A * B, device=dev) // B
    blk_vis = (blk.view(-1, 1) == blk.view(1, -1)).unsqueeze(0).expand(N, -1, -1)
    return torch.cat([ctx_vis, blk_vis], -1)


def draft_block(draft, embed, lm_head, taps, anchor_tokens, anchors, prev=None, greedy=True, detach_conf=False):
    """One block per anchor. taps [N, Tc, n_taps*H] (context rows at positions 0..Tc-1),
    anchor_tokens / anchors [N, A]. Greedy: prev_k = the draft of slot k-1 (prev_0 = the
    anchor token); else prev [N, A, B] given (teacher forcing).
    detach_conf: the confidence head sees detached features (training: a probe).
    Returns (logits [N, A, B, V] corrected, tokens [N, A, B], confidence logits [N, A, B])."""
    c = draft.c
    B = c.block_size
    N, A = anchors.shape
    dev = anchors.device
    inp = torch.full((N, A, B), c.mask_token_id, dtype=torch.long, device=dev)
    inp[:, :, 0] = anchor_tokens
    pos = (anchors.unsqueeze(-1) + torch.arange(B, device=dev)).reshape(N, A * B)
    ctx = draft.context_rows(taps)
    ctx_pos = torch.arange(taps.shape[1], device=dev).unsqueeze(0).expand(N, -1)
    vis = block_visibility(anchors, B, taps.shape[1])
    hn = draft(embed(inp.reshape(N, A * B)).to(ctx.dtype), pos, ctx, ctx_pos, vis).reshape(N, A, B, -1)
    base = lm_head(hn)
    if not greedy:
        conf = draft.confidence_logit(hn.detach() if detach_conf else hn, prev, detach=detach_conf)
        return base + draft.markov_bias(prev).to(base.dtype), None, conf
    logits, toks, confs = [], [], []
    p = anchor_tokens
    for k in range(B):
        lg = base[:, :, k] + draft.markov_bias(p).to(base.dtype)
        confs.append(draft.confidence_logit(hn[:, :, k], p))
        logits.append(lg)
        p = lg.argmax(-1)
        toks.append(p)
    return torch.stack(logits, 2), torch.stack(toks, 2), torch.stack(confs, 2)


# ---------------------------------------------------------------------------- checkpoint

F32_SUFFIXES = ("norm.weight", "layernorm.weight")


def checkpoint_tensors(draft):
    """State dict -> the stored tensors: the RMSNorm weights F32, the rest BF16."""
    out = {}
    for name, t in draft.state_dict().items():
        t = t.detach().cpu()
        out[name] = t.float().contiguous() if name.endswith(F32_SUFFIXES) else t.float().to(torch.bfloat16).contiguous()
    return out


def load_draft(path, dtype=torch.float32):
    """A draft checkpoint dir (config.json + model.safetensors) -> DSparkDraft in `dtype`."""
    import os
    import safetensors_io as st
    c = DSparkConfig.load(os.path.join(path, "config.json"))
    d = DSparkDraft(c)
    tensors = st.load(path)
    d.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=True)
    return d.to(dtype).eval()
