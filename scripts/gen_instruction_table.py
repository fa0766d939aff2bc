#!/usr/bin/env python3
"""Write docs/instructions.md: every PTO instruction the compiler emits, its pipe and its cost.

The table is computed from the simulator's own cost model (pypto.sim.cost.instruction_table),
so it cannot drift from what the timing simulation charges.  `--check` exits 1 when the file
on disk is out of date (tests/test_cost.py does the same comparison).

    python scripts/gen_instruction_table.py            # regenerate
    python scripts/gen_instruction_table.py --check    # verify only
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "instructions.md")


def render() -> str:
    sys.path.insert(0, ROOT)
    from pypto.sim.cost import instruction_table_markdown
    return instruction_table_markdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that the file is up to date")
    ap.add_argument("--out", default=OUT, help="output path (default: docs/instructions.md)")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            print(f"{args.out} is out of date: run python scripts/gen_instruction_table.py", file=sys.stderr)
            return 1
        return 0
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
