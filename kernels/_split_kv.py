# mypy: disable-error-code="no-untyped-def"
# Triton reads a kernel parameter's annotation as its type, so the kernel leaves them off.
"""Merge of split-KV partial results, shared by the unified and the decode kernels.

A split-KV kernel runs several programs over disjoint key ranges of one query and writes,
per (token, head, split), the split's normalised output followed by its log-sum-exp:
``partials[token, head, split, :head_size]`` and ``partials[token, head, split, head_size]``.
A split that saw no key writes ``lse = -inf`` and a zero output, so the merge needs no
sequence lengths: a split's weight is ``exp(lse_split - lse_max)``.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_splits_kernel(
    partials_ptr,
    out_ptr,
    lse_ptr,
    num_valid_tokens_ptr,
    num_splits,
    stride_p_tok,
    stride_p_head,
    stride_p_split,
    stride_o_tok,
    stride_o_head,
    stride_lse_tok,
    stride_lse_head,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    LIMIT_TOKENS: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    if LIMIT_TOKENS:  # noqa: SIM102 - a constexpr branch: no load is emitted without it
        # Rows past the batch's last query token were never written by stage 1.
        if token >= tl.load(num_valid_tokens_ptr):
            return

    base = partials_ptr + token.to(tl.int64) * stride_p_tok + head * stride_p_head
    splits = tl.arange(0, SPLITS_PAD)
    lse = tl.load(base + splits * stride_p_split + HEAD_SIZE, mask=splits < num_splits, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    denom = tl.sum(tl.exp(lse - lse_max), axis=0)

    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_SIZE
    acc = tl.zeros([HEAD_PAD], dtype=tl.float32)
    for split in range(num_splits):
        weight = tl.exp(tl.load(base + split * stride_p_split + HEAD_SIZE) - lse_max)
        acc += weight * tl.load(base + split * stride_p_split + offs_d, mask=d_ok, other=0.0)

    result = acc / tl.where(denom > 0.0, denom, 1.0)
    tl.store(out_ptr + token.to(tl.int64) * stride_o_tok + head * stride_o_head + offs_d, result, mask=d_ok)
    if WRITE_LSE:
        lse = tl.where(denom > 0.0, lse_max + tl.log(tl.maximum(denom, 1e-30)), float("-inf"))
        tl.store(lse_ptr + token.to(tl.int64) * stride_lse_tok + head * stride_lse_head, lse)


def merge_splits(
    partials: torch.Tensor,
    num_splits: int,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    num_valid_tokens: torch.Tensor | None = None,
) -> None:
    """Combine ``partials[:, :, :num_splits]`` into ``out`` (and ``lse``, natural log).

    ``num_valid_tokens`` (a one-element device tensor) stops the merge at the batch's last
    query token, so padding rows of a scratch buffer are never read.
    """
    num_tokens, num_heads, _, width = partials.shape
    head_size = width - 1
    grid = (num_tokens, num_heads)
    _merge_splits_kernel[grid](
        partials,
        out,
        lse if lse is not None else out,
        num_valid_tokens if num_valid_tokens is not None else partials,
        num_splits,
        partials.stride(0),
        partials.stride(1),
        partials.stride(2),
        out.stride(0),
        out.stride(1),
        lse.stride(0) if lse is not None else 0,
        lse.stride(1) if lse is not None else 0,
        HEAD_SIZE=head_size,
        HEAD_PAD=triton.next_power_of_2(head_size),
        SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
        WRITE_LSE=lse is not None,
        LIMIT_TOKENS=num_valid_tokens is not None,
        num_warps=4,
    )
