"""rodeco's native kernels (``rodeco.engines.native``): what the paged attention kernel serves and the width it is
built for (``tests/test_paged_kernel.py`` tests its arithmetic); a failed build leaves the torch paths with a
warning. MKL's packed GEMM (``mkl_linear.cpp``) keeps each row the same bit for bit at every batch size where the
engine's check passes.
"""

from __future__ import annotations

import logging

import pytest
import torch

from rodeco.engines import native

pytestmark = [
    pytest.mark.slow,  # builds the C++ extension on first use
    pytest.mark.skipif(not native.available("paged_attention"), reason="no C++ toolchain to build it"),
]


def test_the_kernels_fit_and_vector_width():
    """What the paged kernel serves (``fits``: head_dim a multiple of 16, at most 8 query heads a KV head) and the
    width it was built for, which the Llama engine's block is."""
    from rodeco.engines.fast import BLOCK

    assert native.fits(64, 3) and native.fits(128, 8) and not native.fits(80 + 4, 3) and not native.fits(64, 9)
    assert int(torch.ops.rodeco.lanes()) == native.WIDTH == BLOCK and native.WIDTH in (8, 16)


def _mkl() -> None:
    if not native.available("mkl_linear"):
        pytest.skip("this build of PyTorch carries no MKL packed GEMM")


@pytest.mark.parametrize("n,k,bias", [(48, 32, False), (960, 576, True), (1000, 64, False)])
def test_mkls_packed_linear_is_a_linear_whose_rows_do_not_depend_on_the_batch(n, k, bias):
    """``rodeco::mkl_linear`` computes ``x @ w.T + b`` (to fp32 round-off against float64), for any number of rows
    and leading dimensions; where ``row_invariant`` finds its rows the same at the batch sizes it samples, a row comes
    out bit for bit the same at every batch size from 1 to 130 (PyTorch's ``mkl::_mkl_linear`` answers other batches
    than the packed one by another GEMM, whose rows differ at a few rows). On a CPU where MKL's rows move with the
    batch, ``row_invariant`` says so and the engine prepacks for oneDNN instead (``test_compile``)."""
    from rodeco.engines.llama import Linear, row_invariant

    _mkl()
    gen = torch.Generator().manual_seed(k)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    lin = Linear(w, b, mkl=True)
    assert lin.mkl is not None and lin.packed is None
    x = torch.randn(130, k, generator=gen)
    full = lin(x)
    want = x.double() @ w.double().T + (b.double() if bias else 0)
    assert (full.double() - want).abs().max().item() < 1e-5 * want.abs().max().item()
    for m in range(1, 131):
        assert (lin(x[:m]).double() - want[:m]).abs().max().item() < 1e-5 * want.abs().max().item()
    if row_invariant(lin):  # the engine's check passed on this CPU: then every batch size gives the same rows
        assert all(torch.equal(lin(x[:m]), full[:m]) for m in range(1, 131))
        assert torch.equal(lin(x[:12].view(3, 4, k)), full[:12].view(3, 4, n))


def test_row_invariant_sees_a_linear_whose_rows_depend_on_the_batch():
    """The check ``FastWeights`` runs before it keeps MKL's weights fails a linear that rounds a row otherwise at
    another batch size (here: one that adds a batch-sized offset)."""
    from rodeco.engines.llama import Linear, row_invariant

    class Batchy(Linear):
        def __call__(self, x):
            return super().__call__(x) + x.shape[0] * 1e-6

    w = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    assert row_invariant(Linear(w)) and not row_invariant(Batchy(w))


def test_a_failed_build_leaves_the_torch_paths_and_says_so(monkeypatch, caplog):
    import torch.utils.cpp_extension as ext

    def no_compiler(**kw):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(ext, "load", no_compiler)
    monkeypatch.setattr(native, "_built", None)
    with caplog.at_level(logging.WARNING, logger="rodeco.engines.native"):
        assert not native.available("paged_attention")
    assert "could not be built" in caplog.text and "Ninja is required" in caplog.text
    assert native.available("paged_attention") is False  # decided once a process


def test_a_kernel_is_asked_for_by_one_of_its_names():
    """Every native kernel has a name (``native.KERNELS``); another name is refused with the list."""
    with pytest.raises(ValueError, match="paged_attention"):
        native.available("flash_attention")
