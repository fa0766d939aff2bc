"""The fuzzer's reference for the index ops of gen_index.py (see reference.py)."""
from __future__ import annotations


def evaluate_index(case, n, ins, vals):
    """The value of node `n` of an index op, else None."""
    return None
