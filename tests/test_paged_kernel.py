"""The paged cache's decode attention kernel (``rodeco::paged_attention``, ``attention.cpp``) against the plain torch
path it replaces (``native.paged_reference``: each row's blocks gathered, two matmuls) and against float64: rows of
different lengths over blocks scattered in a pool, shared blocks (a prompt's, read by several rows), partial last
blocks, runs of chunks that cross blocks, each query-head group it is built for, fp32 and bf16 pools. A row's output
does not depend on the other rows (bit for bit); tables it cannot read are refused by name."""

from __future__ import annotations

import pytest
import torch

from rodeco.engines import native

pytestmark = [
    pytest.mark.slow,  # builds the C++ extension on first use
    pytest.mark.skipif(not native.available("paged_attention"), reason="no C++ toolchain to build it"),
]


def paged(
    lens: list[int],
    bs: int = 16,
    H: int = 2,
    g: int = 3,
    D: int = 32,
    dtype=torch.float32,
    seed: int = 0,
    starts: list[int] | None = None,
):
    """Rows of ``lens`` slots in a pool whose blocks are handed out shuffled, the first ``starts`` of each padding
    (default none); rows 0 and 1 share their first block (a prompt's), as a paged cache's rows of one prompt do."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    need = [-(-n // bs) for n in lens]
    N = sum(need) + 3
    order = torch.randperm(N, generator=gen).tolist()
    M = max(need) + 1
    tables = torch.full((len(lens), M), order[-1], dtype=torch.long)  # past a row's blocks: any valid one
    it = iter(order)
    for b, n in enumerate(need):
        for j in range(n):
            tables[b, j] = next(it)
    if len(lens) > 1 and need[0] > 1 and need[1] > 1:
        tables[1, 0] = tables[0, 0]  # a shared block
    return dict(
        q=r(len(lens), H, g, D),
        kpool=r(N, H, D, bs),
        vpool=r(N, H, bs, D),
        tables=tables,
        lens=torch.tensor(lens, dtype=torch.long),
        starts=torch.tensor(starts or [0] * len(lens), dtype=torch.long),
        scale=D**-0.5,
    )


def float64(q, kpool, vpool, tables, lens, starts, scale):
    return native.paged_reference(q.double(), kpool.double(), vpool.double(), tables, lens, starts, scale)


@pytest.mark.parametrize("lens", [[1], [16], [17, 33, 5], [51, 115, 64, 1, 200], [300, 7]])
@pytest.mark.parametrize("g", [1, 3, 4, 8])
@pytest.mark.parametrize("bs", sorted({native.WIDTH, 16, 32}))
def test_fp32_matches_float64_and_the_torch_path(lens, g, bs):
    a = paged(lens, bs=bs, g=g)
    out = native.paged_attention(**a)
    assert out.dtype == torch.float32 and out.shape == a["q"].shape
    assert torch.allclose(out.double(), float64(**a), atol=2e-6, rtol=1e-5)
    assert torch.allclose(out, native.paged_reference(**a), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("starts", [[0, 5, 15], [3, 16, 1]])
def test_the_padding_before_a_rows_first_token_is_skipped(starts):
    """A prompt ends on a block boundary: the slots before its first token (``starts``) weigh nothing, whatever they
    hold: the output is that of the row's tokens alone, moved to the start of a pool of their own."""
    lens = [40, 75, 130]
    a = paged(lens, starts=starts)
    out = native.paged_attention(**a)
    assert torch.allclose(out.double(), float64(**a), atol=2e-6, rtol=1e-5)
    for i, (n, s) in enumerate(zip(lens, starts)):
        M, bs = a["tables"].shape[1], a["kpool"].shape[-1]
        k = a["kpool"][a["tables"][i]].permute(1, 2, 0, 3).reshape(2, 32, M * bs)[:, :, s:n]  # [H, D, tokens]
        v = a["vpool"][a["tables"][i]].permute(1, 0, 2, 3).reshape(2, M * bs, 32)[:, s:n]
        p = torch.softmax(a["q"][i].double() @ k.double() * a["scale"], dim=-1)  # [H, g, tokens]
        assert torch.allclose(out[i].double(), p @ v.double(), atol=2e-6, rtol=1e-5)
    poisoned = a["kpool"].clone()
    poisoned[a["tables"][:, 0]] = 1e4  # the first blocks' padding slots hold anything (finite)
    for i, s in enumerate(starts):
        poisoned[a["tables"][i, 0], :, :, s:] = a["kpool"][a["tables"][i, 0], :, :, s:]
    if len({int(a["tables"][i, 0]) for i in range(3)}) == 3:  # each row's first block its own
        assert torch.allclose(native.paged_attention(**dict(a, kpool=poisoned)), out, atol=2e-6, rtol=1e-5)


def test_bf16_pools_are_computed_in_fp32():
    a = paged([40, 75, 130], dtype=torch.bfloat16)
    out = native.paged_attention(**a)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.double(), float64(**a), atol=1e-2, rtol=1e-2)


def test_a_rows_output_is_its_own():
    """A row alone gives the bits it gives beside others, whatever their lengths."""
    a = paged([51, 115, 64, 9])
    full = native.paged_attention(**a)
    for i in range(4):
        rows = slice(i, i + 1)
        one = dict(a, q=a["q"][rows], tables=a["tables"][rows], lens=a["lens"][rows], starts=a["starts"][rows])
        assert torch.equal(native.paged_attention(**one)[0], full[i])


def test_tables_it_cannot_read_are_refused():
    a = paged([20, 40])
    with pytest.raises(RuntimeError, match="names block"):
        native.paged_attention(**dict(a, tables=a["tables"].clone().fill_(10_000)))
    with pytest.raises(RuntimeError, match="holds"):
        native.paged_attention(**dict(a, lens=torch.tensor([20, 10_000])))
    with pytest.raises(RuntimeError, match="block size of"):
        native.paged_attention(**dict(a, kpool=a["kpool"][..., :4].contiguous(), vpool=a["vpool"][:, :, :4]))
