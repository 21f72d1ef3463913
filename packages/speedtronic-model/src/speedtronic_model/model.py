"""Reference decoder-only transformer: RMSNorm, RoPE, grouped-query attention, SwiGLU, tied head."""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from speedtronic_config import ConfigError, ModelConfig
from speedtronic_model.fused_loss import chunked_linear_cross_entropy
from speedtronic_model.registry import factory_keywords
from speedtronic_systems.loss import IGNORE_INDEX, causal_lm_loss
from speedtronic_systems.modes import switch_to_eval

_DEFAULTS = ModelConfig()


@dataclass
class GPTConfig:
    """Reference-model hyperparameters: ModelConfig's fields, defaults and validation, with the
    context length named block_size.
    """

    vocab_size: int = _DEFAULTS.vocab_size
    block_size: int = _DEFAULTS.max_seq_len
    n_layer: int = _DEFAULTS.n_layer
    n_head: int = _DEFAULTS.n_head
    n_kv_head: int | None = None  # None -> n_head (plain multi-head attention)
    d_model: int = _DEFAULTS.d_model
    d_ff: int | None = None  # None -> 4 * d_model
    dropout: float = _DEFAULTS.dropout
    tie_weights: bool = _DEFAULTS.tie_weights
    rope_base: float = _DEFAULTS.rope_base
    gradient_checkpointing: bool = _DEFAULTS.gradient_checkpointing
    loss_chunk_size: int | None = _DEFAULTS.loss_chunk_size

    def __post_init__(self) -> None:
        # ModelConfig owns the rules (and their ConfigError paths); take back its resolved values.
        section = ModelConfig(**self.section_fields())
        for name in self.section_fields():
            setattr(self, name, getattr(section, name))
        self.block_size = section.max_seq_len
        if self.head_dim % 2:
            raise ConfigError(
                "model.d_model",
                f"gives head_dim = d_model / n_head = {self.head_dim}, which must be even for "
                "rotary embeddings (they rotate channel pairs); change d_model or n_head",
                value=self.d_model,
            )

    def section_fields(self) -> dict[str, Any]:
        """Return these values as ModelConfig fields (block_size as max_seq_len)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["max_seq_len"] = values.pop("block_size")
        return values

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.d_model // self.n_head

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> GPTConfig:
        """Build from keyword arguments (config spellings such as max_seq_len accepted); an unknown
        one is a ConfigError with a suggestion.
        """
        kwargs = factory_keywords(kwargs)
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            hints = "; ".join(_suggest(name, known) for name in unknown)
            raise ConfigError("model", f"unknown field(s) for the reference transformer: {hints}")
        return cls(**kwargs)


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"{name!r}" + (
        f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(known)})"
    )


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned gain and no bias."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x scaled to unit RMS over its last dimension, times the gain."""
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary embeddings to x with shape (B, H, T, D); cos and sin are (T, D)."""
    return x * cos + _rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """Cached RoPE cos/sin tables (GPT-NeoX half-split layout)."""

    def __init__(self, head_dim: int, base: float = 10000.0, max_seq_len: int = 2048) -> None:
        super().__init__()
        self.head_dim, self.base = head_dim, base
        # Non-persistent buffers: they follow .to(device) but stay out of checkpoints.
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)  # (D/2,)
        self.register_buffer("cos_cached", torch.empty(0), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0), persistent=False)
        self._build(max_seq_len)

    def _build(self, seq_len: int) -> None:
        """Compute the tables in float32 on the CPU (unless on meta), then give them the buffers'
        device and dtype.
        """
        device, dtype = self.inv_freq.device, self.inv_freq.dtype
        on = device if device.type == "meta" else torch.device("cpu")
        inv_freq = 1.0 / self.base ** (
            torch.arange(0, self.head_dim, 2, device=on, dtype=torch.float32) / self.head_dim
        )
        t = torch.arange(seq_len, device=on, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (T, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (T, D)
        self.inv_freq, self.cos_cached, self.sin_cached = (
            table.to(device=device, dtype=dtype) for table in (inv_freq, angles.cos(), angles.sin())
        )

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        # The tables are a function of base, never of the moved values: to_empty() (after a build
        # on the meta device) leaves them uninitialised and no checkpoint restores them, and a
        # .to(bfloat16).float() round trip would keep them rounded.
        super()._apply(fn, recurse)
        shared = self.cos_cached.is_shared()
        self._build(self.cos_cached.size(0))
        if shared:  # Module.share_memory() puts every tensor in shared memory: the new ones too
            for table in (self.inv_freq, self.cos_cached, self.sin_cached):
                table.share_memory_()
        return self

    def forward(
        self, seq_len: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (cos, sin), each (seq_len, head_dim), on device in dtype."""
        if seq_len > self.cos_cached.size(0):
            self._build(seq_len)
        return (
            self.cos_cached[:seq_len].to(device=device, dtype=dtype),
            self.sin_cached[:seq_len].to(device=device, dtype=dtype),
        )


class KVCache:
    """Each layer's rotated keys and values of the tokens a model has seen so far, for incremental
    decoding: pass one to forward(kv_cache=) and that call computes only its new tokens, attending
    to every earlier call's too. Positions count from the cache's first token; it holds at most
    max_len tokens (the model's block_size). generate() keeps one per call.
    """

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.length = 0  # tokens stored, advanced by the model after every layer has stored them
        self._keys: list[torch.Tensor] = []  # per layer (B, KV, max_len, D), allocated on first use
        self._values: list[torch.Tensor] = []

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store layer's new (B, KV, T, D) keys and values; return all of that layer's so far."""
        if layer == len(self._keys) and not self.length:  # preallocated: no copy per token
            shape = (*k.shape[:2], self.max_len, k.size(-1))
            self._keys.append(k.new_empty(shape))
            self._values.append(v.new_empty(shape))
        self._check_fits(layer, k)
        start, end = self.length, self.length + k.size(2)
        self._keys[layer][:, :, start:end] = k
        self._values[layer][:, :, start:end] = v
        if start == 0:  # the prompt attends to exactly the tensors an uncached forward would
            return k, v
        return self._keys[layer][:, :, :end], self._values[layer][:, :, :end]

    def _check_fits(self, layer: int, k: torch.Tensor) -> None:
        """Raise ValueError when k is not what this cache holds for layer: another batch, dtype
        or device, or another model's (a copy would broadcast into it, or read unwritten keys).
        """

        def layout(t: torch.Tensor) -> tuple[Any, ...]:  # (batch, kv heads, head dim, ...)
            return (*t.shape[:2], t.size(-1), t.dtype, str(t.device))

        held = self._keys[layer] if layer < len(self._keys) else None
        if held is not None and layout(held) == layout(k):
            return
        holds = (
            f"{layout(held)} for layer {layer}" if held is not None else f"{len(self._keys)} layers"
        )
        raise ValueError(
            f"kv_cache holds {holds}, but this call's layer {layer} keys are {layout(k)} (batch, "
            "kv heads, head dim, dtype, device): start a new KVCache for each model, batch and "
            "dtype"
        )


class CausalSelfAttention(nn.Module):
    """Causal self-attention with grouped-query heads (n_kv_head key/value heads shared by n_head
    queries).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = (
            config.n_head,
            config.n_kv_head,
            config.head_dim,
        )
        self.q_proj = nn.Linear(config.d_model, self.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.d_model, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.d_model, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.d_model, bias=False)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryEmbedding,
        attention_mask: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """Attend causally; attention_mask is None or a (B, 1, T, T) bool mask that already holds
        causality. With kv_cache, x's tokens follow the cached ones (slot `layer` of it).
        """
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = (
            self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        )  # (B, KV, T, D)
        v = (
            self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        )  # (B, KV, T, D)
        start = 0 if kv_cache is None else kv_cache.length
        cos, sin = rope(start + T, x.device, q.dtype)
        cos, sin = cos[start:], sin[start:]  # the new tokens' positions
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.update(layer, k, v)
        # enable_gqa lets SDPA broadcast KV heads itself; measured faster on CPU than
        # repeat_interleave (bench/gqa_attention.py) and it never materializes the copies.
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attention_mask,
            # A cached step's tokens see every earlier one; SDPA's is_causal would align the
            # queries with the first keys instead (forward only allows one token after a prompt).
            is_causal=attention_mask is None and start == 0,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv_head != self.n_head,
        )  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)
        return self.resid_dropout(self.o_proj(y))


class SwiGLU(nn.Module):
    """Gated feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.w_gate = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.w_up = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.w_down = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the feed-forward output, same shape as x."""
        return self.dropout(self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); optionally recomputed in
    backward.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.mlp_norm = RMSNorm(config.d_model)
        self.mlp = SwiGLU(config)
        self.gradient_checkpointing = config.gradient_checkpointing

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryEmbedding,
        attention_mask: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """Return the block output (B, T, C), checkpointed when enabled and gradients are
        recorded; kv_cache and layer as CausalSelfAttention takes them.
        """
        if self.gradient_checkpointing and torch.is_grad_enabled() and kv_cache is None:
            # Non-reentrant checkpointing restores the RNG state, so dropout masks match on
            # recompute.
            return checkpoint(self._forward, x, rope, attention_mask, use_reentrant=False)
        return self._forward(x, rope, attention_mask, kv_cache=kv_cache, layer=layer)

    def _forward(
        self,
        x: torch.Tensor,
        rope: RotaryEmbedding,
        attention_mask: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, attention_mask, kv_cache=kv_cache, layer=layer)
        return x + self.mlp(self.mlp_norm(x))


class ReferenceTransformer(nn.Module):
    """A compact GPT-style model with RoPE, GQA, SwiGLU, and weight tying."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.config = config = GPTConfig.from_kwargs(**kwargs)
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.rope = RotaryEmbedding(
            config.head_dim, config.rope_base, max_seq_len=config.block_size
        )
        # speedtronic-optim reads this role: embeddings and the head stay on AdamW, never Muon.
        self.tok_emb._speedtronic_optimizer_role = "adamw"
        self.lm_head._speedtronic_optimizer_role = "adamw"

        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) so the residual stream's
        # variance does not grow with depth (two residual adds per block).
        for name, param in self.named_parameters():
            if name.endswith(("o_proj.weight", "w_down.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.register_load_state_dict_post_hook(_after_load)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        # Runs before any submodule loads, also inside a wrapper's load_state_dict.
        if self.config.tie_weights:
            _check_tied_head(state_dict, prefix)
            _fill_tied_head(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute every block's activations in backward (less memory, ~1/3 more compute)."""
        self.config.gradient_checkpointing = enabled
        for block in self.blocks:
            block.gradient_checkpointing = enabled

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        **_: Any,
    ) -> dict[str, torch.Tensor]:
        """Return {"logits": (B, T, V)} plus "loss" when labels (already shifted, -100 ignored) are
        given; with labels and config.loss_chunk_size set, {"loss"} alone (the logits are never
        made whole). With kv_cache (a KVCache(block_size)), input_ids continue the tokens it holds:
        the prompt first, then one token per call, as generate() decodes; an attention_mask then
        covers the cached tokens too, (B, cached + T), as transformers passes it.
        """
        T = self._check_inputs(input_ids, labels, attention_mask, kv_cache)
        mask = _attention_mask(attention_mask, T)  # None or (B, 1, T, cached + T)
        x = self.drop(self.tok_emb(input_ids))  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            x = block(x, self.rope, mask, kv_cache=kv_cache, layer=layer)
        if kv_cache is not None:
            kv_cache.length += T
        x = self.norm(x)
        chunk_size = self.config.loss_chunk_size
        if labels is not None and chunk_size is not None:
            loss = chunked_linear_cross_entropy(x, self.lm_head.weight, labels, chunk_size)
            return {"loss": loss}
        logits = self.lm_head(x)  # (B, T, V)
        if labels is None:
            return {"logits": logits}
        return {"logits": logits, "loss": causal_lm_loss(logits, labels)}

    def _check_inputs(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        kv_cache: KVCache | None = None,
    ) -> int:
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be (batch, sequence), got shape {tuple(input_ids.shape)}"
            )
        _check_token_ids(input_ids, self.config.vocab_size, values=_cheap_to_read(input_ids))
        T = input_ids.size(1)
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} exceeds block_size {self.config.block_size}; "
                "crop the input or raise model.max_seq_len"
            )
        if kv_cache is not None:
            self._check_cache(kv_cache, T, labels)
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError(
                f"labels shape {tuple(labels.shape)} != input_ids shape {tuple(input_ids.shape)}; "
                "labels must be "
                "already shifted, one next-token label per input position (-100 to ignore)"
            )
        if labels is not None:
            _check_labels(labels, self.config.vocab_size, values=_cheap_to_read(labels))
        expected = (input_ids.size(0), T + (kv_cache.length if kv_cache is not None else 0))
        if attention_mask is not None and attention_mask.shape != expected:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} != {expected}, input_ids' "
                "(batch, sequence) plus the tokens kv_cache holds"
            )
        return T

    def _check_cache(self, kv_cache: KVCache, T: int, labels: torch.Tensor | None) -> None:
        if kv_cache.max_len != self.config.block_size:
            raise ValueError(
                f"kv_cache holds {kv_cache.max_len} tokens but block_size is "
                f"{self.config.block_size}; pass KVCache(model.config.block_size)"
            )
        if labels is not None:
            raise ValueError("kv_cache is for decoding: pass no labels")
        if kv_cache.length and T != 1:
            raise ValueError(
                f"a kv_cache that holds tokens takes one more per call, got {T}; start a new "
                "KVCache for a new prompt"
            )
        if kv_cache.length + T > self.config.block_size:
            raise ValueError(
                f"kv_cache is full ({kv_cache.length} of block_size {self.config.block_size} "
                "tokens); past it, run the latest block_size tokens without a cache"
            )

    def num_parameters(self, *, non_embedding: bool = False) -> int:
        """Return the unique parameter count; non_embedding drops the token lookup table unless it
        is the tied head.
        """
        total = sum(p.numel() for p in self.parameters())  # parameters() yields a tied tensor once
        if non_embedding and not self.config.tie_weights:
            total -= self.tok_emb.weight.numel()
        return total

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Return training FLOPs per token by PaLM's formula 6N + 12·L·H·Q·T (forward and backward).

        N is num_parameters(non_embedding=True): every parameter that takes part in a matmul. The
        token lookup does no FLOPs and is left out, but the output head is a real (C x V) matmul per
        token and stays in, which for a tied model is the shared matrix counted once. L layers, H
        query heads, Q head_dim, T the attended length (seq_len, default block_size).
        """
        cfg = self.config
        T = cfg.block_size if seq_len is None else seq_len
        return (
            6 * self.num_parameters(non_embedding=True)
            + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * T
        )

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        *,
        generator: torch.Generator | None = None,
        eos_token_id: int | None = None,
        use_cache: bool = True,
        streamer: Any = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return input_ids (B, T) extended by max_new_tokens sampled ids, in its dtype and on its
        device; temperature 0 is greedy. With eos_token_id, a row ends at that id (later ids are
        it again) and sampling stops once every row has, as transformers' generate does. The model
        sees the latest block_size tokens. use_cache keeps each layer's keys and values (KVCache),
        so a token costs one position, not the whole window, while the sequence fits block_size;
        past it every token recomputes the window, as use_cache=False always does. A streamer
        (transformers' TextStreamer, or any object with put(ids) and end()) is put the prompt,
        then each step's (B,) ids, on the CPU, and ended after the last: one host sync a token.
        attention_mask (B, T), 0 for padding, batches prompts of different lengths padded on the
        left (a tokenizer's padding_side="left"): each row's tokens are those of its prompt
        alone (rotary positions are relative, so the pads' offset changes nothing).
        """
        if input_ids.dim() != 2 or input_ids.size(1) == 0:
            # Else cropping the context fails as a bare IndexError ("too many indices").
            raise ValueError(
                "input_ids must be a (batch, sequence) prompt of at least one token, got shape "
                f"{tuple(input_ids.shape)} (a single prompt needs a batch dimension: ids[None])"
            )
        if not _is_count(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        # "1" or True is no temperature; inf would sample every token alike (the logits all 0).
        usable = not isinstance(temperature, bool) and isinstance(temperature, numbers.Real)
        if not (usable and 0 <= temperature < math.inf):  # a NaN fails the comparison
            raise ValueError(
                f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}"
            )
        if top_k is not None and (not _is_count(top_k) or top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
        vocab = self.config.vocab_size
        if eos_token_id is not None and (
            not _is_count(eos_token_id) or not 0 <= eos_token_id < vocab
        ):
            raise ValueError(
                f"eos_token_id must be None or an id below {vocab} (model.vocab_size), got "
                f"{eos_token_id!r}"
            )
        # Checked once on any device: on a GPU forward leaves it to the embedding's device-side
        # assert, which leaves the CUDA context unusable.
        _check_token_ids(input_ids, vocab)
        mask = _prompt_mask(attention_mask, input_ids)  # None or (B, T) bool
        # Sampling should never see dropout; each module gets its own mode back after.
        restore_modes = switch_to_eval(self)
        finished = torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)
        block_size = self.config.block_size
        # A subclass's forward that takes neither kv_cache nor **kwargs would raise a TypeError.
        use_cache = use_cache and _takes_keyword(self.forward, "kv_cache")
        cache = KVCache(block_size)  # allocated on first use: nothing when use_cache=False
        if streamer is not None:
            streamer.put(input_ids.cpu())
        try:
            for _ in range(max_new_tokens):
                if use_cache and input_ids.size(1) <= block_size:
                    # The tokens the cache has not seen: the prompt, then the last sampled one.
                    # A subclass's forward that drops kv_cache leaves it empty, so it is given
                    # the whole sequence every time, as without a cache.
                    ids, keep, options = input_ids[:, cache.length :], mask, {"kv_cache": cache}
                else:
                    # Once the window slides every position's hidden state changes (earlier
                    # layers no longer see the dropped token): a cache would not give these
                    # logits, so the latest block_size tokens are recomputed.
                    ids, options = input_ids[:, -block_size:], {}
                    keep = None if mask is None else mask[:, -block_size:]
                if keep is not None:  # else not passed: a subclass's forward need not take it
                    options["attention_mask"] = keep
                logits = self(ids, **options)["logits"]
                logits = logits[:, -1, :].float()  # (B, V)
                next_ids = _sample(logits, temperature, top_k, generator)
                if eos_token_id is not None:  # a finished row repeats eos, as transformers pads
                    next_ids = next_ids.masked_fill(finished[:, None], eos_token_id)
                    finished |= next_ids[:, 0] == eos_token_id
                # cat would promote an int32 prompt to the sampled int64: keep the caller's dtype
                input_ids = torch.cat((input_ids, next_ids.to(input_ids.dtype)), dim=1)
                if mask is not None:  # the sampled token is a real one
                    mask = F.pad(mask, (0, 1), value=True)
                if streamer is not None:
                    streamer.put(input_ids[:, -1].cpu())
                # One host sync per token, only with eos_token_id; an empty batch runs to the end.
                if eos_token_id is not None and input_ids.size(0) and bool(finished.all()):
                    break
        finally:
            restore_modes()
        if streamer is not None:
            streamer.end()
        return input_ids


def _check_tied_head(state_dict: Any, prefix: str) -> None:
    """Raise ValueError when a checkpoint for a tied model holds a head other than its embedding:
    both load into the one shared tensor, so the head's values would replace the embedding's.
    """
    embedding, head = (
        state_dict.get(prefix + name) for name in ("tok_emb.weight", "lm_head.weight")
    )
    # Plain tensors only: a DTensor pair (FSDP2) compares through a collective, and a sharded
    # resume checks the model settings it was written with instead.
    if not all(type(t) in (torch.Tensor, nn.Parameter) for t in (embedding, head)):
        return
    if embedding.is_meta or head.is_meta or embedding.shape != head.shape:
        return  # nothing to compare; a shape mismatch is load_state_dict's own error
    if embedding.data_ptr() == head.data_ptr() and embedding.stride() == head.stride():
        return  # one tensor saved under both names: nothing to compare or copy
    # A NaN in both copies (a diverged run's checkpoint) is still one tensor saved twice.
    copy = head.to(embedding.device, embedding.dtype)
    if torch.allclose(embedding, copy, rtol=0.0, atol=0.0, equal_nan=True):
        return
    raise ValueError(
        f"the state dict's {prefix}lm_head.weight differs from its {prefix}tok_emb.weight (an "
        "untied model's), but this model ties them (tie_weights=True), so the embedding would be "
        "lost; build the model with tie_weights=False (model.tie_weights: false) to load both, or "
        "leave out lm_head.weight to load the embedding into both (or tok_emb.weight, with "
        "strict=False, to load the head into both)"
    )


def _fill_tied_head(state_dict: Any, prefix: str) -> None:
    """Give a state dict that holds the embedding but no head (another tool's save of a tied
    model, as transformers writes it) the embedding as its head: tied, the two are one tensor,
    so strict loading is not refused over the head. The dict is load_state_dict's own copy.
    """
    embedding = state_dict.get(prefix + "tok_emb.weight")
    if embedding is not None and prefix + "lm_head.weight" not in state_dict:
        state_dict[prefix + "lm_head.weight"] = embedding


def _after_load(model: ReferenceTransformer, incompatible_keys: Any) -> None:
    """Tie the head again (load_state_dict(assign=True) puts each checkpoint entry in as its own
    parameter) and build the RoPE tables a model made on the meta device still lacks, where its
    weights now are.
    """
    if model.config.tie_weights and model.lm_head.weight is not model.tok_emb.weight:
        model.lm_head.weight = model.tok_emb.weight
    weight = model.tok_emb.weight
    if model.rope.inv_freq.is_meta and not weight.is_meta:
        model.rope.to_empty(device=weight.device)


def _cheap_to_read(ids: torch.Tensor) -> bool:
    """Return whether forward reads ids' values to check them: on the CPU, where that is one pass
    over the ids, but not on an accelerator (a host sync per step) nor while compiling (a graph
    break); there the embedding's own error stands.
    """
    return ids.device.type == "cpu" and not torch.compiler.is_compiling()


def _check_token_ids(ids: torch.Tensor, vocab: int, *, values: bool = True) -> None:
    """Raise ValueError when ids are not integers or (with values) hold an id outside the
    vocabulary: the embedding fails on either with an error that names neither.
    """
    if ids.dtype not in (torch.long, torch.int32):  # what the embedding takes
        raise ValueError(
            f"input_ids must hold integer token ids, got {ids.dtype}; pass them as torch.long or "
            "torch.int32"
        )
    if values:
        _check_in_vocab(ids, vocab, "input_ids", "")


def _check_labels(labels: torch.Tensor, vocab: int, *, values: bool = True) -> None:
    """Raise ValueError when labels are not integers or (with values) hold an id outside the
    vocabulary other than IGNORE_INDEX: the loss fails on either with an error that names neither
    (the chunked loss truncates floats to ids, and any loss takes bools as ids 0 and 1).
    """
    dtype = labels.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ValueError(
            f"labels must hold integer token ids ({IGNORE_INDEX} to ignore), got {dtype}; pass "
            "them as torch.long"
        )
    if values:
        ids = labels.masked_fill(labels == IGNORE_INDEX, 0)
        _check_in_vocab(ids, vocab, "labels", f", {IGNORE_INDEX} to ignore")


def _check_in_vocab(ids: torch.Tensor, vocab: int, name: str, also: str) -> None:
    """Raise ValueError naming an id of ``name`` outside [0, vocab) (``also``: other values it
    may hold), found with one aminmax.
    """
    if not ids.numel():
        return
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 or high >= vocab:
        raise ValueError(
            f"{name} hold token id {low if low < 0 else high}, outside the model's vocab_size "
            f"{vocab} (ids 0 to {vocab - 1}{also}); encode them with the tokenizer the model was "
            "trained with"
        )


def _is_count(value: Any) -> bool:
    """Return whether value is an integer, a NumPy one included, and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _prompt_mask(attention_mask: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | None:
    """Return generate's attention_mask as bool, or None where it masks nothing; raise ValueError
    for one generate cannot continue: another shape, or a row not padded on the left only (it
    would continue after its pads; an all-padding row is no prompt). It reads the mask once.
    """
    if attention_mask is None:
        return None
    if attention_mask.shape != ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
            f"{tuple(ids.shape)}"
        )
    keep = attention_mask.to(torch.bool)
    if not ids.numel():
        return None
    if bool((keep[:, :-1] > keep[:, 1:]).any() | ~keep[:, -1].all()):
        raise ValueError(
            "attention_mask must pad on the left, each row 0s then at least one 1: pad the "
            "prompts on the left (transformers: tokenizer.padding_side = 'left')"
        )
    return None if bool(keep.all()) else keep


def _takes_keyword(function: Any, name: str) -> bool:
    """Return whether function accepts the keyword argument name (by name or through **kwargs)."""
    parameters = inspect.signature(function).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


# Below this temperature plain division could overflow (a logit of 3.4e18 would); above it
# sampling divides exactly as it always did.
TINY_TEMPERATURE = 1e-20


def _sample(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """Return (B, 1) next ids from (B, V) logits."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    if temperature < TINY_TEMPERATURE:
        # logits / 1e-300 overflow to inf, and softmax of inf is NaN. Shifted so the largest is 0
        # and divided in float64 (a denormal temperature is 0 in float32), the likeliest tokens
        # keep the mass and the rest go to -inf. Decided on the host: no sync per token.
        logits = logits.double() - logits.double().max(dim=-1, keepdim=True).values
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)


# Whether the mask drops anything is a data-dependent branch torch.compile cannot trace: it runs
# eagerly (a deliberate graph break, without dynamo's multi-line warning on every compiled run).
@torch.compiler.disable
def _attention_mask(attention_mask: torch.Tensor | None, T: int) -> torch.Tensor | None:
    """Return None (plain causal) or a (B, 1, T, S) bool mask for the last T of the mask's S
    tokens (S - T of them cached): causal and the key is not padding.
    """
    if attention_mask is None:
        return None
    keep = attention_mask.to(torch.bool)  # (B, S), True = real token
    # The loader emits an all-True mask; dropping it keeps SDPA on its fused causal kernels.
    if bool(keep.all()):
        return None
    S = keep.size(1)
    keys = torch.arange(S, device=keep.device)
    queries = torch.arange(S - T, S, device=keep.device)[:, None]  # (T, 1) positions
    mask = (keys <= queries) & keep[:, None, None, :]  # (B, 1, T, S)
    # A query whose visible keys are all padding (left padding) would softmax over nothing and
    # give NaN; letting it see itself keeps it finite. Its label should be -100 anyway.
    return mask | (keys == queries)


__all__ = [
    "CausalSelfAttention",
    "GPTConfig",
    "KVCache",
    "RMSNorm",
    "ReferenceTransformer",
    "RotaryEmbedding",
    "SwiGLU",
    "TransformerBlock",
    "apply_rope",
]
