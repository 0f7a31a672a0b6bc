"""rodeco's decode attention kernel (``rodeco.engines.native``, ``attention.cpp``), against attention computed
in float64 from the same inputs: prompt keys read through each row's prompt, the prompts' padding bias, own tokens
across whole and partial blocks of 16, each query-head group it is built for, fp32 and bf16 caches. A row's output
does not depend on the batch or the cache's capacity (bit for bit); inputs it cannot read are refused by name; a
failed build leaves the compiled step on inductor's attention with a warning. MKL's packed GEMM
(``mkl_linear.cpp``) keeps each row the same bit for bit at every batch size where the engine's check passes.
"""

from __future__ import annotations

import logging

import pytest
import torch

from rodeco.engines import native

pytestmark = [
    pytest.mark.slow,  # builds the C++ extension on first use
    pytest.mark.skipif(not native.available("decode_attention"), reason="no C++ toolchain to build it"),
]


def by_column(t: torch.Tensor, capacity: int | None = None) -> torch.Tensor:
    """``t`` [N, H, S, D] stored by column (token stride 1), in a buffer of ``capacity`` tokens (default S)."""
    n, h, s, d = t.shape
    buf = torch.full((n, h, d, capacity or s), float("nan"), dtype=t.dtype)  # unread beyond S: NaN would show
    buf[..., :s] = t.transpose(-1, -2)
    return buf.transpose(-1, -2)[:, :, :s]


def reference(q, kp, vp, grp, bias, k, v, scale):
    """Attention in float64: each row over its prompt's keys (with the bias) and its own."""
    f = lambda t: t.double()  # noqa: E731
    kpr, vpr = f(kp).index_select(0, grp), f(vp).index_select(0, grp)
    keys, vals = torch.cat([kpr, f(k)], dim=2), torch.cat([vpr, f(v)], dim=2)  # [B, H, P + S, D]
    b = torch.cat([bias.double().index_select(0, grp), torch.zeros(k.shape[0], k.shape[2], dtype=torch.float64)], 1)
    s = torch.einsum("bhgd,bhtd->bhgt", f(q), keys) * scale + b[:, None, None, :]
    return torch.einsum("bhgt,bhtd->bhgd", torch.softmax(s, dim=-1), vals)


def inputs(B=6, G=2, H=2, g=3, D=16, P=7, S=5, dtype=torch.float32, seed=0, capacity=None):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    q, kp, vp, k, v = r(B, H, g, D), r(G, H, P, D), r(G, H, P, D), r(B, H, S, D), r(B, H, S, D)
    grp = torch.arange(B) % G
    bias = torch.zeros(G, P)
    bias[0, : P // 2] = float("-inf")  # prompt 0 left-padded
    return dict(q=q, kp=by_column(kp), vp=vp, grp=grp, bias=bias, k=by_column(k, capacity), v=v, scale=D**-0.5)


@pytest.mark.parametrize("P,S", [(1, 1), (7, 5), (16, 16), (17, 33), (40, 76), (100, 130)])
@pytest.mark.parametrize("g", [1, 3, 4, 8])
def test_fp32_matches_float64_attention(P, S, g):
    a = inputs(g=g, P=P, S=S, D=32)
    out = native.decode_attention(**a)
    assert out.dtype == torch.float32 and out.shape == a["q"].shape
    assert torch.allclose(out.double(), reference(**a), atol=2e-6, rtol=1e-5)


def test_bf16_caches_are_read_in_fp32_and_the_output_rounds_once():
    a = inputs(dtype=torch.bfloat16, P=19, S=23, D=64)
    out = native.decode_attention(**a)
    ref = reference(**a)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ref.to(torch.bfloat16)) or (out.double() - ref).abs().max() <= 2**-8 * ref.abs().max()


def test_a_masked_prompt_position_has_no_weight():
    a = inputs(P=9, S=3)
    a["vp"][0, :, :4] = 1e6  # the values at prompt 0's padding: any weight on them would show
    out = native.decode_attention(**a)
    assert out[a["grp"] == 0].abs().max() < 100


def test_a_rows_output_is_the_same_bit_for_bit_whatever_the_batch_and_capacity():
    a = inputs(B=8, P=21, S=37, D=64)
    full = native.decode_attention(**a)
    for i in (0, 5):
        one = dict(a, q=a["q"][i : i + 1], grp=a["grp"][i : i + 1], k=a["k"][i : i + 1], v=a["v"][i : i + 1])
        assert torch.equal(native.decode_attention(**one)[0], full[i])
    wide = dict(a, k=by_column(a["k"].contiguous(), capacity=200))  # the same keys in a longer round's cache
    assert torch.equal(native.decode_attention(**wide), full)


def test_inputs_it_cannot_read_are_refused_by_name():
    a = inputs()
    with pytest.raises(RuntimeError, match="keys by column"):
        native.decode_attention(**dict(a, k=a["k"].contiguous()))
    b = inputs(D=24)
    with pytest.raises(RuntimeError, match="head_dim must be a multiple of 16"):
        native.decode_attention(**b)
    with pytest.raises(RuntimeError, match="share a dtype"):
        native.decode_attention(**dict(a, v=a["v"].double()))
    with pytest.raises(RuntimeError, match="row 1 names prompt 7 of 2"):
        native.decode_attention(**dict(a, grp=torch.tensor([0, 7, 0, 1, 0, 1])))
    with pytest.raises(RuntimeError, match="shapes do not match"):
        native.decode_attention(**dict(a, bias=a["bias"][:, :3]))
    assert native.fits(64, 3) and native.fits(128, 8) and not native.fits(80 + 4, 3) and not native.fits(64, 9)


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


def test_a_failed_build_leaves_inductors_attention_and_says_so(monkeypatch, caplog):
    import torch.utils.cpp_extension as ext

    def no_compiler(**kw):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(ext, "load", no_compiler)
    monkeypatch.setattr(native, "_built", None)
    with caplog.at_level(logging.WARNING, logger="rodeco.engines.native"):
        assert not native.available("decode_attention")
    assert "could not be built" in caplog.text and "Ninja is required" in caplog.text
    assert native.available("decode_attention") is False  # decided once a process


def test_a_kernel_is_asked_for_by_one_of_its_names():
    """Every native kernel has a name (``native.KERNELS``); another name is refused with the list."""
    with pytest.raises(ValueError, match="decode_attention"):
        native.available("flash_attention")
