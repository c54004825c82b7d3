"""The prefill's packed attention against plain causal attention of each prompt alone."""

from __future__ import annotations

import pytest
import torch

from service.engine.fast.prefill_attention import packed_causal_attention


def _alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of one request whose queries are its last ``len(q)`` positions."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    offset = k.shape[0] - q.shape[0]
    allowed = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril(offset)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, v)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor
) -> torch.Tensor:
    """The packed attention of ``[tokens, heads, dim]`` inputs, the kernel chosen by device."""
    return packed_causal_attention(
        q,
        k,
        v,
        cu_q,
        cu_k,
        int((cu_q[1:] - cu_q[:-1]).max()),
        int((cu_k[1:] - cu_k[:-1]).max()),
        None,
    )


def test_each_request_attends_to_its_own_keys_only() -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    # A prefill of 5 tokens, a decode step after 9 cached tokens, a chunk of 3 after 4.
    new, total = [5, 1, 3], [5, 10, 7]
    padding = 2  # rows past the last prompt
    q = torch.randn(sum(new) + padding, heads, dim)
    k = torch.randn(sum(total), kv_heads, dim)
    v = torch.randn(sum(total), kv_heads, dim)
    cu_q = torch.tensor([0, 5, 6, 9])
    cu_k = torch.tensor([0, 5, 15, 22])

    out = _attend(q, k, v, cu_q, cu_k)

    assert out.shape == (sum(new) + padding, heads, dim)
    for i in range(3):
        keys = slice(int(cu_k[i]), int(cu_k[i + 1]))
        expected = _alone(q[cu_q[i] : cu_q[i + 1]], k[keys], v[keys])
        torch.testing.assert_close(out[cu_q[i] : cu_q[i + 1]], expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash kernel needs CUDA")
def test_flash_kernel_matches_the_reference() -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim = 32, 8, 128
    cu_q = torch.tensor([0, 40, 41, 42, 50], device="cuda")
    cu_k = torch.tensor([0, 40, 140, 303, 380], device="cuda")
    q = torch.randn(50, heads, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(380, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(380, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    flash = _attend(q, k, v, cu_q, cu_k)
    reference = _attend(q.float().cpu(), k.float().cpu(), v.float().cpu(), cu_q.cpu(), cu_k.cpu())
    torch.testing.assert_close(flash.float().cpu(), reference, atol=2e-2, rtol=2e-2)
