"""Incremental decoding of a Qwen2- or Llama-family causal LM with a preallocated KV cache whose rows can be
dropped as they finish: the forward of the native sampler (sampler/native.py).

Why: for small models on a CPU, `generate()`'s time goes to per-step bookkeeping, not arithmetic (the embedded
default, 256 rows, ~20 ms a step: copies of the whole cache for grouped-query heads, a growing cache concatenated
every step, masks rebuilt), and every row stays in the batch until the longest one ends.

Contract:
- `unsupported(model)` is None for a model this decoder reproduces exactly, else the reason in words: the model
  types of `FAMILIES`, full attention on every layer (no sliding window), position embeddings that do not depend
  on the sequence length (`STATIC_ROPE`).
- `KVDecoder(model, rows_max_len)` reuses the model's own modules (embedding, norms, projections, MLPs, rotary
  embedding, output head; LoRA-wrapped projections included), so loaded weights are seen at once, and computes
  the attention itself. `prefill(ids, attention)` runs left-padded prompts [P, W] (attention 1 on real tokens)
  and returns the last position's logits [P, V]; `repeat(n)` gives each prompt n rows (row i*n + j is prompt i's
  j-th); `step(tokens)` appends one token per live row [B] and returns their logits [B, V]; `keep(rows)` drops
  every other row (indices into the live rows, ascending).
- Positions count real tokens only (a left-padded row's first real token is at position 0), as the trainer's
  forward counts them; padding columns are never attended to, so a row's logits are those of its own tokens.
- fp32 results equal the transformers forward within float rounding (tests/unit/test_native_sampler.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("qwen2", "llama")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # cos/sin of a position do not depend on the length


def _rope_type(config: object) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def unsupported(model: nn.Module) -> str | None:
    config = model.config
    if config.model_type not in FAMILIES:
        return f"model type {config.model_type!r} (the native sampler runs {', '.join(FAMILIES)})"
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if (rope := _rope_type(config)) not in STATIC_ROPE:
        return f"rope type {rope!r}"
    return None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVDecoder:
    def __init__(self, model: nn.Module, max_len: int) -> None:
        if (why := unsupported(model)) is not None:
            raise ValueError(f"the native decoder does not run this model: {why}")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PeftModel's LM
        self.inner, self.head = base.model, base.lm_head
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim ** -0.5
        self.max_len = max_len
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        # cos/sin of every position a row can reach, once: [max_len, head_dim]
        positions = torch.arange(max_len, device=self.device)[None]
        cos, sin = self.inner.rotary_emb(torch.zeros(1, dtype=self.dtype, device=self.device), positions)
        self.cos, self.sin = cos[0], sin[0]
        self.keys: list[torch.Tensor] = []  # per layer [B, kv_heads, max_len, head_dim]
        self.values: list[torch.Tensor] = []
        self.valid = torch.zeros(0, max_len, dtype=torch.bool, device=self.device)  # [B, max_len]: attendable
        self.position = torch.zeros(0, dtype=torch.long, device=self.device)  # [B]: next token's position
        self.column = 0  # the cache column the next token goes to (the same for every row)

    def _split(self, x: torch.Tensor, proj: nn.Module, heads: int) -> torch.Tensor:
        """[B, T, hidden] -> [B, heads, T, head_dim]"""
        b, t, _ = x.shape
        return proj(x).view(b, t, heads, self.head_dim).transpose(1, 2)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [B, 1, T, head_dim]
        return x * cos + _rotate_half(x) * sin

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        rows, width = ids.shape
        if width > self.max_len:
            raise ValueError(f"prompt width {width} exceeds the decoder's {self.max_len} positions")
        real = attention.to(self.device).bool()
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)
        # A query attends to earlier real tokens; a padding query to itself alone (finite, never read).
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        mask = (causal & real[:, None, :]) | torch.eye(width, dtype=torch.bool, device=self.device)
        x = self.inner.embed_tokens(ids.to(self.device))
        self.keys, self.values = [], []
        for layer in self.inner.layers:
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = self._rotate(self._split(h, attn.q_proj, self.heads), positions)
            k = self._rotate(self._split(h, attn.k_proj, self.kv_heads), positions)
            v = self._split(h, attn.v_proj, self.kv_heads)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=self.scaling,
                                                 enable_gqa=self.heads != self.kv_heads)
            x = x + attn.o_proj(out.transpose(1, 2).reshape(rows, width, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            self.keys.append(self._cache_of(k))
            self.values.append(self._cache_of(v))
        self.valid = torch.zeros(rows, self.max_len, dtype=torch.bool, device=self.device)
        self.valid[:, :width] = real
        self.position = real.long().sum(-1)
        self.column = width
        return self.head(self.inner.norm(x[:, -1]))

    def _cache_of(self, x: torch.Tensor) -> torch.Tensor:
        cache = torch.zeros(*x.shape[:2], self.max_len, self.head_dim, dtype=x.dtype, device=self.device)
        cache[:, :, : x.shape[2]] = x
        return cache

    def repeat(self, n: int) -> None:
        self.keys = [k.repeat_interleave(n, 0) for k in self.keys]
        self.values = [v.repeat_interleave(n, 0) for v in self.values]
        self.valid = self.valid.repeat_interleave(n, 0)
        self.position = self.position.repeat_interleave(n, 0)

    def keep(self, rows: torch.Tensor) -> None:
        """Only these live rows stay (their cache up to the current column is copied; the rest is never read)."""
        upto = self.column
        self.keys = [self._cache_of(k[rows, :, :upto]) for k in self.keys]
        self.values = [self._cache_of(v[rows, :, :upto]) for v in self.values]
        self.valid = self.valid[rows]
        self.position = self.position[rows]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.column >= self.max_len:
            raise ValueError(f"the decoder's {self.max_len} positions are used up")
        rows, col = tokens.shape[0], self.column
        positions = self.position[:, None]
        self.valid[:, col] = True
        visible = self.valid[:, None, None, : col + 1]  # [B, 1, 1, L]
        group = self.heads // self.kv_heads
        x = self.inner.embed_tokens(tokens.to(self.device))[:, None]  # [B, 1, hidden]
        for layer, keys, values in zip(self.inner.layers, self.keys, self.values, strict=True):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = self._rotate(self._split(h, attn.q_proj, self.heads), positions)  # [B, heads, 1, d]
            keys[:, :, col] = self._rotate(self._split(h, attn.k_proj, self.kv_heads), positions)[:, :, 0]
            values[:, :, col] = self._split(h, attn.v_proj, self.kv_heads)[:, :, 0]
            # Grouped-query heads read their shared key/value head in place: q [B, kv, group, d].
            q = q.view(rows, self.kv_heads, group, self.head_dim)
            scores = torch.matmul(q, keys[:, :, : col + 1].transpose(-1, -2)) * self.scaling  # [B, kv, group, L]
            weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            out = torch.matmul(weights, values[:, :, : col + 1])  # [B, kv, group, d]
            x = x + attn.o_proj(out.reshape(rows, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.position = self.position + 1
        self.column = col + 1
        return self.head(self.inner.norm(x[:, 0]))
