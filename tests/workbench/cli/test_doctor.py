"""`ssm-workbench doctor`: the rows are there, a failing probe is a row and not a crash,
an unwritable store exits 1, --json parses, and NVML's GPUs are listed."""
import json
import sys
import types

from workbench import cli
from workbench.cli import doctor


def test_rows_present(tmp_path):
    rows = doctor.probe(str(tmp_path / "st"))
    names = {r.component for r in rows}
    for want in ("python", "torch", "NVIDIA driver", "torch CUDA", "C compiler", "cpu kernels", "triton",
                 "mamba-ssm", "causal-conv1d", "scan auto (cpu)", "scan auto (cuda)", "store",
                 "flash-linear-attention", "linear-rnn auto (cpu)", "linear-rnn auto (cuda)"):
        assert want in names, (want, names)
    assert all(r.status in ("ok", "warn", "missing") and r.detail for r in rows)
    store = next(r for r in rows if r.component == "store")
    assert store.status == "ok" and str(tmp_path / "st") in store.detail
    assert (tmp_path / "st").is_dir() and list((tmp_path / "st").iterdir()) == []  # no database touched
    assert doctor.exit_code(rows) == 0


def test_failing_probe_is_a_row(tmp_path, monkeypatch, capsys):
    def boom(ctx):
        raise RuntimeError("the probe itself broke")

    probes = [(n, boom if n == "triton" else f) for n, f in doctor.PROBES]
    monkeypatch.setattr(doctor, "PROBES", probes)
    rows = doctor.probe(str(tmp_path / "st"))
    (row,) = [r for r in rows if r.component == "triton"]
    assert row.status == "warn" and "RuntimeError: the probe itself broke" in row.detail
    assert any(r.component == "store" for r in rows)  # the probes after it still ran
    assert cli.main(["--store", str(tmp_path / "st"), "doctor"]) == 0
    assert "the probe itself broke" in capsys.readouterr().out


def test_unwritable_store_exits_1(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")  # a file where the store directory should be (root can't write there either)
    assert cli.main(["--store", str(not_a_dir), "doctor"]) == 1
    assert "not writable" in capsys.readouterr().out


def test_unwritable_store_from_env(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("SSM_WORKBENCH_STORE", str(tmp_path / "file" / "sub"))
    rows = doctor.probe()
    store = next(r for r in rows if r.component == "store")
    assert store.status == "missing" and "$SSM_WORKBENCH_STORE" in store.detail
    assert doctor.exit_code(rows) == 1


def test_json_parses(tmp_path, capsys):
    assert cli.main(["--store", str(tmp_path / "st"), "doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, list) and data
    assert all(set(d) == {"component", "status", "detail"} for d in data)
    assert {"store", "python", "torch"} <= {d["component"] for d in data}


def _fake_pynvml(n=2, fail_init=False):
    m = types.ModuleType("pynvml")

    def init():
        if fail_init:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: f"NVIDIA H100 80GB HBM3 #{h}"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30, used=2**30, free=79 * 2**30)
    return m


def test_nvml_gpus_listed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(2))
    ctx = {}
    rows = doctor.probe_nvml(ctx)
    assert rows[0].status == "ok" and "550.54.15" in rows[0].detail and "CUDA 12.4" in rows[0].detail
    assert [r.component for r in rows[1:]] == ["GPU 0", "GPU 1"]
    assert "H100" in rows[1].detail and "81,920 MiB" in rows[1].detail
    assert ctx["nvml_gpus"] == 2


def test_no_driver_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail_init=True))
    (row,) = doctor.probe_nvml({})
    assert row.status == "missing" and "no NVML / no driver" in row.detail and "libnvidia-ml" in row.detail


# --------------------------------------------------------------------------- this run's GPU memory
# (sysmon.sample inside the worker, and the run view's system panel; the fake NVML is shared)
def _fake_nvml_with_processes(own_pid, own_bytes):
    m = _fake_pynvml(1)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30, used=20 * 2**30,
                                                                free=60 * 2**30)
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=own_pid, usedGpuMemory=own_bytes),
        types.SimpleNamespace(pid=own_pid + 100000, usedGpuMemory=7 * 2**30),  # another run
        types.SimpleNamespace(pid=own_pid + 100001, usedGpuMemory=None),  # no per-process figure
    ]
    return m


def _fresh_sysmon(monkeypatch, fake):
    from workbench.train import sysmon

    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(sysmon, "_nvml_state", {"init": None, "why": ""})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    return sysmon


def test_sample_has_this_process_gpu_memory(monkeypatch):
    import os

    sysmon = _fresh_sysmon(monkeypatch, _fake_nvml_with_processes(os.getpid(), 512 * 2**20))
    s = sysmon.sample()
    assert s["gpu_proc_mem_mb"] == 512.0
    assert s["gpu_mem_used_mb"] == 20 * 1024 and s["gpu_mem_total_mb"] == 80 * 1024 and s["gpu_util"] == 87.0


def test_sample_without_this_process_listed(monkeypatch):
    import os

    sysmon = _fresh_sysmon(monkeypatch, _fake_nvml_with_processes(os.getpid() + 1, 2**20))
    s = sysmon.sample()
    assert "gpu_proc_mem_mb" not in s and s["gpu_mem_used_mb"] == 20 * 1024  # the rest is still there

    fake = _fake_nvml_with_processes(os.getpid(), 2**20)

    def broken(h):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    fake.nvmlDeviceGetComputeRunningProcesses = broken
    sysmon = _fresh_sysmon(monkeypatch, fake)
    s = sysmon.sample()
    assert "gpu_proc_mem_mb" not in s and s["gpu_util"] == 87.0


async def _panel_text(rows):
    from textual.app import App
    from textual.widgets import Static

    from workbench.tui.system_panel import SystemPanel

    class Host(App):
        def compose(self):
            yield SystemPanel(id="sys")

    app = Host()
    async with app.run_test(size=(100, 20)) as pilot:
        app.query_one(SystemPanel).show(rows)
        await pilot.pause()
        return str(app.query_one("#sys-text", Static).render())


def _gpu_row(**extra):
    return {"cpu_percent": 100.0, "rss_mb": 900.0, "gpu_util": 87.0, "gpu_mem_used_mb": 20480.0,
            "gpu_mem_total_mb": 81920.0, "gpu_name": "NVIDIA H100", **extra}


async def test_panel_shows_this_run_gpu_memory():
    text = await _panel_text([_gpu_row(gpu_proc_mem_mb=512.0)])
    assert "this run: 512 MiB · GPU: 20,480 / 81,920 MiB" in text and "GPU utilisation 87%" in text


async def test_panel_without_the_field(tmp_path):
    # a store's system rows (no gpu_proc_mem_mb column there): device figures only, no crash
    from workbench.store import Store

    store = Store(tmp_path / "st")
    [rid] = store.add_runs([{"profile": "p", "model": "lstm", "label": "lstm", "task": "t", "seq_len": 8,
                             "seed": 0, "index": 0, "fields": {}}])
    store.add_system(rid, _gpu_row(gpu_proc_mem_mb=512.0))
    text = await _panel_text(store.system(rid))
    if "gpu_proc_mem_mb" in store.system(rid)[0].keys():  # once the store keeps the column
        assert "this run: 512 MiB · GPU: 20,480 / 81,920 MiB" in text
    else:
        assert "GPU memory 20,480 / 81,920 MiB" in text and "this run" not in text
