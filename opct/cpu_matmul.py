"""Float32 linear layers on the CPU through oneDNN rather than the BLAS torch was built with (`cpu_matmul`).

Why: torch's CPU builds send a float32 `F.linear` to MKL's sgemm. MKL picks its kernels by CPU vendor, and on AMD
CPUs it takes its AVX2 path even where the CPU has AVX-512; oneDNN (torch's `mkldnn`, in the same build) dispatches
on the instruction set. On this project's machine (AMD EPYC, AVX-512) oneDNN runs the training step's matrix shapes
(a few hundred rows x 192 x 576-1024) at 2.2-2.4x MKL's rate at one thread; `bench/opct_step.py` measures what that
does to a whole OPCT step (`--cpu-matmul blas` for the comparison). Both compute the same products in float32; they
add in another order, so results agree to float rounding (about 1e-6 relative), not bit for bit.

How: `use(backend)` scopes a choice (a context variable, so nothing leaks into code that runs after it). Inside
`use("onednn")` on the CPU, a `TorchFunctionMode` sends every float32 `F.linear` (nn.Linear, peft's LoRA layers,
the fused output layer of `opct.fused_kl`) to oneDNN through `_OneDNNLinear`, whose backward computes the input's
gradient with oneDNN too and a trained weight's with torch's own matmul. Everything else goes through untouched:
another dtype, autocast (bf16 training), a GPU, tensor subclasses, an empty batch. The sampling engine runs with
torch-function handling off (`no_interception`: the mode's Python cost per call would land on each of a decode
step's ~90 small ops) and picks per weight itself (`for_engine`, `dense`): large weights through oneDNN, small ones
through the BLAS, where oneDNN's per-call cost outweighs its kernel at a decode step's 8 rows.

Only training enters `use(...)` (with `TrainConfig.cpu_matmul` around each step); evaluation runs on torch's default.
Torch builds without oneDNN fall back to the BLAS. The default, `auto`, picks by CPU (`auto_backend`): oneDNN on an
AMD CPU with AVX-512, where the gain above was measured; the BLAS everywhere else. On an Intel CPU (Xeon with
AVX-512 and AMX, 2026-12-02) MKL takes its AVX-512 path and beat oneDNN at the training step's shapes (125-181 vs
112-157 GFLOP/s at 2 threads) and over whole steps: 0.18 vs 0.27 s on the default organism, 8.1 vs 9.7 s on
SmolLM2-135M (`bench/opct_step.py`).
"""

from __future__ import annotations

import contextvars
import functools
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

BACKENDS = ("onednn", "blas")
CHOICES = ("auto", *BACKENDS)  # what TrainConfig.cpu_matmul accepts
_backend: contextvars.ContextVar[str] = contextvars.ContextVar("opct_cpu_matmul", default="blas")
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _op():
    mkldnn = getattr(torch.ops, "mkldnn", None)
    if not torch.backends.mkldnn.is_available() or mkldnn is None or not hasattr(mkldnn, "_linear_pointwise"):
        return None
    return mkldnn._linear_pointwise.default


_DNN = _op()


def available() -> bool:
    """Whether this torch build has oneDNN's linear kernel."""
    return _DNN is not None


def _cpu_vendor() -> str:
    """The CPU's vendor string (`vendor_id` of /proc/cpuinfo: 'AuthenticAMD', 'GenuineIntel'); '' where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


@functools.cache
def auto_backend() -> str:
    """What `auto` means on this machine: 'onednn' on an AMD CPU whose instruction set torch dispatches at AVX-512
    (MKL would take its AVX2 path there), 'blas' otherwise (Intel, where MKL has its AVX-512 kernels; ARM; unknown)."""
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return "onednn" if available() and avx512 and _cpu_vendor() == "AuthenticAMD" else "blas"


def resolve(name: str) -> str:
    """The backend `name` (one of CHOICES) stands for here: `auto` becomes `auto_backend()`."""
    if name not in CHOICES:
        raise ValueError(f"cpu_matmul must be one of {', '.join(CHOICES)} (got {name!r})")
    return auto_backend() if name == "auto" else name


def backend() -> str:
    """The backend in force here: 'onednn' or 'blas' (also 'blas' where oneDNN is not available)."""
    return _backend.get() if available() else "blas"


def _f32_cpu(t: torch.Tensor) -> bool:
    """A plain (no subclass) float32 tensor on the CPU."""
    return type(t) in _PLAIN and t.device.type == "cpu" and t.dtype == torch.float32


def _weight_applies(w: torch.Tensor) -> bool:
    """A weight oneDNN's linear kernel takes: a non-empty float32 CPU matrix, outside autocast."""
    return _f32_cpu(w) and w.dim() == 2 and w.numel() > 0 and not torch.is_autocast_enabled("cpu")


def _applies(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    return (_weight_applies(w) and _f32_cpu(x) and (b is None or _f32_cpu(b)) and x.dim() >= 1
            and x.shape[-1] == w.shape[1] and x.numel() > 0)


def _dnn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    y = _DNN(x2 if x2.is_contiguous() else x2.contiguous(), w if w.is_contiguous() else w.contiguous(), b,
             "none", [], "")
    return y.view(*x.shape[:-1], w.shape[0])


# The sampling engine multiplies a few rows (8 at a decode step) by each weight. There oneDNN's per-call cost outweighs
# its faster kernel for small weights (the default organism's, at most 192 x 1024: 850 vs 776 us per decode step at 2
# threads with every weight through oneDNN) and halves the time of large ones (SmolLM2-135M's 576 x 960 to 576 x
# 49152 at 8 rows: 0.44-0.72x MKL's time). So the engine sends a weight to oneDNN from this many elements on.
ENGINE_MIN_WEIGHT = 1 << 18


def for_engine(w: torch.Tensor) -> bool:
    """Whether the sampling engine multiplies by `w` through oneDNN (`dense`): the backend in force is oneDNN, `w`
    is a float32 CPU matrix of at least ENGINE_MIN_WEIGHT elements."""
    return backend() == "onednn" and _weight_applies(w) and w.numel() >= ENGINE_MIN_WEIGHT


def dense(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x w^T + b through oneDNN, no autograd (`for_engine(w)` must hold; x float32 on the CPU, any leading shape)."""
    return _dnn(x, w, b)


class _OneDNNLinear(torch.autograd.Function):
    """y = x w^T + b through oneDNN; dL/dx = dL/dy w through oneDNN as well; dL/dw = (dL/dy)^T x and dL/db through
    torch (only for trained weights: under LoRA the base weights are frozen and take no gradient)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _dnn(x, w, b)

    @staticmethod
    def backward(ctx, grad_y):
        x, w = ctx.saved_tensors
        g = grad_y.reshape(-1, grad_y.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _dnn(g, w.t().contiguous(), None).view(*grad_y.shape[:-1], w.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = g.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], (args[1] if len(args) > 1 else kwargs.get("weight"))
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            if w is not None and _applies(x, w, b):
                if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                                or (b is not None and b.requires_grad)):
                    return _OneDNNLinear.apply(x, w, b)
                return _dnn(x, w, b)
        return func(*args, **kwargs)


@contextmanager
def use(name: str, device: torch.device | str = "cpu") -> Iterator[None]:
    """Within this block, float32 linear layers on the CPU run through `name` ('onednn', 'blas', or 'auto': the one
    `auto_backend` picks for this CPU); on another device only the choice is recorded (nothing is intercepted)."""
    name = resolve(name)
    token = _backend.set(name)
    try:
        if name == "onednn" and available() and torch.device(device).type == "cpu":
            with _Mode():
                yield
        else:
            yield
    finally:
        _backend.reset(token)


@contextmanager
def no_interception() -> Iterator[None]:
    """Torch-function handling off (the sampling engine's loop: it picks oneDNN per weight itself, `for_engine`, and
    a mode's per-call Python cost would otherwise land on each of its small ops)."""
    with torch._C.DisableTorchFunction():
        yield
