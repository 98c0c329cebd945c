"""Plain torch references for the attention kernels, in float64 by default.

They gather each sequence's keys and values through its block table into a dense tensor
and run softmax attention on it, so they read only positions ``< seq_len`` by
construction: what they return is what a kernel must return whatever the cache tail holds.
"""

import torch


def gather_pages(cache: torch.Tensor, pages: torch.Tensor, length: int, page_size: int) -> torch.Tensor:
    """The first ``length`` token rows ``[length, heads, dim]`` of a sequence whose page ids
    are ``pages``; ``cache`` is ``[pages, page_size, heads, dim]`` or ``[tokens, heads, dim]``."""
    if cache.dim() == 3:
        cache = cache.unflatten(0, (-1, page_size))
    used = pages[: -(-length // page_size)].long()
    return cache[used].flatten(0, 1)[:length]


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q [tokens, heads, d] over k/v [keys, kv_heads, d] (GQA by repeat).

    Returns (output [tokens, heads, dv], natural-log lse [tokens, heads]); rows with no
    allowed key give 0 and -inf.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,khd->htk", q, k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.nan_to_num(neginf=0.0)[..., None])
    out = torch.einsum("htk,khd->thd", weights, v)
    return out, lse.transpose(0, 1)


def unified_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int] | list[int] = (-1, -1),
    softcap: float = 0.0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """What ``kernels.unified_attention`` must write into ``out``, computed in ``dtype``.

    Query i of a sequence sits at key position ``seq_len - query_len + i``. A window of
    ``window_size[0] + 1`` keys (when ``window_size[0] >= 0``) limits keys behind the query
    and, when non-causal, ahead of it too.
    """
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    window = window_size[0] + 1 if window_size[0] >= 0 else 0
    starts = cu_seqlens_q.tolist()
    for seq, seq_len in enumerate(seqused_k.tolist()):
        lo, hi = starts[seq], starts[seq + 1]
        if hi == lo:
            continue
        keys = gather_pages(k, block_table[seq], seq_len, k.shape[1]).to(dtype)
        values = gather_pages(v, block_table[seq], seq_len, v.shape[1]).to(dtype)
        q_pos = torch.arange(seq_len - (hi - lo), seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        allowed = k_pos <= q_pos if causal else torch.ones_like(q_pos - k_pos, dtype=torch.bool)
        if window:
            allowed = allowed & (q_pos - k_pos < window)
            if not causal:
                allowed = allowed & (k_pos - q_pos < window)
        out[lo:hi], _ = _attend(q[lo:hi].to(dtype), keys, values, allowed, softmax_scale, softcap)
    return out


def decode_attention_reference(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_seq_len: torch.Tensor,
    sm_scale: float,
    page_size: int,
    logit_cap: float = 0.0,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``kernels.decode_attention_fwd`` must write into ``o`` and ``lse``: one query per
    sequence attending to all its ``b_seq_len`` keys. For MLA pass vLLM's views
    (``v_buffer`` = leading columns of ``k_buffer``)."""
    batch, heads, _ = q.shape
    o = torch.zeros((batch, heads, v_buffer.shape[-1]), dtype=dtype, device=q.device)
    lse = torch.full((batch, heads), float("-inf"), dtype=dtype, device=q.device)
    for seq, seq_len in enumerate(b_seq_len.tolist()):
        keys = gather_pages(k_buffer, req_to_token[seq], seq_len, page_size).to(dtype)
        values = gather_pages(v_buffer, req_to_token[seq], seq_len, page_size).to(dtype)
        allowed = torch.ones((1, seq_len), dtype=torch.bool, device=q.device)
        out, seq_lse = _attend(q[seq : seq + 1].to(dtype), keys, values, allowed, sm_scale, logit_cap)
        o[seq], lse[seq] = out[0], seq_lse[0]
    return o, lse


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64; NaN if ``actual`` has a non-finite value."""
    actual64, expected64 = actual.double(), expected.double()
    if not torch.isfinite(actual64).all():
        return float("nan")
    return float((actual64 - expected64).norm() / expected64.norm().clamp_min(1e-30))
