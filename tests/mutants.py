"""`make mutate`: apply each of a curated list of mutants to a copy of the repository and run
the tests that should kill it; report each one's killer (docs/MUTANTS.md has the list and the
last result). A mutant that survives makes the command fail.

Each mutant is a one-line change of the kind a slip of the pen makes (an off-by-one, a lost
case, a condition turned round) in the code whose bugs would be silent wrong answers: the
core's dependency analysis and rings, the overlap tests, the ISA verifier, the two code
generators and the executors. Each runs in a fresh copy of the tracked files (its numba caches
are the copy's, so a mutant never reaches the tree's caches), with `pytest -x` over its killers.

    python tests/mutants.py [NAME ...]     # all of them, or those named
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 900  # seconds a mutant's tests may take (a mutant that hangs counts as killed by the timeout)


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository
    before: str  # occurs exactly once in the file
    after: str
    killers: tuple[str, ...]  # pytest arguments: the tests that should fail


MUTANTS = [
    Mutant("tensormap-window-one-block-narrower", "pto_gpu/core/tensormap.py",
           "return max(0, (row[R_LO] >> shift) - NARROW_BLOCKS), last",
           "return max(0, (row[R_LO] >> shift) - NARROW_BLOCKS + 1), last",
           ("tests/test_tensormap_blocks.py",)),
    Mutant("tensormap-last-block-one-short", "pto_gpu/core/tensormap.py",
           "last = (max(row[R_HI], row[R_LO] + 1) - 1) >> shift",
           "last = (max(row[R_HI], row[R_LO] + 1) - 2) >> shift",
           ("tests/test_tensormap_blocks.py",)),
    Mutant("submit-write-after-read-lost", "pto_gpu/core/submit.py",
           "for kind in range(WRITER, READER + 1 if writes else READER):",
           "for kind in range(WRITER, READER):",
           ("tests/test_dependencies.py",)),
    Mutant("complete-ready-one-producer-early", "pto_gpu/core/complete.py",
           "if consumer.fanin == 0 and consumer.state == PENDING:",
           "if consumer.fanin <= 1 and consumer.state == PENDING:",
           ("tests/test_core.py", "tests/test_dependencies.py")),
    Mutant("complete-last-buffer-kept", "pto_gpu/core/complete.py",
           "    for i in range(task.nbuf):\n        buffer_release",
           "    for i in range(task.nbuf - 1):\n        buffer_release",
           ("tests/test_rings.py",)),
    Mutant("heap-alloc-over-live-buffers", "pto_gpu/core/rings.py",
           "if head + size - tail > capacity:",
           "if head - tail > capacity:",
           ("tests/test_rings.py",)),
    Mutant("overlap-lattice-start-column", "pto_gpu/overlap.py",
           "if m < a[R_RUN] and max(q, 0)",
           "if m <= a[R_RUN] and max(q, 0)",
           ("tests/test_overlap_lattices.py",)),
    Mutant("overlap-lattice-spill", "pto_gpu/overlap.py",
           "return m + b[R_RUN] > stride and",
           "return m + b[R_RUN] >= stride and",
           ("tests/test_overlap_lattices.py",)),
    Mutant("overlap-touching-ranges", "pto_gpu/overlap.py",
           "if a[R_LO] >= b[R_HI] or b[R_LO] >= a[R_HI]",
           "if a[R_LO] > b[R_HI] or b[R_LO] >= a[R_HI]",
           ("tests/test_overlap.py", "tests/test_overlap_lattices.py")),
    Mutant("dataflow-roots-one-level", "pto_gpu/isa/dataflow.py",
           "while root in sources and root not in seen:",
           "if root in sources and root not in seen:",
           ("tests/test_isa_directions.py",)),
    Mutant("cpu-codegen-col-reduce-skips-a-row", "pto_gpu/isa/cpu_codegen.py",
           'self.emit(f"for _r in range({rows}):")\n        self.emit(f"    for _c in range({cols}):")\n'
           '        self.emit(f"        {acc}[_c]',
           'self.emit(f"for _r in range(1, {rows}):")\n        self.emit(f"    for _c in range({cols}):")\n'
           '        self.emit(f"        {acc}[_c]',
           ("tests/test_isa_cpu.py",)),
    Mutant("cuda-codegen-row-reduce-half-the-lanes", "pto_gpu/isa/cuda_codegen.py",
           "for (int o = 16; o > 0; o /= 2) {",
           "for (int o = 16; o > 1; o /= 2) {",
           ("tests/test_isa_cuda.py",)),
    Mutant("driver-streams-no-cross-stream-wait", "pto_gpu/executors/driver_streams.py",
           "if other != stream and producer >= 0 and _in_flight(t, producer):",
           "if other == stream and producer >= 0 and _in_flight(t, producer):",
           ("tests/test_driver_streams.py",)),
    Mutant("driver-streams-stride-padding", "pto_gpu/executors/driver_streams.py",
           "t.words[w + 4 + k] = 0 if k < pad else",
           "t.words[w + 4 + k] = 1 if k < pad else",
           ("tests/test_driver_streams.py",)),
    Mutant("cpu-streams-no-cross-stream-wait", "pto_gpu/executors/streams.py",
           "if issued is not None and issued.stream != index:",
           "if issued is not None and issued.stream == index:",
           ("tests/test_backends.py",)),
    Mutant("native-runs-counted-twice", "pto_gpu/executors/native.py",
           "stats[kernel, 0] += 1",
           "stats[kernel, 0] += 2",
           ("tests/test_native.py",)),
    # A task whose written param shares memory with another (pto_gpu/sharing.py, isa/in_place.py)
    Mutant("in-place-work-between-stores-allowed", "pto_gpu/isa/in_place.py",
           "if stored and form is not Form.STORE:",
           "if stored and form is Form.LOAD:",
           ("tests/test_sharing.py",)),
    Mutant("compiled-sharing-never-asks", "pto_gpu/jit/api.py",
           "if rule == _SHARING_UNJUDGED:",
           "if rule == -1:",
           ("tests/test_sharing.py",)),
    Mutant("sharing-same-view-ignores-order", "pto_gpu/sharing.py",
           "and all(n == 1 or s == t for n, s, t in zip(a.shape, a.strides, b.strides)))",
           ")",
           ("tests/test_sharing.py",)),
    Mutant("compiled-sharing-same-view-ignores-order", "pto_gpu/jit/api.py",
           "if a[D_SHAPE + d] != 1 and a[D_STRIDE + d] != b[D_STRIDE + d]:",
           "if False:",
           ("tests/test_sharing.py",)),
]


def copy_of_repository(folder: Path) -> None:
    """The tracked files as they are in the working tree (uncommitted changes included)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)


def run(mutant: Mutant | None, killers: tuple[str, ...]) -> tuple[str, float]:
    """The test among `killers` that failed with the mutant in place (None: none, the control
    run), "" where none did; and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name if mutant else 'none'}-") as folder:
        copy = Path(folder)
        copy_of_repository(copy)
        if mutant is not None:
            source = copy / mutant.path
            text = source.read_text()
            if text.count(mutant.before) != 1:
                raise SystemExit(f"{mutant.name}: its line is not once in {mutant.path}: update the list")
            source.write_text(text.replace(mutant.before, mutant.after))
        # The copy's packages first (the venv's editable install points at the tree), and every
        # cache (numba's, the generated code's) in the copy: code compiled with the mutant
        # inlined must never be found by a later run.
        env = {**os.environ, "PYTHONPATH": str(copy), "PTO_GPU_CACHE": str(copy / ".pto-cache"),
               "NUMBA_CACHE_DIR": str(copy / ".numba-cache")}
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                   *killers], cwd=copy, env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"(timed out after {TIMEOUT} s)", time.perf_counter() - started
        seconds = time.perf_counter() - started
        if done.returncode == 0:
            return "", seconds
        failed = re.search(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M)
        return failed.group(1) if failed else f"(pytest exited {done.returncode})", seconds


def main(names: list[str]) -> int:
    chosen = [m for m in MUTANTS if not names or m.name in names]
    unknown = set(names) - {m.name for m in chosen}
    if unknown:
        raise SystemExit(f"no mutants named {sorted(unknown)}; there are: {[m.name for m in MUTANTS]}")
    # The control: the killers pass on an unchanged copy, so a failure below is the mutant's.
    killers = tuple(dict.fromkeys(k for m in chosen for k in m.killers))
    failed, seconds = run(None, killers)
    if failed:
        raise SystemExit(f"the killers fail on an unchanged copy ({failed}): no mutant can be judged")
    print(f"control: the killers pass on an unchanged copy ({seconds:.0f} s)\n")
    print("| mutant | file | killed by | seconds |\n|---|---|---|---|", flush=True)
    survivors = []
    for mutant in chosen:
        killer, seconds = run(mutant, mutant.killers)
        print(f"| {mutant.name} | {mutant.path} | {killer or '**survived**'} | {seconds:.0f} |", flush=True)
        if not killer:
            survivors.append(mutant.name)
    if survivors:
        print(f"\n{len(survivors)} of {len(chosen)} survived: {', '.join(survivors)}")
        return 1
    print(f"\nall {len(chosen)} killed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
