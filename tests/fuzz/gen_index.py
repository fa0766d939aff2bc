"""Generator steps for the registry's index ops (mixed into gen.Generator): to come."""
from __future__ import annotations


class IndexSteps:
    """Mixin: see gen_ops.OpSteps for what it needs of the generator."""

    def s_index(self, x):
        return self.s_un2(x)
