"""A differential fuzzer of pypto: random op DAGs written as real @pypto.jit kernels.

- `gen`: a case (kernel source text + its inputs) from a stream of choices (`Chooser`): plain
  `random` for long campaigns, hypothesis' `data.draw` so that failures shrink to small kernels;
- `reference`: the fuzzer's own numpy evaluation of a case, float64 values with a propagated
  bound of each step's rounding (never imports pypto's evaluator or compiler);
- `worker`: runs one kernel in a child process (compile, simulate twice, checked mode, call form;
  in a second request, the dynamic stage: compiled with pypto.DYNAMIC first dims, run at a few
  sizes);
- `runner`: sends cases to the worker with a timeout, compares, classifies the outcome (the
  dynamic stage on one case in `Runner.dynamic_every`: `Outcome.dynamic`).
"""
