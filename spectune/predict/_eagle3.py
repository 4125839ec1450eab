"""An EAGLE-3 head's forward as vLLM runs it, in plain torch: for training a head on the CPU and
for replaying one offline.

vLLM's EAGLE-3 proposer (``vllm/model_executor/models/llama_eagle3.py`` with
``vllm/v1/spec_decode/llm_base_proposer.py``) keeps the head's own KV cache over the sequence:

- position ``i`` of that cache reads token ``x[i + 1]`` and the target's auxiliary hidden states
  at position ``i`` (the residual stream entering each layer of ``eagle_aux_hidden_state_layer_ids``,
  sorted, concatenated, through ``fc``), written again from the target's states after every
  verification;
- its first draft after ``x[..n]`` is the argmax of the head at position ``n - 1``; each further
  draft reads the previous draft token and the head's own pre-norm output, one position further,
  attending to the target-fed cache up to ``n - 1`` and to the drafts of its own chain.

:meth:`Eagle3Head.chain_logits` computes every chain along a sequence at once, depth by depth,
with that attention pattern (EAGLE-3's "training-time test"). Parameter names are those of
speculators' ``Eagle3DraftModel`` (``fc``, ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``,
``t2d``), the format vLLM loads. One decoder layer, Llama-shaped (any target's hidden states).

Imports torch at module level: import this module inside the functions that need it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Eagle3Head", "HeadShape", "aux_layer_ids", "load_head", "target_features"]


def aux_layer_ids(num_layers: int) -> list[int]:
    """The auxiliary layers a head built here reads: vLLM's default ``(2, n // 2, n - 3)`` where
    those are three distinct layers, else three spread evenly over ``1 .. n - 1``."""
    from spectune.pairing import vllm_default_aux_layers

    default = sorted(set(vllm_default_aux_layers(num_layers)))
    if len(default) == 3 and all(1 <= i < num_layers for i in default):
        return default
    if num_layers < 4:
        return list(range(1, num_layers)) or [0]
    return sorted({round(1 + j * (num_layers - 2) / 2) for j in range(3)})


@dataclass(frozen=True)
class HeadShape:
    """What decides an EAGLE-3 head's tensors, as its ``config.json`` states it."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    layer_ids: tuple[int, ...]
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool = False
    norm_before_residual: bool = False

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> HeadShape:
        """From a speculators-format ``config.json`` (``transformer_layer_config`` inside)."""
        layer = config.get("transformer_layer_config") or config
        heads = int(layer["num_attention_heads"])
        rope = layer.get("rope_parameters") or {}
        ids = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
            "eagle_aux_hidden_state_layer_ids")
        if not ids:
            raise ValueError("the head's config names no eagle_aux_hidden_state_layer_ids")
        return cls(
            hidden_size=int(layer["hidden_size"]), num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or layer["hidden_size"] // heads),
            intermediate_size=int(layer["intermediate_size"]), vocab_size=int(layer["vocab_size"]),
            draft_vocab_size=int(config.get("draft_vocab_size") or layer["vocab_size"]),
            layer_ids=tuple(sorted(set(int(i) for i in ids))), rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", layer.get("rope_theta", 10000.0))),
            attention_bias=bool(layer.get("attention_bias", False)),
            norm_before_residual=bool(config.get("norm_before_residual", False)),
        )


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class _Attention(nn.Module):
    def __init__(self, s: HeadShape) -> None:
        super().__init__()
        self.q_proj = nn.Linear(2 * s.hidden_size, s.num_heads * s.head_dim, bias=s.attention_bias)
        self.k_proj = nn.Linear(2 * s.hidden_size, s.num_kv_heads * s.head_dim, bias=s.attention_bias)
        self.v_proj = nn.Linear(2 * s.hidden_size, s.num_kv_heads * s.head_dim, bias=s.attention_bias)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, s: HeadShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, s: HeadShape) -> None:
        super().__init__()
        self.self_attn = _Attention(s)
        self.mlp = _MLP(s)
        self.input_layernorm = _RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.hidden_norm = _RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(s.hidden_size, s.rms_norm_eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding (vLLM's for Llama, transformers' ``rotate_half``)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Eagle3Head(nn.Module):
    """An EAGLE-3 head with one decoder layer, under speculators' parameter names."""

    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        s = self.shape = shape
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.fc = nn.Linear(len(s.layer_ids) * s.hidden_size, s.hidden_size, bias=False)
        self.layers = nn.ModuleList([_Layer(s)])
        self.norm = _RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.lm_head = nn.Linear(s.hidden_size, s.draft_vocab_size, bias=False)
        # d2t[i]: target id of draft id i, minus i (speculators' and vLLM's offset form)
        self.register_buffer("d2t", torch.zeros(s.draft_vocab_size, dtype=torch.long))
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[..., None] * self.inv_freq  # [B, T, hd/2]
        emb = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, hd]
        return emb.cos(), emb.sin()

    def chain_logits(self, features: torch.Tensor, tokens: torch.Tensor, depth: int, first: int = 0) -> list[torch.Tensor]:
        """Logits over the draft vocabulary of every chain along a batch of sequences.

        ``features``: ``[B, T, n_aux * hidden]``, the target's auxiliary states at positions
        ``0 .. T-1``; ``tokens``: ``[B, T + depth]``, the sequence's token ids (padded past its
        end). Returns one ``[B, T - first, draft_vocab]`` tensor per depth ``d = 1 .. depth``: at
        start ``i >= first`` the head's ``d``-th draft after ``x[..i+1]``, a guess of
        ``x[i + d + 1]``, having read ``x[i + 1 .. i + d]`` as its inputs (the drafts before it,
        when they were accepted). Positions before ``first`` are only read (a replay's prompt).
        """
        s = self.shape
        layer = self.layers[0]
        attn = layer.self_attn
        b, t, _ = features.shape
        rows = t - first
        device = features.device
        hidden = self.fc(features.to(self.fc.weight.dtype))
        base = torch.arange(t, device=device).expand(b, t)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()[first:]
        diagonal = torch.eye(rows, dtype=torch.bool, device=device)
        out: list[torch.Tensor] = []
        for d in range(1, depth + 1):
            lo = 0 if d == 1 else first  # the first depth is the target-fed cache: every position
            n = t - lo
            embeds = layer.input_layernorm(self.embed_tokens(tokens[:, lo + d: lo + d + n]))
            if s.norm_before_residual:
                hidden = layer.hidden_norm(hidden)
                residual = hidden
            else:
                residual = hidden
                hidden = layer.hidden_norm(hidden)
            x = torch.cat([embeds, hidden], dim=-1)
            cos, sin = self._rope(base[:, lo:] + (d - 1))
            q = attn.q_proj(x[:, first - lo:]).view(b, rows, s.num_heads, s.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(b, n, s.num_kv_heads, s.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(b, n, s.num_kv_heads, s.head_dim).transpose(1, 2)
            q, k = _rotate(q, cos[:, :, first - lo:], sin[:, :, first - lo:]), _rotate(k, cos, sin)
            keys.append(k)
            values.append(v)
            mask = torch.cat([causal] + [diagonal] * (d - 1), dim=1)
            key, value = torch.cat(keys, dim=2), torch.cat(values, dim=2)
            if s.num_kv_heads != s.num_heads:
                rep = s.num_heads // s.num_kv_heads
                key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=1 / math.sqrt(s.head_dim))
            a = attn.o_proj(a.transpose(1, 2).reshape(b, rows, s.num_heads * s.head_dim))
            residual = residual[:, first - lo:] + a
            prenorm = residual + layer.mlp(layer.post_attention_layernorm(residual))
            out.append(self.lm_head(self.norm(prenorm)))
            hidden = prenorm
        return out

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocabulary ids as the target's."""
        return draft_ids + self.d2t[draft_ids]


def load_head(folder: Path | str, dtype: torch.dtype = torch.float32) -> Eagle3Head:
    """An EAGLE-3 head from a speculators-format folder (``config.json``, ``*.safetensors``);
    original EAGLE-3 checkpoints' ``midlayer.*`` names are read as ``layers.0.*``.

    Raises:
        ValueError: the head has more than one decoder layer, or misses tensors.
        OSError: the files cannot be read.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    layer = config.get("transformer_layer_config") or config
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"head {folder} has {layer['num_hidden_layers']} decoder layers; replay runs one")
    head = Eagle3Head(HeadShape.from_config(config))
    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        for name, tensor in load_file(str(file)).items():
            state[name.replace("midlayer.", "layers.0.")] = tensor
    state.pop("t2d", None)
    missing = [n for n in head.state_dict() if n not in state and n not in ("embed_tokens.weight", "d2t")]
    if missing:
        raise ValueError(f"head {folder} lacks {', '.join(missing[:3])}")
    head.load_state_dict(state, strict=False)
    return head.to(dtype).eval()


def target_features(target: Any, ids: torch.Tensor, layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's auxiliary states ``[L, n_aux * hidden]`` along one sequence ``ids`` ``[L]``
    (the residual stream entering each layer id, as vLLM collects it; id ``num_layers``: the
    stream before the final norm) and its argmax next token at every position ``[L]``."""
    states: list[torch.Tensor] = []
    last = len(target.model.layers)

    def keep_final(module: Any, args: Any, output: Any) -> None:
        states.append(args[0].detach())

    hook = target.model.norm.register_forward_hook(keep_final) if last in layer_ids else None
    try:
        out = target(input_ids=ids[None], output_hidden_states=True)
    finally:
        if hook is not None:
            hook.remove()
    hs = out.hidden_states
    aux = [states[0][0] if i == last else hs[i][0] for i in layer_ids]
    return torch.cat(aux, dim=-1), out.logits[0].argmax(-1)
