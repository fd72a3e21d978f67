"""`make gpu-check`'s reporting (bench/gpu_check.py, bench/conftest.py), which runs only where a
GPU is lent: here, that a budget running out inside a benchmark loses only that benchmark."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
spec = importlib.util.spec_from_file_location("gpu_check", BENCH / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

INTERRUPTED_RUN = '''
import os
import signal


def test_finishes(benchmark):
    benchmark(sum, range(10))


def test_interrupted_in_its_first_round(benchmark):
    benchmark.pedantic(os.kill, (os.getpid(), signal.SIGINT), rounds=1)
'''


def test_a_run_interrupted_inside_a_benchmark_keeps_the_figures_of_those_that_finished(tmp_path):
    """As gpu-check's budget does (SIGINT): pytest-benchmark alone failed on the benchmark with no
    rounds and wrote an empty JSON file (an H200's persistent part, 2026-11-30)."""
    (tmp_path / "test_run.py").write_text(INTERRUPTED_RUN)
    report = tmp_path / "bench.json"
    # without this pytest's own variables: an xdist worker's would turn pytest-benchmark off
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--benchmark-only", f"--benchmark-json={report}", "test_run.py"], cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(BENCH)}, capture_output=True, text=True, timeout=120)
    rows, unreadable = gpu_check.benchmark_rows([report])
    assert [row["name"] for row in rows] == ["test_finishes"] and unreadable == [], done.stdout + done.stderr


def test_the_report_names_an_unreadable_benchmark_file_and_keeps_the_others(tmp_path):
    (tmp_path / "gpu-bench-persistent.json").write_text("")
    (tmp_path / "gpu-bench-rest.json").write_text(json.dumps({"benchmarks": [
        {"name": "test_x", "stats": {"median": 0.002, "min": 0.001, "rounds": 3},
         "extra_info": {"tflops": 1.5}}]}))
    paths = [tmp_path / f"gpu-bench-{part}.json" for part in gpu_check.BENCH_PARTS]
    rows, unreadable = gpu_check.benchmark_rows(paths)
    assert unreadable == ["gpu-bench-persistent.json"]
    assert rows == [{"name": "test_x", "median_ms": 2.0, "min_ms": 1.0, "rounds": 3, "tflops": 1.5}]
    report = {"device": {"gpu": "G", "memory": "1 MiB", "driver": "1", "python": "3", "host_cpus": 1},
              "date": "today", "unreadable": unreadable, "benchmarks": rows,
              "tests": {"passed": 3, "failed": 0, "skipped": 1, "not_run": 16, "failures": [], "seconds": 9.0,
                        "exit": 124}}
    text = gpu_check.markdown(report)
    assert "| `pytest -m gpu` | 3 | 0 | 1 | 16 | 9 | 124 |" in text
    assert "unreadable benchmark report: `gpu-bench-persistent.json`" in text
    assert "| `test_x` | 2.000 | 1.000 | 3 | tflops 1.5 |" in text


def test_the_counts_leave_out_a_nameless_testcase_an_interrupted_run_wrote(tmp_path):
    (tmp_path / "gpu-tests-rest.xml").write_text(
        '<testsuites><testsuite><testcase classname="t" name="test_a"/>'
        '<testcase classname="t" name="test_b"><failure message="no"/></testcase>'
        '<testcase classname="t" name="test_c"><skipped/></testcase>'
        '<testcase classname="" time="0"/></testsuite></testsuites>')
    counts = gpu_check.test_counts([tmp_path / f"gpu-tests-{part}.xml" for part in gpu_check.PARTS])
    assert counts == {"passed": 1, "failed": 1, "skipped": 1, "failures": ["t::test_b"]}


def test_a_part_past_its_budget_leaves_none_of_its_processes_running(tmp_path):
    """A budget's end stops the part's whole process group: a child (an xdist worker with a
    kernel in flight) that outlived it would share the GPU and the host with the next part."""
    pid_file = tmp_path / "child.pid"
    # The child ignores SIGINT (as a worker deep in a wait may not stop for it) and the parent
    # stops at once, so only the group's SIGKILL ends the child.
    script = f"(trap '' INT; exec sleep 300) & echo $! > {pid_file}; wait"
    code, seconds = gpu_check.run(["bash", "-c", script], 1.0, tmp_path / "part.log")
    child = Path(f"/proc/{int(pid_file.read_text())}/stat")
    assert code == 124 and seconds < gpu_check.INTERRUPT_GRACE_S

    def state() -> str:  # the child's, as the kernel has it: gone, or a zombie, once it has ended
        try:
            return child.read_text().split()[2]
        except FileNotFoundError:
            return "gone"

    deadline = time.monotonic() + 10  # a SIGKILL takes effect at the process's next scheduling
    while state() not in ("gone", "Z") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state() in ("gone", "Z"), f"the part's child ({child}) still runs"
