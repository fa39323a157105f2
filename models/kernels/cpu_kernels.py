"""CPU kernels of the Mamba block in C: builds ``csrc/cpu_kernels.c`` on first use, loads it
with ctypes, and wraps its two kernels in autograd Functions:

- :class:`SelectiveScanCPU`: the fused selective scan (backend ``"cpu"`` of
  :mod:`models.kernels.selective_scan`): softplus, the recurrence, the D skip and the
  SiLU gate in one pass, with a hand-written backward; reads time-major (batch, L, dim)
  slices in place (the Mamba block's layout) and any other strides, e.g. (batch, dim, L);
- :class:`CausalConv1dCPU`: the block's causal depthwise conv + SiLU, time-major.

Why C: on CPU the blockwise PyTorch scan spends its time launching a few tiny ops per time
step, and the ops around it (transposes to (batch, dim, L), softplus, gate) are whole passes
over memory, forward and backward: torch's profiler on one Mamba training step at L = 784 on
the ``torch`` backend gave the scan's per-step ops ~45%, the transposes (``aten::copy_``)
~13%, the conv's backward ~7%, SiLU and softplus ~12%. The C source is the maths of the
paper written once per step; see the comment at its top.

Building needs only a C compiler (``$CC`` or ``cc``), no PyTorch headers: it takes under a
second. The library is cached under ``$SSM_WORKBENCH_KERNEL_CACHE`` (default
``$XDG_CACHE_HOME/ssm-workbench/kernels`` or ``~/.cache/ssm-workbench/kernels``), named by a
hash of the sources, the compiler, the flags and this CPU's feature flags, so a home
directory shared by different machines never loads a binary built for another CPU.
If no compiler works, :func:`load` returns the reason and ``auto`` falls back to the
``torch`` backend. ``SSM_WORKBENCH_NO_CPU_KERNEL=1`` disables the kernel.

:func:`build_library` is the one builder (hash-named cache, flag sets, an ABI check on
load) that the FoX and Mamba-3 MIMO libraries use too.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

ABI_VERSION = 5
_MIN_ITEMS = 8           # backward work items per call (at least; see SelectiveScanCPU.backward)
CHUNK_LEN = 32          # steps between stored states; backward recomputes a chunk at a time
_SRC_DIR = Path(__file__).parent / "csrc"
_SOURCES = ("cpu_kernels.c", "kernel_common.h", "selective_scan_impl.h", "causal_conv1d_impl.h",
            "linear_rnn_impl.h", "dplr_impl.h")
# -ffp-contract=fast: a * b + c as one fused multiply-add where the CPU has one (ISO C mode
# forbids the compiler to contract by itself; the linear-RNN kernel's inner loops are FMAs)
_BASE_FLAGS = ["-O3", "-std=c11", "-fPIC", "-shared", "-pthread", "-fno-math-errno",
               "-fopenmp-simd", "-ffp-contract=fast"]
# Tried in order; the first that compiles and links wins. libmvec gives vectorised log1p
# (softplus) and float64 exp (float32 exp is inlined); -fopenmp shares PyTorch's OpenMP
# thread pool (see cpu_kernels.c).
_FLAG_SETS = (
    ["-march=native", "-fopenmp", "-DSCAN_VECTOR_EXP", "-lmvec"],
    ["-march=native", "-fopenmp"],
    ["-march=native"],
    [],
)

def _cpu_signature() -> str:
    """What the compiled code depends on besides its sources: the CPU's feature flags."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def cache_dir() -> Path:
    env = os.environ.get("SSM_WORKBENCH_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ssm-workbench" / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _compile(cc: str, out: Path, extra: list[str], main: str = _SOURCES[0]) -> str:
    """Compile ``csrc/<main>`` to ``out`` atomically; returns "" on success, else the
    compiler's complaint."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cc, *_BASE_FLAGS, f"-I{_SRC_DIR}", "-o", tmp, str(_SRC_DIR / main), *extra, "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        os.unlink(tmp)
        return f"{type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        os.unlink(tmp)
        return (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]
    os.replace(tmp, out)  # atomic: a concurrent process sees no half-written library
    return ""


def _source_bytes(sources: tuple[str, ...]) -> bytes:
    """The bytes the cache key hashes: the named sources, then every header in csrc/ by
    name. The headers are taken whether listed or not, as any source may include any of
    them (kernel_common.h serves two libraries): a forgotten name must not let an edited
    header load a stale library."""
    names = list(sources) + sorted(p.name for p in _SRC_DIR.glob("*.h") if p.name not in sources)
    return b"".join(name.encode() + b"\0" + (_SRC_DIR / name).read_bytes() for name in names)


def build_library(stem: str, sources: tuple[str, ...], abi: tuple[str, int],
                  entry_points: tuple[str, ...], what: str) -> tuple[ctypes.CDLL | None, str]:
    """Build (or find in the cache) the library of ``csrc/<sources[0]>`` and load it.

    The file is named by a hash of the sources, compiler, flags and CPU features, so a
    changed source or another machine builds anew and concurrent processes share one
    build. Each of :data:`_FLAG_SETS` is tried in turn (the first that builds wins), in the
    kernel cache and then the temp folder. ``abi = (function, version)`` guards against a
    stale library; ``entry_points`` get the <kind>_f32 / <kind>_f64 signature
    ``int f(void **ptrs, long *sizes)``. Returns (the library, "") or (None, why not),
    ``what`` naming the library in that reason."""
    if os.environ.get("SSM_WORKBENCH_NO_CPU_KERNEL", "") not in ("", "0"):
        return None, "disabled by SSM_WORKBENCH_NO_CPU_KERNEL"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found ($CC or cc)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"C compiler {cc} does not run: {exc}"
    source_bytes = _source_bytes(sources)
    abi_fn, abi_version = abi
    errors = []
    for extra in _FLAG_SETS:
        key = hashlib.sha256(b"\0".join([
            source_bytes, cc.encode(), version.encode(), " ".join(_BASE_FLAGS + extra).encode(),
            _cpu_signature().encode()])).hexdigest()[:20]
        for directory in (cache_dir(), Path(tempfile.gettempdir()) / "ssm-workbench-kernels"):
            path = directory / f"{stem}-{key}.so"
            try:
                if not path.exists():
                    err = _compile(cc, path, extra, sources[0])
                    if err:
                        errors.append(f"{' '.join(extra) or 'plain'}: {err}")
                        break  # these flags fail anywhere; try the next set
                lib = ctypes.CDLL(str(path))
            except OSError as exc:  # unwritable cache dir, or a library that will not load
                errors.append(f"{path}: {exc}")
                continue
            got = getattr(lib, abi_fn)()
            if got != abi_version:
                errors.append(f"{path}: ABI {got} != {abi_version}")
                continue
            for sfx in ("f32", "f64"):
                for kind in entry_points:
                    fn = getattr(lib, f"{kind}_{sfx}")
                    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_long)]
                    fn.restype = ctypes.c_int
            return lib, ""
    return None, f"building the {what} failed: " + "; ".join(errors)


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


class KernelLibrary:
    """One library of ``csrc/``, built (:func:`build_library`, same arguments) and loaded on
    first use, at most once per process, with the checks every kernel's wrapper makes."""

    def __init__(self, stem: str, sources: tuple[str, ...], abi: tuple[str, int],
                 entry_points: tuple[str, ...], what: str):
        self.stem, self.sources, self.abi, self.entry_points = stem, sources, abi, entry_points
        self.what = what
        self.loaded: tuple[ctypes.CDLL | None, str] | None = None   # load()'s answer, once known

    def build(self) -> tuple[ctypes.CDLL | None, str]:
        """Build or find it now, whether loaded before or not."""
        return build_library(self.stem, self.sources, self.abi, self.entry_points, self.what)

    def load(self) -> tuple[ctypes.CDLL | None, str]:
        """(the library, "") or (None, why it is unavailable); built at most once per process."""
        if self.loaded is None:
            self.loaded = self.build()
        return self.loaded

    def library(self) -> ctypes.CDLL:
        """The loaded library; RuntimeError saying why when it is unavailable."""
        lib, why = self.load()
        if lib is None:
            raise RuntimeError(f"{self.what} unavailable: {why}")
        return lib

    def unsupported(self, t: torch.Tensor, limit: str = "") -> str:
        """Why the kernel cannot take tensors like ``t`` ("" when it can): not on the CPU,
        not float32/float64, ``limit`` (the caller's own shape limit, "" when within it), or
        the library unavailable; the first of these."""
        if t.device.type != "cpu":
            return f"tensors on {t.device.type!r}, the kernel runs on the CPU"
        if t.dtype not in _SUFFIX:
            return f"dtype {t.dtype}: the kernel takes float32 or float64"
        return limit or self.load()[1]


_LIBRARY = KernelLibrary("cpu_kernels", _SOURCES, ("ss_abi_version", ABI_VERSION),
                         ("ss_fwd", "ss_bwd", "conv_fwd", "conv_bwd", "lrnn_fwd", "lrnn_bwd",
                          "dplr_fwd", "dplr_bwd"), "CPU kernels")


def load() -> tuple[ctypes.CDLL | None, str]:
    """(the kernel library, "") or (None, why it is unavailable). Built at most once per process."""
    return _LIBRARY.load()


def available() -> bool:
    return load()[0] is not None


def unavailable_reason() -> str:
    return load()[1]


def _call(lib: ctypes.CDLL, kind: str, dtype: torch.dtype, tensors: list, sizes: list[int]) -> None:
    """Call <kind>_<type> with the pointer and size arrays described in the C file."""
    ptrs = (ctypes.c_void_p * len(tensors))(*[None if t is None else t.data_ptr() for t in tensors])
    longs = (ctypes.c_long * len(sizes))(*sizes)
    if getattr(lib, f"{kind}_{_SUFFIX[dtype]}")(ptrs, longs) != 0:
        raise MemoryError(f"CPU kernel {kind}: could not allocate a work buffer")


def _library_for(*tensors: torch.Tensor | None) -> ctypes.CDLL:
    """The loaded library, after checking the tensors are float32/float64 on the CPU."""
    lib = _LIBRARY.library()
    given = [t for t in tensors if t is not None]
    if given[0].dtype not in _SUFFIX or any(t.device.type != "cpu" for t in given):
        raise RuntimeError(f"CPU kernels take float32/float64 CPU tensors, got "
                           f"{given[0].dtype} on {given[0].device}")
    return lib


def _time_strides(t: torch.Tensor | None) -> list[int]:
    """(batch, time) strides of a (batch, L, C) tensor whose last axis is contiguous."""
    return [0, 0] if t is None else [t.stride(0), t.stride(1)]


def _strides3(t: torch.Tensor | None) -> list[int]:
    """(batch, time, channel) strides of a (batch, L, dim) tensor (any layout)."""
    return [0, 0, 0] if t is None else list(t.stride())


def _new_btd(like: torch.Tensor, batch: int, L: int, dim: int, channel_major: bool) -> torch.Tensor:
    """An empty (batch, L, dim) tensor, stored as (batch, dim, L) when ``channel_major``."""
    if channel_major:
        return like.new_empty(batch, dim, L).transpose(1, 2)
    return like.new_empty(batch, L, dim)


def _rows_contiguous(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``t`` in ``dtype`` with a unit stride on its last axis (copied only if needed)."""
    if t is None:
        return None
    t = t.to(dtype)
    return t if t.stride(-1) == 1 else t.contiguous()


class SelectiveScanCPU(torch.autograd.Function):
    """Fused scan. forward(u, delta, A, B, C, D, z, delta_bias, h0, softplus, chunk_len,
    channel_major) -> (out, h_last):

      u, delta, z: (batch, L, dim)  (delta raw: the kernel adds delta_bias, applies softplus)
      A: (dim, N); B, C: (batch, L, N); D, delta_bias: (dim,) or None; h0: (batch, dim, N)
      out: (batch, L, dim) = (C_t . h_t + D u_t) * silu(z_t); h_last: (batch, dim, N)

    u, delta, z may have any strides: slices of a projection's output (the Mamba block),
    or transposed (batch, dim, L) tensors (mamba-ssm's layout; ``channel_major=True`` then
    stores ``out`` and the gradients as (batch, dim, L) too, returned as (batch, L, dim)
    views). Time-major with contiguous channels is the fast path. B, C need a contiguous
    last axis. float32 / float64 CPU tensors. Saves the inputs and the state at every
    ``chunk_len``-th step: (batch, L / chunk_len, N, dim).
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, h0, softplus, chunk_len,
                channel_major=False):
        lib = _library_for(u, delta, A, B, C, D, z, delta_bias, h0)
        dtype = u.dtype
        batch, L, dim = u.shape
        N = A.shape[1]
        u, delta, z = (None if t is None else t.to(dtype) for t in (u, delta, z))
        B, C = _rows_contiguous(B, dtype), _rows_contiguous(C, dtype)
        At = A.to(dtype).t().contiguous()
        D, delta_bias, h0 = (None if t is None else t.to(dtype).contiguous()
                             for t in (D, delta_bias, h0))
        out = _new_btd(u, batch, L, dim, channel_major)
        h_last = u.new_zeros(batch, dim, N) if h0 is None else h0.clone()
        needs_grad = any(ctx.needs_input_grad[:9])
        n_chunks = -(-L // chunk_len)
        ckpt = u.new_empty(batch, n_chunks, N, dim) if needs_grad else None
        sizes = [batch, L, dim, N, chunk_len, int(softplus), *_strides3(u), *_strides3(delta),
                 *_strides3(z), *_time_strides(B), *_time_strides(C), *_strides3(out),
                 torch.get_num_threads()]
        if L > 0 and batch * dim > 0:
            _call(lib, "ss_fwd", dtype, [u, delta, z, At, B, C, D, delta_bias, h0, out, h_last, ckpt],
                  sizes)
        if needs_grad:
            ctx.save_for_backward(u, delta, z, At, B, C, D, delta_bias, ckpt)
            ctx.sizes = sizes
            ctx.has = (D is not None, z is not None, delta_bias is not None, h0 is not None)
            ctx.channel_major = channel_major
        return out, h_last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dh_last):
        lib = load()[0]
        u, delta, z, At, B, C, D, delta_bias, ckpt = ctx.saved_tensors
        has_D, has_z, has_bias, has_h0 = ctx.has
        batch, L, dim = u.shape
        N = At.shape[0]
        threads = torch.get_num_threads()
        # Channel groups per batch row, so that there are work items for up to 16 threads.
        # Each item writes its own (L, N) sums of dB and dC over its channels (added up
        # below). G depends on the shapes only, never on the thread count, so results are
        # bitwise the same on any machine.
        n_tiles = -(-dim // 16)
        G = max(1, min(n_tiles, -(-_MIN_ITEMS // batch)))
        dout = u.new_zeros(batch, L, dim) if dout is None else dout.to(u.dtype)
        dh = None if dh_last is None else dh_last.to(u.dtype).contiguous()
        # the gradients take the layout of out (ctx.sizes holds its strides)
        du, ddelta = (_new_btd(u, batch, L, dim, ctx.channel_major) for _ in range(2))
        dz = _new_btd(u, batch, L, dim, ctx.channel_major) if has_z else None
        dA_part = u.new_empty(batch, dim, N)
        dD_part, dbias_part = u.new_empty(batch, dim), u.new_empty(batch, dim)
        dB_part, dC_part = u.new_empty(batch * G, L, N), u.new_empty(batch * G, L, N)
        dh0 = u.new_zeros(batch, dim, N) if dh is None else dh.clone()
        sizes = list(ctx.sizes)
        sizes[22] = threads
        if L > 0 and batch * dim > 0:
            _call(lib, "ss_bwd", u.dtype,
                  [u, delta, z, At, B, C, D, delta_bias, None, None, None, ckpt, dout, dh,
                   du, ddelta, dz, dA_part, dD_part, dbias_part, dB_part, dC_part, dh0],
                  sizes + [G, *_strides3(dout)])
        else:
            for t in (du, ddelta, dA_part, dD_part, dbias_part, dB_part, dC_part) + ((dz,) if has_z else ()):
                t.zero_()
        dB = dB_part.view(batch, G, L, N).sum(1)
        dC = dC_part.view(batch, G, L, N).sum(1)
        return (du, ddelta, dA_part.sum(0), dB, dC, dD_part.sum(0) if has_D else None, dz,
                dbias_part.sum(0) if has_bias else None, dh0 if has_h0 else None, None, None, None)


class CausalConv1dCPU(torch.autograd.Function):
    """Causal depthwise conv, time-major: forward(x, weight, bias, left, silu) -> out.

      x: (batch, L, dim), last axis contiguous (a strided view is fine);
      weight: (dim, 1, k) as in ``nn.Conv1d(dim, dim, k, groups=dim)``; bias: (dim,) or None;
      left: (batch, k - 1, dim), the inputs before t = 0 (None = zeros);
      out[b, t] = act(bias + sum_j weight[:, 0, j] * x[b, t - (k - 1) + j]), act = SiLU or identity.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, left, silu):
        lib = _library_for(x, weight, bias, left)
        dtype = x.dtype
        batch, L, dim = x.shape
        k = weight.shape[-1]
        x = _rows_contiguous(x, dtype)
        wt = weight.to(dtype).reshape(dim, k).t().contiguous()         # (k, dim)
        bias = None if bias is None else bias.to(dtype).contiguous()
        left = None if left is None else left.to(dtype).contiguous()
        out = x.new_empty(batch, L, dim)
        sizes = [batch, L, dim, k, int(silu), *_time_strides(x), torch.get_num_threads()]
        if out.numel():
            _call(lib, "conv_fwd", dtype, [x, wt, bias, left, out], sizes)
        ctx.save_for_backward(x, wt, bias, left)
        ctx.sizes = sizes
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        x, wt, bias, left = ctx.saved_tensors
        batch, L, dim = x.shape
        k = wt.shape[0]
        dout = dout.to(x.dtype).contiguous()
        dx = x.new_empty(batch, L, dim)                                  # all written by the kernel
        dwt_part, dbias_part = x.new_empty(batch, k, dim), x.new_empty(batch, dim)
        dleft = None if left is None else x.new_zeros(batch, k - 1, dim)
        work = x.new_empty(batch, L, dim)
        sizes = list(ctx.sizes)
        sizes[-1] = torch.get_num_threads()
        if dx.numel():
            _call(load()[0], "conv_bwd", x.dtype,
                  [x, wt, bias, left, None, dout, dx, dwt_part, dbias_part, dleft, work], sizes)
        dweight = dwt_part.sum(0).t().reshape(dim, 1, k)
        return dx, dweight, None if bias is None else dbias_part.sum(0), dleft, None
