"""The Triton kernels compiled for a CUDA GPU ahead of time, on any machine: no GPU, no driver.

    ssm-workbench bench --triton-compile 90            # the table, for an H100 (sm_90)
    python -m models.kernels.triton_aot --arch 90 --state 16,64 --dtype fp32,bf16

Triton's compiler needs no device to build a kernel: given a target (``GPUTarget("cuda",
90, 32)`` for an H100) it lowers the kernel to PTX, and the ``ptxas`` that ships in Triton's
wheel assembles that into the cubin a GPU would load. So this module shows, on a CPU
machine and in CI:

- that every kernel builds for the real backend. The tests on CPU run the kernels through
  Triton's interpreter, which executes the Python with numpy and never meets the compiler
  (it accepts code the compiler rejects, and has its own gaps);
- what each kernel costs an SM, as ptxas reports it: registers per thread, bytes spilled to
  local memory (slow: a spill is a round trip through the L1 cache or further), shared
  memory. From those and the SM's limits follow the programs resident per SM, and for a
  problem size how many programs the grid has for the GPU's SMs.

Each kernel is compiled with the launch parameters the launcher uses
(:func:`models.kernels.triton_kernels.scan_tiles`, ``SCAN_FWD_WARPS`` ...), the flags Mamba
passes (D skip, gate, delta bias, softplus, saved chunk states; causal conv with bias and
SiLU, width 4), and the specialisation Triton's JIT would make at such a launch: pointers
16-byte aligned, unit strides of contiguous (batch, time, channel) tensors as constants.

What it cannot give is time: occupancy and spills are causes, not measurements. The speed
targets are measured on a GPU (``scripts/gpu-bench.sh``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

# Per-SM limits of the compute capabilities a user is likely to name (CUDA C Programming
# Guide, "Technical Specifications per Compute Capability"): 32-bit registers, resident
# threads, resident blocks, shared memory (bytes), and the SM count of the flagship part
# (A100 108, H100 SXM 132, B200 148) for the grid-fill column.
ARCH_LIMITS = {
    80: dict(regs=65536, threads=2048, blocks=32, smem=167936, sms=108, name="A100 (sm_80)"),
    89: dict(regs=65536, threads=1536, blocks=24, smem=102400, sms=128, name="L40/RTX 40 (sm_89)"),
    90: dict(regs=65536, threads=2048, blocks=32, smem=233472, sms=132, name="H100 (sm_90)"),
    100: dict(regs=65536, threads=2048, blocks=32, smem=233472, sms=148, name="B200 (sm_100)"),
}
# The driver reserves 1 KiB of shared memory per block (sm_80 and later); registers are
# allocated per warp in units of 256.
SMEM_RESERVED_PER_BLOCK = 1024
REG_ALLOC_UNIT = 256

# The problem the grid-fill column is computed for: the issue-18 scan (batch 8, 128
# channels, 4096 steps).
PROBLEM = dict(batch=8, dim=128, L=4096)

# activation dtypes; fp64 is the tests' (every tensor and the compute in float64)
DTYPES = ("fp32", "bf16", "fp16", "fp64")
COLUMNS = ["kernel", "dtype", "N", "tile", "warps", "regs", "spill_B", "smem_B",
           "blocks_sm", "occupancy", "programs", "sm_fill"]


@dataclass
class Variant:
    """One kernel at one launch configuration: its constexprs, warps, and the dtype of each
    pointer argument (those in ``act_pointers`` the activations' dtype, the rest float32,
    or all float64 for fp64)."""
    kernel: str
    dtype: str                      # one of DTYPES: the activations
    N: int | None                   # state size (None for the conv)
    constexprs: dict[str, Any]
    num_warps: int
    act_pointers: tuple[str, ...]   # pointer arguments in the activations' dtype
    unit_strides: tuple[str, ...]   # stride arguments that are 1 at Mamba's launch

    @property
    def tile(self) -> str:
        """"BTxBDxBN" (scan) or "BLTxBLD" (conv), from the constexprs."""
        return "x".join(str(self.constexprs[k]) for k in ("BT", "BD", "BN", "BLT", "BLD")
                        if k in self.constexprs)


@contextlib.contextmanager
def _compiler_mode():
    """TRITON_INTERPRET off while kernels are decorated and compiled: the tests on CPU set it,
    and Triton reads it at decoration time (the interpreter's objects cannot be compiled)
    and while compiling (its constexpr functions then return plain values)."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _jit_module():
    """A copy of :mod:`models.kernels.triton_scan` whose kernels are compiler-ready
    ``JITFunction`` objects, also where the imported one runs under the interpreter."""
    spec = importlib.util.find_spec("models.kernels.triton_scan")
    with _compiler_mode():
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def variants(states=(16,), dtypes=("fp32",), arch: int = 90) -> list[Variant]:
    """The five kernels at the launcher's parameters for PROBLEM on ``arch``'s flagship GPU
    (its SM count picks the scan's channel tile), for each state size and activation dtype."""
    import triton.language as tl
    from models.kernels import triton_kernels as tk

    b, dim = PROBLEM["batch"], PROBLEM["dim"]
    sms = ARCH_LIMITS[arch]["sms"]
    out: list[Variant] = []
    for dtype in dtypes:
        compute = tl.float64 if dtype == "fp64" else tl.float32
        for N in states:
            flags = dict(HAS_D=True, HAS_Z=True, HAS_BIAS=True, SOFTPLUS=True, COMPUTE=compute)
            BT, BD, BN = tk.scan_tiles(N, b, dim, sms)
            out.append(Variant(
                "selective_scan_fwd_kernel", dtype, N,
                dict(flags, HAS_H0=False, SAVE_CKPT=True, BT=BT, BD=BD, BN=BN), tk.SCAN_FWD_WARPS,
                ("u_ptr", "delta_ptr", "z_ptr", "B_ptr", "C_ptr", "out_ptr"),
                ("su_d", "sdt_d", "sz_d", "sB_n", "sC_n", "so_d")))
            BT, BD, BN = tk.scan_tiles(N, b, dim, sms, backward=True)
            out.append(Variant(
                "selective_scan_bwd_kernel", dtype, N,
                dict(flags, HAS_DHLAST=False, BT=BT, BD=BD, BN=BN), tk.SCAN_BWD_WARPS,
                ("u_ptr", "delta_ptr", "z_ptr", "B_ptr", "C_ptr", "dout_ptr", "du_ptr",
                 "ddelta_ptr", "dz_ptr"),
                ("su_d", "sdt_d", "sz_d", "sB_n", "sC_n", "sdo_d", "sg_d")))
        conv = dict(COMPUTE=compute, K=4, BLT=tk.CONV_BLT, BLD=tk.CONV_BLD)
        out.append(Variant("causal_conv_fwd_kernel", dtype, None,
                           dict(conv, HAS_BIAS=True, HAS_LEFT=False, SILU=True), tk.CONV_WARPS,
                           ("x_ptr", "left_ptr", "out_ptr"), ("sx_d", "so_d")))
        conv = dict(conv, BLT=tk.CONV_BWD_BLT)
        out.append(Variant("causal_conv_bwd_pre_kernel", dtype, None,
                           dict(conv, HAS_BIAS=True, HAS_LEFT=False, SILU=True), tk.CONV_BWD_WARPS,
                           ("x_ptr", "left_ptr", "dout_ptr"), ("sx_d", "sdo_d")))
        out.append(Variant("causal_conv_bwd_input_kernel", dtype, None,
                           dict(conv, HAS_LEFT=False), tk.CONV_BWD_WARPS,
                           ("dx_ptr", "dleft_ptr"), ("sdx_d",)))
    return out


def grid_size(v: Variant) -> int:
    """Programs the launcher starts for PROBLEM at ``v``'s tiles (the grids in
    models/kernels/triton_kernels.py)."""
    b, dim, L = PROBLEM["batch"], PROBLEM["dim"], PROBLEM["L"]
    cx = v.constexprs
    cdiv = lambda a, c: -(-a // c)  # noqa: E731
    if v.kernel.startswith("selective_scan"):
        return cdiv(dim, cx["BD"]) * b
    extra = cx["K"] - 1 if v.kernel == "causal_conv_bwd_input_kernel" else 0
    return cdiv(L + extra, cx["BLT"]) * cdiv(dim, cx["BLD"]) * b


_PTXAS_RE = {
    "regs": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
}


def _ptxas_report(ptx: str, arch: int) -> dict[str, int]:
    """Registers, spill and stack bytes of ``ptx`` as ``ptxas -v`` reports them (the same
    ptxas Triton assembles with)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={sm_arch_from_capability(arch)}",
                               src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, check=True)
    log = proc.stderr + proc.stdout
    got = {}
    for key, rx in _PTXAS_RE.items():
        m = rx.search(log)
        got[key] = int(m.group(1)) if m else 0
    return got


def occupancy(regs: int, smem: int, warps: int, arch: int) -> tuple[int, float]:
    """(resident blocks per SM, resident warps / the SM's maximum) for a kernel using
    ``regs`` registers a thread and ``smem`` bytes of shared memory a block."""
    lim = ARCH_LIMITS[arch]
    warp_regs = -(-regs * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by_regs = (lim["regs"] // warp_regs) // warps if regs else lim["blocks"]
    by_threads = lim["threads"] // (warps * 32)
    by_smem = lim["smem"] // (smem + SMEM_RESERVED_PER_BLOCK)
    blocks = min(by_regs, by_threads, by_smem, lim["blocks"])
    return blocks, blocks * warps * 32 / lim["threads"]


def compile_variant(v: Variant, arch: int = 90, module=None) -> dict[str, Any]:
    """Compile ``v`` for compute capability ``arch`` and return its row of the table.
    Raises what Triton or ptxas raises when the kernel does not build."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    if arch not in ARCH_LIMITS:
        raise ValueError(f"arch {arch}: known {', '.join(map(str, ARCH_LIMITS))}")
    mod = module if module is not None else _jit_module()
    fn = getattr(mod, v.kernel)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    ptr_type = "*" + v.dtype
    other_type = "*fp64" if v.dtype == "fp64" else "*fp32"
    constexprs = dict(v.constexprs)
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in v.constexprs:
            signature[name] = "constexpr"
        elif name in v.unit_strides:
            signature[name] = "constexpr"
            constexprs[name] = 1
        elif name.endswith("_ptr"):
            signature[name] = ptr_type if name in v.act_pointers else other_type
            attrs[(i,)] = backend.parse_attr("D")        # torch's allocations: 16-byte aligned
        else:
            signature[name] = "i32"
    with _compiler_mode():
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                  options={"num_warps": v.num_warps})
    rep = _ptxas_report(compiled.asm["ptx"], arch)
    smem = int(compiled.metadata.shared)
    blocks, occ = occupancy(rep["regs"], smem, v.num_warps, arch)
    programs = grid_size(v)
    return dict(kernel=v.kernel.replace("_kernel", ""), dtype=v.dtype, N=v.N or "", tile=v.tile,
                warps=v.num_warps, regs=rep["regs"], spill_B=rep["spill_stores"] + rep["spill_loads"],
                smem_B=smem, blocks_sm=blocks, occupancy=f"{occ:.0%}", programs=programs,
                sm_fill=f"{programs / (ARCH_LIMITS[arch]['sms'] * max(blocks, 1)):.2f}",
                stack_B=rep["stack"])


def _parse_set(items: list[str]) -> dict[str, dict[str, int]]:
    """``--set KERNEL:KEY=VALUE,...`` -> {kernel: {key: int}} (constexprs and num_warps)."""
    out: dict[str, dict[str, int]] = {}
    for item in items:
        kernel, sep, body = item.partition(":")
        if not sep or not body:
            raise ValueError(f"--set {item!r}: expected KERNEL:KEY=VALUE[,KEY=VALUE...]")
        for pair in body.split(","):
            key, eq, value = pair.partition("=")
            if not eq:
                raise ValueError(f"--set {item!r}: {pair!r} is not KEY=VALUE")
            out.setdefault(kernel if kernel.endswith("_kernel") else kernel + "_kernel", {})[key] = int(value)
    return out


def _apply(v: Variant, overrides: dict[str, dict[str, int]]) -> Variant:
    """``v`` with its kernel's overrides (a tuning experiment)."""
    change = dict(overrides.get(v.kernel, {}))
    if not change:
        return v
    warps = change.pop("num_warps", v.num_warps)
    unknown = set(change) - set(v.constexprs)
    if unknown:
        raise ValueError(f"{v.kernel}: no constexpr {', '.join(sorted(unknown))}; "
                         f"it has {', '.join(sorted(v.constexprs))}")
    return dataclasses.replace(v, constexprs=dict(v.constexprs, **change), num_warps=warps)


def _writable_cache() -> None:
    """Triton writes what it compiles under ~/.triton/cache; a read-only home (some CI and
    cluster set-ups) gets a temporary folder instead of a failed compile."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return
    home = os.path.join(os.path.expanduser("~"), ".triton")
    try:
        os.makedirs(os.path.join(home, "cache"), exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=os.path.join(home, "cache")):
            pass
    except OSError:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")


def _stdlib_interpreted() -> bool:
    """Whether this process imported Triton's language under the interpreter: then even
    ``tl.sum`` is an interpreter object and nothing can be compiled in this process."""
    import triton.language.standard as standard
    from triton.runtime.jit import JITFunction
    return not isinstance(standard.sum, JITFunction)


def compile_all(arch: int = 90, states=(16,), dtypes=("fp32",),
                overrides: dict[str, dict[str, int]] | None = None, progress=None) -> list[dict[str, Any]]:
    """Every variant's row; a kernel that fails to build gets its error in ``error``. Runs
    in a fresh process where this one has Triton in interpreter mode (the tests)."""
    overrides = overrides or {}
    _writable_cache()
    if _stdlib_interpreted():
        return _compile_all_in_subprocess(arch, states, dtypes, overrides)
    mod = _jit_module()
    rows = []
    for v in variants(states, dtypes, arch):
        v = _apply(v, overrides)
        try:
            rows.append(compile_variant(v, arch, mod))
        except Exception as exc:  # noqa: BLE001  report every kernel, not only the first failure
            msg = " ".join(str(exc).split())[:300]
            rows.append(dict(kernel=v.kernel.replace("_kernel", ""), dtype=v.dtype, N=v.N or "",
                             tile=v.tile, warps=v.num_warps, error=f"{type(exc).__name__}: {msg}"))
        if progress:
            progress(rows[-1])
    return rows


def _compile_all_in_subprocess(arch, states, dtypes, overrides) -> list[dict[str, Any]]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "models.kernels.triton_aot", "--arch", str(arch), "--json",
           "--state", ",".join(map(str, states)), "--dtype", ",".join(dtypes)]
    for kernel, change in overrides.items():
        cmd += ["--set", kernel + ":" + ",".join(f"{k}={v}" for k, v in change.items())]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not rows:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"compiling in a subprocess failed (exit {proc.returncode}): {tail}")
    return rows


def unavailable_reason() -> str:
    """Why kernels cannot be compiled here ("" when they can): Triton or its ptxas missing."""
    try:
        import triton  # noqa: F401
        from triton.backends.nvidia.compiler import get_ptxas
        path = get_ptxas(90).path
    except Exception as exc:  # noqa: BLE001
        return f"Triton's CUDA backend unavailable: {type(exc).__name__}: {exc}"
    if not path or not os.path.exists(path):
        return "ptxas not found (Triton's wheel ships one; TRITON_PTXAS_PATH overrides it)"
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.kernels.triton_aot",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90, choices=sorted(ARCH_LIMITS))
    p.add_argument("--state", default="16", help="comma list of scan state sizes N")
    p.add_argument("--dtype", default="fp32", help="comma list of activation dtypes: " + ",".join(DTYPES))
    p.add_argument("--set", action="append", default=[], metavar="KERNEL:KEY=VALUE,...",
                   help="try other launch parameters, e.g. selective_scan_bwd:BD=4,num_warps=4")
    p.add_argument("--json", action="store_true", help="one JSON object a kernel")
    args = p.parse_args(argv)
    why = unavailable_reason()
    if why:
        print(why, file=sys.stderr)
        return 2
    try:
        states = tuple(int(s) for s in args.state.split(","))
        dtypes = tuple(args.dtype.split(","))
        bad = [d for d in dtypes if d not in DTYPES]
        if bad or any(n < 1 for n in states):
            raise ValueError(f"--dtype takes {','.join(DTYPES)} and --state positive integers")
        rows = compile_all(args.arch, states, dtypes, _parse_set(args.set))
    except ValueError as exc:
        print(f"triton_aot: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(f"Compiled for {ARCH_LIMITS[args.arch]['name']} without a GPU; programs and sm_fill "
              f"for batch {PROBLEM['batch']}, {PROBLEM['dim']} channels, L = {PROBLEM['L']}:")
        cols = COLUMNS + (["error"] if any("error" in r for r in rows) else [])
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for row in rows:    # plain markdown; `bench --triton-compile` aligns the columns
            print("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
