"""A DFlash drafter in plain PyTorch, batched the way a user trains it (bench code for
the PyTorch comparison of issue 14; bench/pytorch_dflash.py drives it, and
bench/check_pytorch_dflash.py checks it against tests/fixtures/drafter).

Same math as common/model/drafter.h and tests/fixtures/drafter/make_fixture.py:
ctx = hidden_norm(fc(features)) over the T packed target tokens; a block is
[token at the anchor, MASK x (B-1)]; every layer's keys/values are
[k/v_proj(ctx) (no input_layernorm); k/v_proj(input_layernorm(block rows))], with the
context keys at their token positions and block row k at anchor position + k; a block
sees its sequence's context strictly before the anchor and its own B rows
(bidirectional), through one flex_attention call with a BlockMask over
KV = [context (T) | block rows (R = n_blocks * B)]. Loss: sum over rows k >= 1 of
exp(-(k-1)/gamma) * loss_mask[a+k] * CE(logits, token[a+k]) / the sum of the weights,
logits by the target's frozen LM head in row chunks (recomputed in the backward).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention
from torch.utils.checkpoint import checkpoint


def default_gamma(B):
    """drafter_default_gamma (common/model/drafter.c): 7 for B = 16."""
    if B < 8:
        return 0.5 * B
    if B <= 10:
        return 4.0 + 0.5 * (B - 8)
    if B <= 16:
        return 5.0 + (B - 10) / 3.0
    return 7.0 + (B - 16) / 3.0


def default_layer_ids(L, n):
    """DFlash build_target_layer_ids (target_default_layer_ids): L 36, n 5 -> [1, 9, 17, 25, 33]."""
    if n == 1:
        return [L // 2]
    return [int(round(1.0 + i * (L - 4) / (n - 1))) for i in range(n)]


def rms(x, w, eps):
    """Qwen3 RMSNorm: normalise in fp32, scale in x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w.to(x.dtype) * y.to(x.dtype)


def rope(x, cos, sin):
    """x (N, heads, hd); cos/sin (N, 1, hd) in x's dtype (rotate-half layout)."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


class Layer(nn.Module):
    def __init__(self, D, H, Hkv, hd, FF):
        super().__init__()
        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.q_proj = nn.Linear(D, H * hd, bias=False)
        self.k_proj = nn.Linear(D, Hkv * hd, bias=False)
        self.v_proj = nn.Linear(D, Hkv * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, D, bias=False)
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))
        self.input_layernorm = nn.Parameter(torch.ones(D))
        self.post_attention_layernorm = nn.Parameter(torch.ones(D))
        self.gate_proj = nn.Linear(D, FF, bias=False)
        self.up_proj = nn.Linear(D, FF, bias=False)
        self.down_proj = nn.Linear(FF, D, bias=False)

    def forward(self, x, ctx, rq, rk, block_mask, attn, eps):
        """x (R, D) block rows, ctx (T, D); rq = (cos, sin) of the R rows, rk of the T + R keys."""
        R, H, Hkv, hd = x.shape[0], self.H, self.Hkv, self.hd
        xn = rms(x, self.input_layernorm, eps)
        q = rms(self.q_proj(xn).view(R, H, hd), self.q_norm, eps)
        q = rope(q, rq[0].to(q.dtype), rq[1].to(q.dtype))
        kin = torch.cat([ctx.to(xn.dtype), xn], 0)
        k = rms(self.k_proj(kin).view(-1, Hkv, hd), self.k_norm, eps)
        k = rope(k, rk[0].to(k.dtype), rk[1].to(k.dtype))
        v = self.v_proj(kin).view(-1, Hkv, hd)
        o = attn(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                 block_mask=block_mask, enable_gqa=H != Hkv)
        x = x + self.o_proj(o[0].transpose(0, 1).reshape(R, H * hd))
        n2 = rms(x, self.post_attention_layernorm, eps)
        return x + self.down_proj(F.silu(self.gate_proj(n2)) * self.up_proj(n2))


class Drafter(nn.Module):
    """DFlashDraftModel: n_layers Qwen3 layers at the target's shapes; fc (D, n_feat*D)."""

    def __init__(self, D, H, Hkv, hd, FF, n_layers, n_feat, eps, theta):
        super().__init__()
        self.D, self.hd, self.eps, self.theta = D, hd, eps, theta
        self.layers = nn.ModuleList([Layer(D, H, Hkv, hd, FF) for _ in range(n_layers)])
        self.fc = nn.Linear(n_feat * D, D, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(D))
        self.norm = nn.Parameter(torch.ones(D))

    def init_random(self, std=0.02, seed=0):
        """N(0, std^2) matrices, in place on the parameters' device (norms stay 1)."""
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, std)

    def load_public(self, named):
        """Weights under the public names (layers.i.self_attn.q_proj.weight, fc.weight, ...)."""
        own = dict(self.named_parameters())
        with torch.no_grad():
            for name, t in named.items():
                key = name.replace("self_attn.", "").replace("mlp.", "")
                key = key[:-len(".weight")] if key.endswith("norm.weight") or key.endswith("layernorm.weight") else key
                own[key].copy_(t)

    def public_grad(self, name):
        key = name.replace("self_attn.", "").replace("mlp.", "")
        key = key[:-len(".weight")] if key.endswith("norm.weight") or key.endswith("layernorm.weight") else key
        return dict(self.named_parameters())[key].grad

    def rope_tables(self, pos):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.int64, device=pos.device).float()
                                    / self.hd))
        f = pos.float()[:, None] * inv[None, :]
        emb = torch.cat([f, f], -1)[:, None, :]
        return emb.cos(), emb.sin()

    def hidden(self, batch, features, embed, attn):
        """Final normed hidden states of every block row (R, D)."""
        ctx = rms(self.fc(features), self.hidden_norm, self.eps)
        x = F.embedding(batch["blk_ids"], embed)
        rq = self.rope_tables(batch["blk_pos"])
        rk = self.rope_tables(torch.cat([batch["ctx_pos"], batch["blk_pos"]]))
        for layer in self.layers:
            x = layer(x, ctx, rq, rk, batch["block_mask"], attn, self.eps)
        return rms(x, self.norm, self.eps)


def _chunk_loss(h, lm_head, tgt, w):
    logits = F.linear(h, lm_head).float()
    return (F.cross_entropy(logits, tgt, reduction="none") * w).sum()


def weighted_loss(h, lm_head, tgt, w, chunk_rows):
    """sum_i w_i CE(h_i @ lm_head^T, tgt_i) in row chunks; each chunk's logits are
    recomputed in the backward (never all R x V at once)."""
    total = h.new_zeros((), dtype=torch.float32)
    for r0 in range(0, h.shape[0], chunk_rows):
        sl = slice(r0, r0 + chunk_rows)
        if torch.is_grad_enabled() and h.requires_grad:
            total = total + checkpoint(_chunk_loss, h[sl], lm_head, tgt[sl], w[sl], use_reentrant=False)
        else:
            total = total + _chunk_loss(h[sl], lm_head, tgt[sl], w[sl])
    return total


def make_batch(ids, mask, cu, anchors, B, gamma, mask_token, device):
    """Host arrays of one micro-batch -> device tensors + BlockMask.
    ids (T,) int32, mask (T,) uint8, cu (nseq+1,) int32, anchors (n_blocks,) packed indices."""
    T, nb = len(ids), len(anchors)
    seq = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
    pos = np.arange(T) - cu[seq]
    a = np.asarray(anchors, np.int64)
    k = np.arange(B)
    tpos = a[:, None] + k[None, :]                      # packed index each row predicts
    end = cu[seq[a] + 1][:, None]
    inside = (tpos < end) & (k[None, :] >= 1)
    tposc = np.minimum(tpos, T - 1)
    wk = np.exp(-(k - 1) / gamma)
    w = np.where(inside, wk[None, :] * mask[tposc], 0.0)
    tgt = np.where(inside, ids[tposc], 0)
    blk_ids = np.full((nb, B), mask_token, np.int64)
    blk_ids[:, 0] = ids[a]
    dv = dict(device=device)
    kv_seq = torch.tensor(np.concatenate([seq, np.full(nb * B, -1)]), **dv)
    kv_blk = torch.tensor(np.concatenate([np.full(T, -1), np.repeat(np.arange(nb), B)]), **dv)
    blk_seq = torch.tensor(seq[a], **dv)
    blk_anchor = torch.tensor(a, **dv)

    def mask_mod(b, h, q, kv):
        qb = q // B
        ctx_ok = (kv_seq[kv] == blk_seq[qb]) & (kv < blk_anchor[qb])
        return ctx_ok | (kv_blk[kv] == qb)

    # compiled mask construction on the GPU (uncompiled it materialises R x (T + R) booleans)
    bm = create_block_mask(mask_mod, None, None, nb * B, T + nb * B, device=device,
                           _compile=str(device).startswith("cuda"))
    return {
        "T": T, "n_blocks": nb, "block_mask": bm,
        "ctx_pos": torch.tensor(pos, **dv), "blk_pos": torch.tensor((pos[a][:, None] + k).reshape(-1), **dv),
        "blk_ids": torch.tensor(blk_ids.reshape(-1), **dv),
        "tgt": torch.tensor(tgt.reshape(-1).astype(np.int64), **dv), "w": torch.tensor(w.reshape(-1), dtype=torch.float32, **dv),
        "weight_sum": float(w.sum()), "sum_ctx": float((a - cu[seq[a]]).sum()),
    }


def drafter_loss(drafter, batch, features, embed, lm_head, attn, chunk_rows):
    """(loss_sum / weight_sum, loss_sum) of one micro-batch."""
    h = drafter.hidden(batch, features, embed, attn)
    s = weighted_loss(h, lm_head, batch["tgt"], batch["w"], chunk_rows)
    return s / max(batch["weight_sum"], 1e-20), s


def step_flops(D, H, Hkv, hd, FF, V, n_layers, n_feat, T, nb, B, sum_ctx):
    """Useful FLOPs of one drafter training step, as drafter_step_flops (common/model/drafter.c):
    3 x forward for the trained layers, 2 x for fc (weight grad only) and the LM head
    (activation grad only); attention over the visible keys exactly (sum_ctx = sum over
    blocks of their context rows); recomputation not counted."""
    Q, KV, R = H * hd, Hkv * hd, nb * B
    row_layer = D * Q + 2 * D * KV + Q * D + 3 * D * FF
    attn_layer = 2.0 * H * hd * B * (sum_ctx + nb * B)
    trained = n_layers * (R * row_layer + attn_layer + T * 2 * D * KV)
    return 2.0 * (3.0 * trained + 2.0 * T * n_feat * D * D + 2.0 * R * D * V)


def dense_attention(q, k, v, block_mask, enable_gqa):
    """The same attention through SDPA with the BlockMask's mask_mod made dense (CPU:
    FlexAttention has no CPU backward); for checks at tiny shapes only."""
    m = create_mask(block_mask.mask_mod, None, None, q.shape[-2], k.shape[-2], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=enable_gqa)


def attention_fn(kind):
    """'flex-compiled' (the GPU default: torch.compile(flex_attention)), 'flex' (eager), 'dense'."""
    if kind == "flex-compiled":
        return torch.compile(flex_attention)
    return flex_attention if kind == "flex" else dense_attention

