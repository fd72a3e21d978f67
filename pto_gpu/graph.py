"""The logical graph of a recorded run, and its renderings (spec 003 §5).

`dump` writes the spec's text dump (SUMMARY, TASK TABLE, DEPENDENCY GRAPH); `to_dot` gives
Graphviz DOT with one column per dependency level; `render` runs Graphviz's `dot` on it.
The graph is recorded after the run, so every task is COMPLETED and no queue is shown;
`fanin` counts a task's producers and `buf` the bytes of its tensor params.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import PTOError
from .params import ParamKind
from .tasks import Task

RULE = "=" * 80


@dataclasses.dataclass
class Graph:
    """The logical graph of a recorded run: identical for every executor."""

    tasks: list[Task]
    edges: list[tuple[int, int]]

    def producers(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {t.id: [] for t in self.tasks}
        for producer, consumer in self.edges:
            found[consumer].append(producer)
        return found

    def consumers(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {t.id: [] for t in self.tasks}
        for producer, consumer in self.edges:
            found[producer].append(consumer)
        return found

    def levels(self) -> dict[int, int]:
        """Each task's dependency level: 0 without producers, else 1 + its deepest producer's."""
        producers = self.producers()
        level: dict[int, int] = {}
        for task in sorted(self.tasks, key=lambda t: t.id):  # producers always have smaller ids
            level[task.id] = 1 + max((level[p] for p in producers[task.id]), default=-1)
        return level

    def dump(self, path: str | Path | None = None) -> None:
        """Write the text dump to `path`, or to stdout when no path is given."""
        producers, consumers = self.producers(), self.consumers()
        width = max((len(t.kernel.name) for t in self.tasks), default=0)
        lines = [RULE, "PTO RUNTIME DUMP", RULE, "", "SUMMARY",
                 f"  Total tasks scheduled:  {len(self.tasks)}",
                 f"  Dependencies:           {len(self.edges)}", "", "TASK TABLE"]
        for t in self.tasks:
            fanout = ",".join(map(str, consumers[t.id]))
            lines.append(f"  Task {t.id}: {t.kernel.name:<{width}} [COMPLETED] fanin={len(producers[t.id])} "
                         f"buf={_kilobytes(t)} fanout=[{fanout}]")
        lines += ["", "DEPENDENCY GRAPH"] + [f"  Task {p} -> Task {c}" for p, c in self.edges]
        text = "\n".join(lines) + "\n"
        if path is None:
            sys.stdout.write(text)
        else:
            Path(path).write_text(text)

    def to_dot(self) -> str:
        """Graphviz DOT: left to right, one rank per dependency level, one edge per dependency."""
        lines = ["digraph pto {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
        for t in self.tasks:
            lines.append(f'  t{t.id} [label="{t.id}: {t.kernel.name}\\n{_kilobytes(t)}"];')
        by_level: dict[int, list[int]] = {}
        for task_id, level in self.levels().items():
            by_level.setdefault(level, []).append(task_id)
        for level in sorted(by_level):
            lines.append("  { rank=same; " + " ".join(f"t{i};" for i in by_level[level]) + " }")
        lines += [f"  t{p} -> t{c};" for p, c in self.edges]
        return "\n".join(lines + ["}"]) + "\n"

    def render(self, path: str | Path) -> None:
        """Draw the graph to an .svg or .pdf file with Graphviz's `dot`."""
        fmt = Path(path).suffix.lstrip(".")
        if fmt not in ("svg", "pdf"):
            raise PTOError(f"render({str(path)!r}): the file must end in .svg or .pdf")
        dot = shutil.which("dot")
        if dot is None:
            raise PTOError("render needs Graphviz's `dot` program: install it (apt install graphviz, "
                           "brew install graphviz) or write to_dot() to a file and draw it elsewhere")
        subprocess.run([dot, f"-T{fmt}", "-o", str(path)], input=self.to_dot(), text=True, check=True)


def _kilobytes(task: Task) -> str:
    nbytes = sum(p.value.nbytes for p in task.params if p.kind != ParamKind.SCALAR)
    return f"{nbytes / 1024:.1f}KB"
