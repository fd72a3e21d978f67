"""`make gpu-check`: everything worth measuring on a lent GPU, in one command of at most ~8 minutes.

On a machine with an NVIDIA GPU and no network (the device image: CuPy, numba, numpy, pytest,
pytest-benchmark, PyTorch), it installs the project in place without dependencies, runs the
`gpu` tests and the GPU benchmarks, and writes every figure into the folder $GPU_CHECK_OUT (or
$OUT, else ./gpu-check): `gpu-check.md` (Markdown tables, for docs/GPU.md) and
`gpu-check.json` (the same as data), beside pytest's JUnit XML and pytest-benchmark's JSON.
Without a GPU it says so in one line and exits non-zero at once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_BUDGET_S = 230  # the gpu tests
BENCH_BUDGET_S = 230  # the benchmarks
TEST_TIMEOUT_S = 90  # one test or benchmark, so that one slow kernel cannot take the whole budget
INTERRUPT_GRACE_S = 20
# Each budget in two parts: the persistent executor's tests and benchmarks (-k persistent)
# after all the others, which leave them at least this much: it has never run on a GPU, and a
# fault there costs ~20 s a test (patience, then the wait for the kernel's end).
PERSISTENT_S = 60
PARTS = {"rest": "not persistent", "persistent": "persistent"}  # each part's name and -k expression
# The benchmarks' parts: the LLaMA layer's pair (stream and persistent) goes with the persistent
# executor's, whose comparison it is. Its stream benchmark compiles the layer's body and many
# instances cold; in the first part it spent that part's budget (2026-11-30), and the GEMM and
# attention benchmarks after it, the tensor-core targets, were not reached.
BENCH_PARTS = {"rest": "not persistent and not llama", "persistent": "persistent or llama"}
# pytest-xdist workers a part's tests run on. The persistent executor's are two: each worker is a
# process, whose CUDA context the GPU runs in turns with the others' (time slices), and a
# persistent kernel holds its blocks for its whole run, so each of 8 such kernels ran an eighth
# of the time (2026-11-30: the tests with every resident block did not end in 80 s); two let one
# compile its module on the host while the other's kernel runs.
WORKERS = {"rest": 8, "persistent": 2}
# A wait for the GPU that long is a hang (the backend's default is 600 s; pytest-timeout, which
# would stop the test, may not be there): one test's cost, not the budget's.
WAIT_S = "60"


def gpu() -> dict | None:
    """The device, as nvidia-smi and CuPy see it, or None without one."""
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if smi.returncode != 0 or not smi.stdout.strip():
        return None
    name, memory, driver = (field.strip() for field in smi.stdout.splitlines()[0].split(","))
    found = {"gpu": name, "memory": memory, "driver": driver, "python": platform.python_version(),
             "host_cpus": os.cpu_count()}
    try:
        import cupy

        found.update(cupy=cupy.__version__, cuda_runtime=cupy.cuda.runtime.runtimeGetVersion())
    except Exception as error:  # reported, and the tests will say the rest
        found["cupy"] = f"unavailable: {error}"
    return found


def run(command: list[str], budget: float, log: Path) -> tuple[int, float]:
    """Run `command` in the repository with a time limit; its output to `log`.

    At the limit pytest is interrupted as by Ctrl-C, so it still writes its JUnit XML and
    benchmark JSON for what finished; it is killed only if it does not stop within a grace period.
    Either way the signal goes to its process group, and at the end the group is killed: an
    xdist worker left running (a test's kernel holding the GPU, its thread busy) would share the
    GPU and the host with the next part, and slow what it measures. The group has a session of
    its own, out of the terminal's reach, so gpu-check stopped itself (Ctrl-C, SIGTERM: `main`
    makes it an exception) stops it the same way first.
    """
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   env={"PTO_GPU_TIMEOUT": WAIT_S, **os.environ}, start_new_session=True)
        try:
            code = process.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            _interrupt(process)
            code = 124
        except BaseException:
            _interrupt(process)
            raise
        finally:
            _signal_group(process, signal.SIGKILL)
    return code, time.perf_counter() - started


def _interrupt(process: subprocess.Popen) -> None:
    """Interrupt pytest as Ctrl-C would, so that it writes its reports; kill it if it has not
    stopped within the grace period."""
    _signal_group(process, signal.SIGINT)
    try:
        process.wait(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _signal_group(process: subprocess.Popen, sent: int) -> None:
    """Send `sent` to the process group `process` leads (its own session), if any is left."""
    try:
        os.killpg(process.pid, sent)
    except ProcessLookupError:
        pass


def run_parts(command, budget: float, out: Path, name: str, parts: dict[str, str]) -> tuple[int, float]:
    """`command(expression, part)` for each of `parts` (PARTS, BENCH_PARTS) in turn (its log
    gpu-{name}-{part}.log), the first within the budget less PERSISTENT_S and the interrupt's
    grace, the second within what is left: the first nonzero exit status (the second part's 5,
    nothing selected, is not one) and the seconds in all."""
    (first, expression), (second, rest) = parts.items()
    code, seconds = run(command(expression, first), budget - PERSISTENT_S - INTERRUPT_GRACE_S,
                        out / f"gpu-{name}-{first}.log")
    code_after, more = run(command(rest, second), budget - seconds, out / f"gpu-{name}-{second}.log")
    return code or (0 if code_after == 5 else code_after), seconds + more


def test_counts(junits: list[Path]) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    roots = [ElementTree.parse(junit).getroot() for junit in junits if junit.exists()]
    # An interrupted xdist run may leave a <testcase> with no name: not a test that ran.
    for case in (case for root in roots for case in root.iter("testcase") if case.get("name")):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome in ("failure", "error"):
            counts["failed"] += 1
            counts["failures"].append(f"{case.get('classname')}::{case.get('name')}")
        elif outcome == "skipped":
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def gpu_tests_collected() -> int | None:
    """How many `gpu` tests there are (those a budget leaves unrun are counted as such), or None
    where pytest cannot say."""
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p",
                             "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True, text=True)
    found = re.search(r"^(\d+)(?:/\d+)? tests? collected", listed.stdout, re.MULTILINE)
    return int(found.group(1)) if found else None


def benchmark_rows(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """The benchmarks' figures from pytest-benchmark's JSON files, and the files that could not be
    read (a run killed while it wrote one)."""
    rows, runs, unreadable = [], [], []
    for path in (path for path in paths if path.exists()):
        try:
            runs.append(json.loads(path.read_text()))
        except ValueError:
            unreadable.append(path.name)
    for bench in (bench for run in runs for bench in run["benchmarks"]):
        stats = bench["stats"]
        rows.append({"name": bench["name"], "median_ms": stats["median"] * 1e3, "min_ms": stats["min"] * 1e3,
                     "rounds": stats["rounds"], **bench.get("extra_info", {})})
    return rows, unreadable


def markdown(report: dict) -> str:
    device = report["device"]
    lines = ["# gpu-check", "", f"{device['gpu']} ({device['memory']}), driver {device['driver']}, CuPy "
             f"{device.get('cupy')}, CUDA runtime {device.get('cuda_runtime')}, Python {device['python']}, "
             f"{device['host_cpus']} host CPUs; {report['date']}", ""]
    tests = report["tests"]
    lines += ["| gpu tests | passed | failed | skipped | not run (budget) | seconds | exit |",
              "|---|---|---|---|---|---|---|",
              f"| `pytest -m gpu` | {tests['passed']} | {tests['failed']} | {tests['skipped']} | "
              f"{tests['not_run']} | {tests['seconds']:.0f} | {tests['exit']} |", ""]
    lines += [f"- failed: `{name}`" for name in tests["failures"]]
    lines += [f"- unreadable benchmark report: `{name}`" for name in report["unreadable"]]
    lines += ["", "| benchmark | median ms | min ms | rounds | figures |", "|---|---|---|---|---|"]
    for row in report["benchmarks"]:
        figures = ", ".join(f"{key} {value:.3g}" for key, value in row.items()
                            if key not in ("name", "median_ms", "min_ms", "rounds")
                            and isinstance(value, float))
        lines.append(f"| `{row['name']}` | {row['median_ms']:.3f} | {row['min_ms']:.3f} | {row['rounds']} | "
                     f"{figures} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))  # `run` stops its part
    device = gpu()
    if device is None:
        print("gpu-check: no NVIDIA GPU here (nvidia-smi finds none); nothing was run")
        return 1
    out = Path(os.environ.get("GPU_CHECK_OUT") or os.environ.get("OUT") or ROOT / "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    # In place and offline: the image has the dependencies.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                    str(ROOT)], check=True)
    collected = gpu_tests_collected()
    xdist = importlib.util.find_spec("xdist") is not None
    # pytest-timeout's signal method fails the one test and goes on (its thread method would
    # end the process and lose the reports).
    timeout = ([f"--timeout={TEST_TIMEOUT_S}", "--timeout-method=signal"]
               if importlib.util.find_spec("pytest_timeout") else [])
    code, seconds = run_parts(lambda expression, part: [
        sys.executable, "-m", "pytest", "-m", "gpu", "-k", expression, "-q", "-rfE", "--durations=20", "-p",
        "no:cacheprovider", *(["-n", str(WORKERS[part])] if xdist else []), *timeout,
        f"--junitxml={out / f'gpu-tests-{part}.xml'}", "tests"],
        TEST_BUDGET_S, out, "tests", PARTS)
    junits = [out / f"gpu-tests-{part}.xml" for part in PARTS]
    tests = {**test_counts(junits), "seconds": seconds, "exit": code}
    ran = tests["passed"] + tests["failed"] + tests["skipped"]
    tests["not_run"] = "?" if collected is None else max(collected - ran, 0)
    bench_code, bench_seconds = run_parts(lambda expression, part: [
        sys.executable, "-m", "pytest", "-k", expression, "-q", "-p", "no:cacheprovider", "bench/test_gpu.py",
        "bench/test_host.py", "--benchmark-only", *timeout,
        f"--benchmark-json={out / f'gpu-bench-{part}.json'}"],
        BENCH_BUDGET_S, out, "bench", BENCH_PARTS)
    rows, unreadable = benchmark_rows([out / f"gpu-bench-{part}.json" for part in BENCH_PARTS])
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tests": tests,
              "benchmarks": rows, "unreadable": unreadable,
              "bench_exit": bench_code,
              "bench_seconds": bench_seconds}
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2))
    (out / "gpu-check.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if code == 0 and bench_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
