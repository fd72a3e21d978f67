"""What an install of the project holds: its version, and a wheel built without a warning that
carries the files the runtime reads at run time (the CUDA emulator's C source, the ISA's CUDA
header, the orchestrations' .pto programs)."""

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

import pto_gpu as pto

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_says_its_version():
    assert pto.__version__ == importlib.metadata.version("pto-gpu")


def test_a_wheel_builds_without_warnings_and_holds_the_runtime_files(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("pto_gpu/backends/cuda_emulator.c", "pto_gpu/isa/pto_isa.cuh", "pto_gpu/isa/pto_wgmma.cuh",
                   "pto_gpu/isa/wgmma_probe.cu",
                   "pto_gpu/orchestration/programs/matmul.pto", "pto_gpu/orchestration/programs/llama.pto"):
        assert needed in names
