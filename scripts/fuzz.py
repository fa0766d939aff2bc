"""Long differential fuzzing campaign of pypto (`make fuzz SEEDS=... BUDGET=...`).

Each seed is one hypothesis run of --examples random kernels (tests/fuzz); the first failure of
a kind not seen before is shrunk to a minimal kernel and written to artifacts/fuzz/ as a
runnable reproducer.  Ends with one summary line of counts.  The dynamic stage (tests/fuzz/runner.py:
the kernel compiled again with pypto.DYNAMIC first dims, run at a few sizes) runs on one case in
--dynamic-every (by data seed; 1: every case, 0: none).

    python scripts/fuzz.py [--seeds N] [--budget SECONDS] [--seed BASE] [--examples K] [--max-ops M]
                           [--dynamic-every K]
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.fuzz.runner import CATEGORIES, DYNAMIC_EVERY, Runner, report, search  # noqa: E402

DYNAMIC_OUTCOMES = ("refused", "correct", "wrong", "crash", "hang", "unlocated")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=0, help="number of seeds (hypothesis runs); 0: until the budget")
    ap.add_argument("--budget", type=float, default=1800.0, help="seconds")
    ap.add_argument("--seed", type=int, default=None, help="first seed (default: a fresh random one)")
    ap.add_argument("--examples", type=int, default=20, help="kernels per seed")
    ap.add_argument("--max-ops", type=int, default=7)
    ap.add_argument("--shrink-seconds", type=float, default=240.0, help="time to shrink one failure")
    ap.add_argument("--dynamic-every", type=int, default=DYNAMIC_EVERY,
                    help="run the dynamic stage on one case in K (by data seed); 1: every case, 0: none")
    ap.add_argument("--out", default=os.path.join(ROOT, "artifacts", "fuzz"))
    args = ap.parse_args(argv)
    base = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    os.makedirs(args.out, exist_ok=True)
    print(f"pypto fuzz: first seed {base}, {args.seeds or 'unlimited'} seeds, budget {args.budget:.0f} s, "
          f"{args.examples} kernels per seed, dynamic stage on "
          f"{'no case' if args.dynamic_every <= 0 else f'1 case in {args.dynamic_every}'}; "
          f"failures -> {os.path.relpath(args.out, ROOT)}/", flush=True)
    runner = Runner(dynamic_every=max(args.dynamic_every, 0))
    counts = collections.Counter()
    classes = collections.Counter()      # signature -> count
    known = collections.Counter()
    clear = collections.Counter()        # message head of the clear errors
    refused = collections.Counter()      # message head of the dynamic stage's refusals
    examples_of: dict = {}
    shrunk: set = set()
    t0 = time.monotonic()

    seen: set = set()

    def on_case(case, o):
        key = case.source() + case.describe()
        if key in seen:             # hypothesis replays its simplest kernels in every run
            return
        seen.add(key)
        counts["run"] += 1
        counts[o.category] += 1
        if o.builtin:
            counts[o.builtin] += 1
        if o.failed or o.builtin:
            sig = o.signature if o.failed else f"{o.builtin}|{o.known}"
            classes[sig] += 1
            examples_of.setdefault(sig, (case, o))
            if o.known:
                known[o.known] += 1
        if o.category == "clear":
            clear[o.signature.split("|")[-1][:100]] += 1
        if o.dynamic:
            counts["dynamic"] += 1
            counts["dynamic: " + o.dynamic] += 1
        if o.dynamic == "refused":
            refused[_head(o.extra["dynamic"]["refusal"])] += 1
        if counts["run"] % 25 == 0:
            el = time.monotonic() - t0
            print(f"  [{el:6.0f} s] {counts['run']} kernels: " +
                  ", ".join(f"{k} {counts[k]}" for k in CATEGORIES + ("false alarm", "missed") if counts[k]) +
                  (f"; dynamic {counts['dynamic']}: " + ", ".join(
                      f"{k} {counts['dynamic: ' + k]}" for k in DYNAMIC_OUTCOMES if counts["dynamic: " + k])
                   if counts["dynamic"] else ""), flush=True)

    k = 0
    try:
        while (not args.seeds or k < args.seeds) and time.monotonic() - t0 < args.budget:
            seed = base + k
            k += 1
            left = args.budget - (time.monotonic() - t0)
            found = search(runner, seed, args.examples, args.max_ops, skip=frozenset(shrunk), on_case=on_case,
                           shrink_seconds=min(args.shrink_seconds, max(left, 10)),
                           log=lambda t: print(t, flush=True), deadline=t0 + args.budget)
            if found is None:
                continue
            case, o = found
            shrunk.add(o.signature)
            name = f"{o.category}_{hashlib.sha1(o.signature.encode()).hexdigest()[:8]}.py"
            path = os.path.join(args.out, name)
            text = report(case, o)
            with open(path, "w") as f:
                f.write(text)
            print(f"\n=== seed {seed}: {o.line()[:300]}\n--- minimal kernel ({os.path.relpath(path, ROOT)}):\n"
                  f"{case.source()}--- inputs: {case.describe()}\n", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        runner.close()
    el = time.monotonic() - t0
    # failures seen but never shrunk (later kinds): write their first example as found
    for sig, (case, o) in examples_of.items():
        if sig not in shrunk and (o.failed or o.builtin):
            name = f"{o.category}_{hashlib.sha1(sig.encode()).hexdigest()[:8]}_unshrunk.py"
            with open(os.path.join(args.out, name), "w") as f:
                f.write(report(case, o))
    if classes:
        print("\nfailure kinds (count, signature, known class):")
        for sig, n in classes.most_common():
            o = examples_of[sig][1]
            print(f"  {n:5d}  {sig[:150]}" + (f"   [known: {o.known}]" if o.known else ""))
    if clear:
        print("most frequent clear errors:")
        for head, n in clear.most_common(12):
            print(f"  {n:5d}  {head}")
    if refused:
        print("most frequent refusals of the dynamic stage:")
        for head, n in refused.most_common(12):
            print(f"  {n:5d}  {head}")
    if known:
        print("known bug classes: " + "; ".join(f"{k}: {v}" for k, v in known.most_common()))
    print(f"\nfuzz summary: seeds {base}..{base + k - 1}, {el:.0f} s: kernels run {counts['run']}, "
          f"correct {counts['correct']}, clear errors {counts['clear']}, wrong results {counts['wrong']}, "
          f"crashes {counts['crash']}, hangs {counts['hang']}, unlocated errors {counts['unlocated']}, "
          f"nondeterministic {counts['nondet']}, false alarms {counts['false alarm']}, missed {counts['missed']}; "
          f"dynamic stage {counts['dynamic']}: "
          + ", ".join(f"{k} {counts['dynamic: ' + k]}" for k in DYNAMIC_OUTCOMES), flush=True)
    return 1 if any(counts[c] for c in ("wrong", "crash", "hang", "unlocated", "nondet")) else 0


def _head(msg: str) -> str:
    """A message's first line without the kernel file and line, numbers as N (to count alike ones)."""
    import re
    head = re.sub(r"^\S*fuzzk_\w+\.py:\d+: ", "", msg.splitlines()[0] if msg else "")
    return re.sub(r"\d+", "N", head)[:100]


if __name__ == "__main__":
    sys.exit(main())
