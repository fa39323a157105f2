"""``ssm-workbench doctor``: what this machine can do, and why not.

:func:`probe` runs every check and returns :class:`Row` s (component, status, detail);
:func:`render` draws them as one ``rich`` table; :func:`exit_code` is 1 when the store is
not writable (nothing can run then), else 0. Statuses: ``ok`` (works), ``missing`` (absent
here, e.g. no GPU on a CPU machine) and ``warn`` (present but not working, or a slower
fallback). Every probe catches its own exceptions and reports them as a row, so doctor
never crashes on the broken machine it is meant to diagnose.

On a CUDA machine the Triton probe runs the kernels' one-off self-check (a tiny forward and
backward against the reference; a second or two of compiling), so its row says whether the
kernels actually build and agree on this GPU.
"""
from __future__ import annotations

import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

OK, WARN, MISSING = "ok", "warn", "missing"
STATUS_STYLE = {OK: "green", WARN: "yellow", MISSING: "red"}


@dataclass
class Row:
    component: str
    status: str  # ok | warn | missing
    detail: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _why(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _dist_version(name: str) -> str:
    """The installed version of distribution ``name``, or "" (no import: cheap and safe)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


# --------------------------------------------------------------------------- probes
# Each probe takes the shared context (earlier probes leave facts there, e.g. the NVML
# GPU count for the torch row's "why not") and returns its rows.

def probe_python(ctx: dict) -> list[Row]:
    return [Row("python", OK, f"{platform.python_version()} ({sys.executable})")]


def probe_cpu(ctx: dict) -> list[Row]:
    import torch

    return [Row("cpu", OK, f"{os.cpu_count()} core(s), torch threads {torch.get_num_threads()}, "
                            f"{platform.machine()}")]


def probe_torch(ctx: dict) -> list[Row]:
    import torch

    cuda = torch.version.cuda
    ctx["torch_cuda"] = bool(torch.cuda.is_available())
    return [Row("torch", OK, f"{torch.__version__}, torch.version.cuda = "
                             f"{cuda if cuda else 'None (a CPU build)'}")]


def probe_nvml(ctx: dict) -> list[Row]:
    ctx["nvml_gpus"] = 0
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # no library, no driver
        return [Row("NVIDIA driver", MISSING, f"no NVML / no driver ({_why(e)})")]
    try:
        def s(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        driver = s(pynvml.nvmlSystemGetDriverVersion())
        try:
            cv = int(pynvml.nvmlSystemGetCudaDriverVersion())
            driver += f", supports CUDA {cv // 1000}.{cv % 1000 // 10}"
        except Exception:
            pass
        n = int(pynvml.nvmlDeviceGetCount())
        ctx["nvml_gpus"] = n
        rows = [Row("NVIDIA driver", OK if n else WARN, f"driver {driver}; NVML sees {n} GPU(s)")]
        for i in range(n):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                rows.append(Row(f"GPU {i}", OK, f"{s(pynvml.nvmlDeviceGetName(h))}, "
                                                f"{mem.total / 2**20:,.0f} MiB total"))
            except Exception as e:
                rows.append(Row(f"GPU {i}", WARN, f"NVML cannot query it ({_why(e)})"))
        return rows
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def probe_torch_cuda(ctx: dict) -> list[Row]:
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(n))
        return [Row("torch CUDA", OK, f"torch sees {n} CUDA device(s): {names}")]
    why = "torch sees no CUDA device"
    if ctx.get("nvml_gpus"):
        if not torch.version.cuda:
            why += (f", but NVML sees {ctx['nvml_gpus']} GPU(s): this torch is a CPU build "
                    "(reinstall: TORCH_SPEC=torch EXTRAS=test,cuda ./run.sh)")
        else:
            why += (f", but NVML sees {ctx['nvml_gpus']} GPU(s): check that the driver supports "
                    f"CUDA {torch.version.cuda} and CUDA_VISIBLE_DEVICES="
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")
        return [Row("torch CUDA", WARN, why)]
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        why += f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})"
    return [Row("torch CUDA", MISSING, why + ": runs train on the CPU")]


def probe_cpu_kernels(ctx: dict) -> list[Row]:
    import subprocess

    from models.kernels import cpu_kernels

    rows = []
    cc = cpu_kernels._compiler()
    if cc is None:
        rows.append(Row("C compiler", MISSING, f"no C compiler found ($CC or cc; "
                                              f"CC={os.environ.get('CC', '(unset)')})"))
    else:
        try:
            out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10).stdout
            first = (out.strip().splitlines() or [""])[0]
        except Exception as e:
            first = f"does not run: {_why(e)}"
        rows.append(Row("C compiler", OK, f"{cc}: {first}"))
    if cpu_kernels.available():
        rows.append(Row("cpu kernels", OK, f"built and loaded (cache {cpu_kernels.cache_dir()})"))
    else:
        why = cpu_kernels.unavailable_reason()
        rows.append(Row("cpu kernels", MISSING if cc is None else WARN,
                        f"{why}; Mamba on CPU uses the slower torch backend"))
    return rows


def probe_triton(ctx: dict) -> list[Row]:
    from models.kernels import selective_scan, triton_kernels

    v = triton_kernels.version()
    if not v:
        return [Row("triton", MISSING, "not installed (comes with CUDA builds of torch)")]
    mode = "interpreter mode (TRITON_INTERPRET=1)" if triton_kernels.interpreting() else "compiled mode"
    why = selective_scan.triton_unavailable_reason("cuda")  # on CUDA: the kernels' self-check
    if not why:
        return [Row("triton", OK, f"{v}, {mode}; kernels pass the self-check on CUDA")]
    status = WARN if ctx.get("torch_cuda") else MISSING
    return [Row("triton", status, f"{v}, {mode}; backend 'triton' unavailable on CUDA: {why}")]


def _official(component: str, dist: str, reason: str, ctx: dict) -> Row:
    installed = _dist_version(dist)
    if not reason:
        return Row(component, OK, f"{installed or 'importable'}")
    have = f"{installed} installed" if installed else "not installed"
    # installed but not importable on a CUDA machine is worth fixing; absent is optional
    status = WARN if (installed and ctx.get("torch_cuda")) else MISSING
    return Row(component, status, f"{have}; {reason}")


def probe_official_kernels(ctx: dict) -> list[Row]:
    from models.kernels import selective_scan

    return [_official("mamba-ssm", "mamba-ssm", selective_scan.cuda_unavailable_reason(), ctx),
            _official("causal-conv1d", "causal-conv1d", selective_scan._load_cuda_conv()[1], ctx)]


def probe_auto_backend(ctx: dict) -> list[Row]:
    import torch

    from models.kernels import selective_scan

    cpu = selective_scan.choose_backend("auto", "cpu")
    rows = [Row("scan auto (cpu)", OK if cpu == "cpu" else WARN, f"backend '{cpu}' for CPU tensors")]
    if torch.cuda.is_available():
        gpu = selective_scan.choose_backend("auto", "cuda")
        rows.append(Row("scan auto (cuda)", OK if gpu in ("cuda", "triton") else WARN,
                        f"backend '{gpu}' for CUDA tensors"))
    else:
        rows.append(Row("scan auto (cuda)", MISSING, "no CUDA device"))
    return rows


def probe_linear_rnn(ctx: dict) -> list[Row]:
    """Which implementation the linear-RNN layers (mamba2, gla, retnet, deltanet, ...) run:
    fla's Triton kernels (an optional extra) on CUDA when they import, else PyTorch's
    chunked form; the C kernels on a CPU when they build; and mamba-ssm's SSD kernel for
    mamba2."""
    import torch

    from models.kernels import linear_rnn_backends as lrb

    ok, why = lrb.fla_status()
    rows = [Row("flash-linear-attention", OK if ok else MISSING,
                why if ok else f"{why}; optional: without it linear-RNN layers run the 'cpu' / 'torch' backends")]
    cpu = lrb.resolve("auto", "cpu")
    c_ok, c_why = lrb.cpu_status()
    rows.append(Row("linear-rnn auto (cpu)", OK if c_ok else WARN,
                    f"backend '{cpu}' for CPU tensors"
                    + ("" if c_ok else f" (C kernels unavailable: {c_why})")))
    if torch.cuda.is_available():
        gpu = lrb.resolve("auto", "cuda")
        rows.append(Row("linear-rnn auto (cuda)", OK if gpu == "fla" else WARN,
                        f"backend '{gpu}' for CUDA tensors"
                        + ("" if gpu == "fla" else " (install flash-linear-attention for fla's kernels)")))
    else:
        rows.append(Row("linear-rnn auto (cuda)", MISSING, "no CUDA device"))
    return rows


def probe_slots(ctx: dict) -> list[Row]:
    from workbench.execute import scheduler

    gpus = scheduler._visible_gpus()
    if gpus:
        return [Row("run slots", OK, f"{len(gpus)} GPU slot(s) (CUDA_VISIBLE_DEVICES "
                                     f"{','.join(gpus)}); --runs-per-gpu N for more")]
    return [Row("run slots", OK, "1 CPU slot (no GPU): --jobs N for concurrent CPU runs")]


def store_location(store: str | None) -> tuple[Path, str]:
    """(the store directory, where that choice came from), as ``cli`` resolves it."""
    from workbench.store import default_store_dir

    if store:
        return Path(store).expanduser(), "--store"
    if os.environ.get("SSM_WORKBENCH_STORE"):
        return default_store_dir(), "$SSM_WORKBENCH_STORE"
    return default_store_dir(), "default"


def probe_store(ctx: dict) -> list[Row]:
    """Writable without touching the database: create the directory like the store would,
    then create and remove a temporary file in it."""
    root, source = store_location(ctx.get("store"))
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".doctor-", dir=root)
        os.close(fd)
        os.unlink(tmp)
    except Exception as e:
        return [Row("store", MISSING, f"{root} ({source}) is not writable: {_why(e)}")]
    db = root / "store.sqlite"
    what = f"store.sqlite {db.stat().st_size / 2**20:.1f} MiB" if db.exists() else "no database yet"
    return [Row("store", OK, f"{root} ({source}), writable; {what}")]


PROBES: list[tuple[str, Callable[[dict], list[Row]]]] = [
    ("python", probe_python),
    ("torch", probe_torch),
    ("cpu", probe_cpu),
    ("NVIDIA driver", probe_nvml),
    ("torch CUDA", probe_torch_cuda),
    ("cpu kernels", probe_cpu_kernels),
    ("triton", probe_triton),
    ("mamba-ssm / causal-conv1d", probe_official_kernels),
    ("selective-scan auto", probe_auto_backend),
    ("linear-rnn backends", probe_linear_rnn),
    ("run slots", probe_slots),
    ("store", probe_store),
]


def probe(store: str | None = None) -> list[Row]:
    """Every probe's rows, in order; a probe that raises becomes a ``warn`` row with the error."""
    ctx: dict[str, Any] = {"store": store}
    rows: list[Row] = []
    for name, fn in PROBES:
        try:
            rows.extend(fn(ctx))
        except Exception as e:  # noqa: BLE001  a broken probe is a finding, not a crash
            status = MISSING if name == "store" else WARN
            rows.append(Row(name, status, f"probe failed: {_why(e)}"))
    return rows


def exit_code(rows: list[Row]) -> int:
    """1 when the store is not writable (nothing could run), else 0."""
    return 1 if any(r.component == "store" and r.status != OK for r in rows) else 0


def render(rows: list[Row], console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    t = Table(title="ssm-workbench doctor", title_justify="left")
    t.add_column("component", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("detail", overflow="fold")
    for r in rows:
        t.add_row(r.component, Text(r.status, style=STATUS_STYLE.get(r.status, "")), Text(r.detail))
    console.print(t)
    if exit_code(rows):
        console.print("[red]the store is not writable: runs cannot be recorded "
                      "(--store DIR or SSM_WORKBENCH_STORE=DIR)[/red]")
