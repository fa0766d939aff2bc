"""Level 5, the PTO program: PTO virtual instructions per task (MPMD: each core its own stream)."""
from __future__ import annotations

from dataclasses import dataclass

from .core import fmt_shape
from .exec import ExecTask
from .gm import GMBuffer


@dataclass(frozen=True)
class Program:
    name: str
    buffers: tuple[GMBuffer, ...]
    tasks: tuple[ExecTask, ...]

    level = "pto"

    def __len__(self):
        return sum(len(t.instrs) for t in self.tasks)

    @property
    def n_instructions(self) -> int:
        return len(self)

    def buffer(self, name: str) -> GMBuffer:
        return next(b for b in self.buffers if b.name == name)

    def text(self, max_tasks: int | None = None) -> str:
        lines = [f"// PTO program {self.name}: {len(self.tasks)} tasks, {len(self)} instructions"]
        for b in self.buffers:
            lines.append(f".gm {b.name} {b.dtype}{fmt_shape(b.shape)} {b.role}")
        shown = self.tasks if max_tasks is None else self.tasks[:max_tasks]
        for t in shown:
            lines.append(f".task {t.id} {t.core_type} group={t.group} deps={list(t.deps)}")
            lines.extend("  " + i.text() for i in t.instrs)
        if len(shown) < len(self.tasks):
            lines.append(f"// ... {len(self.tasks) - len(shown)} more tasks (program.text() shows all)")
        return "\n".join(lines)

    def __str__(self):
        return self.text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.text(max_tasks=4))
