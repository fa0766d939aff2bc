"""The target description: the simulated machines, the PTO instruction table and the cost model.

The bottom layer with `ir/` (which reads the instruction table): it imports neither the compiler,
the simulator nor the IR, so both the compiler and the simulator can read it."""
