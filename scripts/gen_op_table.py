"""Write docs/ops.md, the op table, from the op registry (pypto/ir/ops.py) and the instruction
table (pypto/target/isa.py).  tests/test_registry.py fails when the file is stale."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from pypto.frontend.op_table import op_table_markdown  # noqa: E402

if __name__ == "__main__":
    path = os.path.join(HERE, "..", "docs", "ops.md")
    with open(path, "w") as f:
        f.write(op_table_markdown())
    print(f"wrote {os.path.relpath(path)}")
