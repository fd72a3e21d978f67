"""`make gpu-check`'s reporting (bench/gpu_check.py, bench/conftest.py), which runs only where a
GPU is lent: here, that a budget running out inside a benchmark loses only that benchmark, and that
a part leaves no process of its own running."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


# A part's child that ignores SIGINT (as a worker deep in a wait may not stop for it) while its
# parent stops at once: only the group's SIGKILL ends the child. Its pid into the file named.
STUBBORN_CHILD = "(trap '' INT; exec sleep 300) & echo $! > {}; wait"


def ended(pid: int) -> bool:
    """Whether process `pid` has ended (gone, or a zombie), waiting up to 10 s for a SIGKILL to
    take effect; killed if not, so that a failing test leaves nothing behind."""
    stat = Path(f"/proc/{pid}/stat")

    def state() -> str:
        try:
            return stat.read_text().split()[2]
        except FileNotFoundError:
            return "gone"

    deadline = time.monotonic() + 10  # a SIGKILL takes effect at the process's next scheduling
    while state() not in ("gone", "Z") and time.monotonic() < deadline:
        time.sleep(0.01)
    if state() in ("gone", "Z"):
        return True
    os.kill(pid, signal.SIGKILL)
    return False


def test_a_part_past_its_budget_leaves_none_of_its_processes_running(tmp_path):
    """A budget's end stops the part's whole process group: a child (an xdist worker with a
    kernel in flight) that outlived it would share the GPU and the host with the next part."""
    pid_file = tmp_path / "child.pid"
    code, seconds = gpu_check.run(["bash", "-c", STUBBORN_CHILD.format(pid_file)], 1.0, tmp_path / "part.log")
    assert code == 124 and seconds < gpu_check.INTERRUPT_GRACE_S
    assert ended(int(pid_file.read_text()))


def test_gpu_check_stopped_stops_its_part_too(tmp_path):
    """Ctrl-C (or SIGTERM, which main turns into an exception) while a part runs: the part's
    group, in a session of its own that the terminal's signals do not reach, is stopped too."""
    pid_file = tmp_path / "child.pid"

    def interrupt(number, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            gpu_check.run(["bash", "-c", STUBBORN_CHILD.format(pid_file)], 60.0, tmp_path / "part.log")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ended(int(pid_file.read_text()))
