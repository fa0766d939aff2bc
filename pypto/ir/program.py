"""Level 5, the PTO program: PTO virtual instructions per task (MPMD: each core its own stream)."""
from __future__ import annotations

from dataclasses import dataclass

from .core import fmt_shape
from .exec import ExecTask, item_lines
from .gm import GMBuffer


@dataclass(frozen=True)
class Program:
    name: str
    buffers: tuple[GMBuffer, ...]
    tasks: tuple[ExecTask, ...]

    level = "pto"

    def __len__(self):
        """How many instructions the program runs (loops' iterations counted)."""
        return sum(t.n_instrs for t in self.tasks)


    def buffer(self, name: str) -> GMBuffer:
        return next(b for b in self.buffers if b.name == name)

    def text(self, max_tasks: int | None = None) -> str:
        lines = [f"// PTO program {self.name}: {len(self.tasks)} tasks, {len(self)} instructions"]
        for b in self.buffers:
            lines.append(f".gm {b.name} {b.dtype}{fmt_shape(b.shape)} {b.role}")
        shown = self.tasks if max_tasks is None else self.tasks[:max_tasks]
        for t in shown:
            lines.append(f".task {t.id} {t.core_type} group={t.group} deps={list(t.deps)}"
                         + (f" core={t.core}" if t.core is not None else "")
                         + (f" pair={t.pair[0]}:{t.pair[1]}" if t.pair else ""))
            lines.extend(item_lines(t.code))
        if len(shown) < len(self.tasks):
            lines.append(f"// ... {len(self.tasks) - len(shown)} more tasks (program.text() shows all)")
        return "\n".join(lines)

    def __str__(self):
        return self.text()

    @classmethod
    def parse(cls, text: str, machine=None) -> "Program":
        """The program printed by `text()` (print -> parse -> print is the identity); hand-edited
        programs too.  Errors (`pypto.ir.pto_text.PTOSyntaxError`) name the line, the task, the
        instruction index and the kernel line.  With a machine, tiles are checked against its
        buffer capacities."""
        from .pto_text import parse_program
        return parse_program(text, machine)

    def verify(self, machine=None) -> None:
        """Check every instruction (operand spaces, pipes, 32-byte alignment and, with a machine,
        capacities); raises PTOSyntaxError naming the task and instruction."""
        from .pto_text import verify_program
        verify_program(self, machine)

    def _repr_pretty_(self, p, cycle):
        p.text(self.text(max_tasks=4))
