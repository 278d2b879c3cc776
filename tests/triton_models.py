"""Tiny models that launch Triton kernels, for the Triton capture tests.

Kernels are defined under TRITON_INTERPRET=1 (a scoped knob, so the rest of the test
process is unaffected) unless a GPU is present, in which case they compile. Triton
fixes its own library kernels (`tl.max`, `tl.sum`, `tl.zeros`, ...) as compiled or
interpreted when it is first imported, which may happen before this module; the kernels
here therefore use only builtins (`tl.reduce` with our own combine functions,
`tl.full`), so they run whichever way triton was imported. The quantisation path follows
the shape of DeepSeek-V3's `act_quant` + block-scaled fp8 GEMM, written afresh: one
kernel writes two outputs (fp8 values and per-block scales).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import torch
from torch import nn

triton = pytest.importorskip("triton")  # without triton there is nothing here to collect
tl = triton.language

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FP8_MAX = 448.0  # largest finite float8_e4m3fn


@contextlib.contextmanager
def _interpreted_unless_gpu() -> Iterator[None]:
    with triton.knobs.runtime.scope():  # restores the knob and TRITON_INTERPRET on exit
        if DEVICE.type == "cpu":
            triton.knobs.runtime.interpret = True
        yield


def _bench_by_timing(kernel_call, quantiles):
    """An autotuning benchmark that needs no GPU driver: one timed call per config."""
    from time import perf_counter

    start = perf_counter()
    kernel_call()
    elapsed = perf_counter() - start
    return [elapsed] * len(quantiles)


def _zero_output(nargs: dict) -> None:
    """A config pre-hook that clears the output with a kernel launch of its own."""
    out = nargs["out_ptr"]
    zero_kernel[(triton.cdiv(out.numel(), 8),)](out, out.numel(), BLOCK=8)


with _interpreted_unless_gpu():

    @triton.jit
    def _max_combine(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _add_combine(a, b):
        return a + b

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offsets = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def act_quant_kernel(x_ptr, y_ptr, s_ptr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offsets = pid * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets).to(tl.float32)
        scale = tl.maximum(tl.reduce(tl.abs(x), 0, _max_combine), 1e-12) / 448.0
        tl.store(y_ptr + offsets, (x / scale).to(y_ptr.dtype.element_ty))
        tl.store(s_ptr + pid, scale)

    @triton.jit
    def scaled_gemm_kernel(a_ptr, b_ptr, c_ptr, a_s_ptr, b_s_ptr, M, N, K,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """c = (a * a_s) @ (b * b_s).T with one scale per row and BLOCK_K columns."""
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        num_groups = K // BLOCK_K
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        for g in range(0, num_groups):
            a = tl.load(a_ptr + rows[:, None] * K + (g * BLOCK_K + ks)[None, :]).to(tl.float32)
            b = tl.load(b_ptr + cols[:, None] * K + (g * BLOCK_K + ks)[None, :]).to(tl.float32)
            a_s = tl.load(a_s_ptr + rows * num_groups + g)
            b_s = tl.load(b_s_ptr + cols * num_groups + g)
            acc += tl.dot(a, tl.trans(b)) * a_s[:, None] * b_s[None, :]
        tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc)

    @triton.jit
    def row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
        """Adds each row's sum into out (atomically): out is read and written."""
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        tl.atomic_add(out_ptr + row, tl.reduce(x, 0, _add_combine))

    @triton.jit
    def _store_doubled(pointer, value, mask):
        tl.store(pointer, value * 2, mask=mask)

    @triton.jit
    def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        """Stores through a @triton.jit helper: found by reading the helper too."""
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        _store_doubled(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask)

    @triton.jit
    def apply_kernel(x_ptr, out_ptr, n, STORE: tl.constexpr, BLOCK: tl.constexpr):
        """Stores through a function passed as an argument: its writes are found by comparison."""
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        STORE(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask)

    @triton.jit
    def scale_rows_kernel(in_desc, out_desc, factor, BLOCK_ROWS: tl.constexpr):
        """Reads and writes through host-side tensor descriptors."""
        row = tl.program_id(0) * BLOCK_ROWS
        out_desc.store([row, 0], in_desc.load([row, 0]) * factor)

    @triton.jit
    def zero_kernel(out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.full((BLOCK,), 0.0, tl.float32), mask=offsets < n)

    @triton.autotune(configs=[triton.Config({"BLOCK": 4}, pre_hook=_zero_output),
                              triton.Config({"BLOCK": 16}, pre_hook=_zero_output)],
                     key=["n"], do_bench=_bench_by_timing)
    @triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
    @triton.jit
    def tuned_mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        if EVEN:
            tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * tl.load(y_ptr + offsets))
        else:
            mask = offsets < n
            x = tl.load(x_ptr + offsets, mask=mask)
            tl.store(out_ptr + offsets, x * tl.load(y_ptr + offsets, mask=mask), mask=mask)


# ----- launchers (what a model's code calls) -----------------------------------------------------
def triton_add(x: torch.Tensor, y: torch.Tensor, block: int = 8) -> torch.Tensor:
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
    return out


def act_quant(x: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise `x` to fp8 in blocks of `block` values along its last dimension."""
    y = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    s = x.new_empty(*x.shape[:-1], x.shape[-1] // block, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)  # noqa: E731
    act_quant_kernel[grid](x, y, s, BLOCK=block)
    return y, s


def scaled_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
                block_k: int = 16) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[0]
    c = a.new_empty(m, n, dtype=torch.float32)
    scaled_gemm_kernel[(m // 16, n // 16)](a, b, c, a_s, b_s, m, n, k,
                                          BLOCK_M=16, BLOCK_N=16, BLOCK_K=block_k)
    return c


def tuned_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    tuned_mul_kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, y, out, x.numel())
    return out


# ----- models ---------------------------------------------------------------------------------------
class ElementwiseModel(nn.Module):
    """linear -> Triton add of the input -> relu."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(triton_add(self.fc(x), x))


class FP8Linear(nn.Module):
    """A linear layer with fp8 weights and per-block scales, run by two Triton kernels."""

    def __init__(self, in_features: int, out_features: int, block: int = 16) -> None:
        super().__init__()
        self.block = block
        w = torch.randn(out_features, in_features) / in_features ** 0.5
        blocks = w.view(out_features, in_features // block, block)
        scale = blocks.abs().amax(-1).clamp_min(1e-12) / FP8_MAX
        self.weight = nn.Parameter((blocks / scale[..., None]).view_as(w).to(torch.float8_e4m3fn),
                                   requires_grad=False)
        self.scale = nn.Parameter(scale, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        y, s = act_quant(flat, self.block)
        out = scaled_gemm(y, s, self.weight, self.scale, self.block)
        return out.reshape(*x.shape[:-1], -1)


class QuantMLP(nn.Module):
    """DeepSeek-V3 style: every projection quantises its input, then a block-scaled GEMM."""

    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.up = FP8Linear(dim, hidden)
        self.down = FP8Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x)))


class KernelLoop(nn.Module):
    """The same Triton add launched four times, each on the previous result."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = triton_add(x, y)
        return x * 2


class InplaceAddModel(nn.Module):
    """A kernel that adds into one of its inputs (the same tensor passed twice)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = x + 1
        add_kernel[(triton.cdiv(h.numel(), 8),)](h, y, h, h.numel(), BLOCK=8)
        return h * 2


class TunedModel(nn.Module):
    """An autotuned kernel with a heuristic meta-parameter."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return tuned_mul(torch.sin(x), y) + 1


class AtomicRowSum(nn.Module):
    """Row sums accumulated into a zeroed buffer with atomic adds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], device=x.device)
        row_sum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return out.exp()


class HelperStoreModel(nn.Module):
    """One kernel storing through a jit helper, one through a function argument."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.empty_like(x)
        double_kernel[(triton.cdiv(x.numel(), 8),)](x, a, x.numel(), BLOCK=8)
        b = torch.empty_like(x)
        apply_kernel[(triton.cdiv(x.numel(), 8),)](a, b, x.numel(), STORE=_store_doubled, BLOCK=8)
        return b - a


class DescriptorModel(nn.Module):
    """A kernel whose arguments are host-side tensor descriptors."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from triton.tools.tensor_descriptor import TensorDescriptor

        out = torch.empty_like(x)
        scale_rows_kernel[(x.shape[0] // 8,)](TensorDescriptor.from_tensor(x, [8, x.shape[1]]),
                                             TensorDescriptor.from_tensor(out, [8, x.shape[1]]),
                                             3.0, BLOCK_ROWS=8)
        return out.sum(dim=1)


class OtherThreadModel(nn.Module):
    """Launches one kernel itself and one from a helper thread (which must not be logged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = torch.zeros_like(x)

        def work() -> None:
            add_kernel[(triton.cdiv(x.numel(), 8),)](x, x, side, x.numel(), BLOCK=8)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        return triton_add(x, side)


class FailingLaunchModel(nn.Module):
    """A kernel launch whose grid function raises."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + 1
        out = torch.empty_like(h)

        def grid(meta):
            raise ValueError(f"no grid for n={meta['n']}")

        add_kernel[grid](h, h, out, h.numel(), BLOCK=8)
        return out
