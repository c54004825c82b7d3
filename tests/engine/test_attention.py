"""The prefill's packed attention against plain causal attention of each prompt alone."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from service.engine.capability import PrefillKernel
from service.engine.fast import prefill_attention
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen kernels need CUDA")
@pytest.mark.parametrize(
    ("kernel", "dtype"), [("flash", torch.bfloat16), ("efficient", torch.float16)]
)
def test_each_varlen_kernel_matches_the_reference(
    kernel: PrefillKernel, dtype: torch.dtype
) -> None:
    # Four prompts, three after cached keys, 32 query heads on 8 key heads, and rows of padding
    # past the last (a captured step's): each kernel against SDPA in float32 on the CPU.
    torch.manual_seed(0)
    heads, kv_heads, dim = 32, 8, 128
    cu_q = torch.tensor([0, 40, 41, 42, 50], device="cuda")
    cu_k = torch.tensor([0, 40, 140, 303, 380], device="cuda")
    q = torch.randn(53, heads, dim, device="cuda", dtype=dtype)
    k = torch.randn(380, kv_heads, dim, device="cuda", dtype=dtype)
    v = torch.randn(380, kv_heads, dim, device="cuda", dtype=dtype)
    out = packed_causal_attention(q, k, v, cu_q, cu_k, 40, 163, None, kernel)
    reference = _attend(q.float().cpu(), k.float().cpu(), v.float().cpu(), cu_q.cpu(), cu_k.cpu())
    torch.testing.assert_close(out[:50].float().cpu(), reference[:50], atol=2e-2, rtol=2e-2)


def _efficient_stand_in(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: None,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    dropout: float,
    mask_type: int,
    log_sumexp: bool,
    scale: float | None = None,
) -> tuple[torch.Tensor, ...]:
    """``aten._efficient_attention_forward`` as its varlen form is documented (xformers'
    ``BlockDiagonalCausalFromBottomRightMask``), for a CPU: one batch ``[1, tokens, heads,
    dim]``, keys at the queries' head count, int32 starts, causal from the bottom right; rows
    past the last sequence left as they are (NaN here, as an empty tensor may hold)."""
    assert q.dim() == k.dim() == v.dim() == 4
    assert q.shape[0] == k.shape[0] == 1
    assert q.shape[2] == k.shape[2] == v.shape[2], "the kernel takes no grouped-query keys"
    assert cu_q.dtype == cu_k.dtype == torch.int32
    assert bias is None
    assert dropout == 0.0
    assert mask_type == 2
    assert not log_sumexp
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    assert max_q >= max(b - a for a, b in itertools.pairwise(starts_q))
    assert max_k >= max(b - a for a, b in itertools.pairwise(starts_k))
    out = torch.full_like(q[0], float("nan"))
    for i in range(len(starts_q) - 1):
        queries = slice(starts_q[i], starts_q[i + 1])
        keys = slice(starts_k[i], starts_k[i + 1])
        out[queries] = _alone(q[0, queries], k[0, keys], v[0, keys])
    return (out.unsqueeze(0),)


@given(
    pieces=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 9)), min_size=1, max_size=5),
    groups=st.sampled_from([1, 2, 4]),
    padding=st.integers(0, 3),
)
@settings(max_examples=40, deadline=None)
def test_the_memory_efficient_kernel_gets_what_its_varlen_form_needs(
    pieces: list[tuple[int, int]], groups: int, padding: int
) -> None:
    # A T4's prefill (compute capability 7.5, no flash kernel): the CUTLASS varlen kernel takes
    # the packed sequences by their device-side starts, one launch a layer (captured in graphs).
    # Its inputs as it documents them, and each sequence's output as that prompt alone.
    kv_heads, dim = 2, 8
    new = [n for n, _ in pieces]
    assume(sum(new) > 0)  # empty sequences pad captured steps; a step has a prompt
    total = [n + cached for n, cached in pieces]  # the queries are the last of each's keys
    torch.manual_seed(len(new) * 7 + groups)
    q = torch.randn(sum(new) + padding, kv_heads * groups, dim)
    k = torch.randn(sum(total), kv_heads, dim)
    v = torch.randn(sum(total), kv_heads, dim)
    cu_q = torch.tensor([0, *itertools.accumulate(new)])
    cu_k = torch.tensor([0, *itertools.accumulate(total)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prefill_attention, "efficient_attention", _efficient_stand_in)
        out = packed_causal_attention(
            q, k, v, cu_q, cu_k, max([*new, 1]), max([*total, 1]), None, "efficient"
        )
    reference = packed_causal_attention(
        q, k, v, cu_q, cu_k, max([*new, 1]), max([*total, 1]), None, "sdpa"
    )
    assert out.shape == q.shape
    real = int(cu_q[-1])
    torch.testing.assert_close(out[:real], reference[:real])
