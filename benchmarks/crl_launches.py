"""How many kernels one CRL update launches: a count over XLA's optimised HLO of the compiled update.

    python benchmarks/crl_launches.py [--depths 16,64] [--width 256] [--batch-size 256] [--unrolled 16]

Why: on the H200 one CRL update at the operating point (depth 64, width 256, batch 256) ran at 0.3% MFU
(benchmarks/results/gpu/2026-12-04-h200): the step is launch-bound, so what matters is how many
kernels (and while-loop iterations, each a host round trip for its condition unless XLA's command
buffers capture the loop) one update issues, not FLOPs. This counts them on the CPU build of the same
program: every HLO instruction that is not a bookkeeping op (parameter, constant, tuple,
get-tuple-element, bitcast...) is one kernel; a fusion is one; a `while` contributes trip count ×
(its body + its condition), recursively; trip counts are XLA's `known_trip_count`. The GPU backend
fuses differently (dots become cuBLAS custom-calls, elementwise work fuses around them), so the
absolute count is an estimate of the GPU's; the per-block growth and the loop structure carry over.

Printed per depth: while loops (trip count, kernels per iteration), kernels per residual block
(the forward and backward scan bodies), kernels per update in all, and the compile time.
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
BOOKKEEPING = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
               "partition-id", "replica-id", "opt-barrier", "add-dependency"}
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_OPNAME = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_BODY = re.compile(r"body=%?([\w.\-]+)")
_COND = re.compile(r"condition=%?([\w.\-]+)")
_CALLS = re.compile(r"to_apply=%?([\w.\-]+)")


def computations(hlo: str) -> tuple[dict[str, list[str]], str]:
    """{computation name: its instruction lines}, and the entry computation's name."""
    comps, entry, name = {}, None, None
    for line in hlo.splitlines():
        if name is None:
            m = _COMP.match(line)
            if m and "=" not in line.split("(")[0]:
                name = m.group(2)
                comps[name] = []
                if m.group(1):
                    entry = name
            continue
        if line.strip() == "}":
            name = None
        elif line.strip():
            comps[name].append(line)
    return comps, entry


def op_of(line: str) -> str | None:
    """The opcode of an HLO instruction line (`%x = <shape> <opcode>(...)`), or None."""
    eq = line.find(" = ")
    if eq < 0:
        return None
    rest = line[eq + 3:].lstrip()
    if rest.startswith("("):            # a tuple shape: skip to its matching parenthesis
        level = 0
        for i, ch in enumerate(rest):
            level += (ch == "(") - (ch == ")")
            if level == 0:
                rest = rest[i + 1:]
                break
    else:                               # f32[256,256]{1,0}: one token
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    m = _OPNAME.match(rest)
    return m.group(1) if m else None


def kernels(comps: dict, name: str, loops: list | None = None, depth: int = 0) -> int:
    """Kernels one execution of computation `name` launches; appends (depth, trips, per-iteration
    kernels, body name) for every while loop it meets to `loops`."""
    total = 0
    for line in comps.get(name, ()):
        op = op_of(line)
        if op is None or op in BOOKKEEPING:
            continue
        if op == "while":
            trips = int(_TRIP.search(line).group(1)) if _TRIP.search(line) else 1
            body, cond = _BODY.search(line).group(1), _COND.search(line).group(1)
            per = kernels(comps, body, loops, depth + 1) + kernels(comps, cond, None, depth + 1)
            if loops is not None:
                loops.append((depth, trips, per, body))
            total += trips * per
        elif op == "call" and _CALLS.search(line):
            total += kernels(comps, _CALLS.search(line).group(1), loops, depth)
        else:
            total += 1
    return total


def report(compiled, blocks: int) -> dict:
    comps, entry = computations(compiled.as_text())
    loops: list = []
    total = kernels(comps, entry, loops)
    per_block = sorted(per for d, trips, per, _ in loops if trips == blocks)
    return {"total": total, "loops": loops, "block_loops": per_block,
            "top_level": sum(1 for ln in comps[entry] if (op := op_of(ln)) and op not in BOOKKEEPING
                             and op != "while")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="16,64")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--env", default="point_maze/u_maze")
    p.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--remat", action="store_true")
    p.add_argument("--unrolled", default="16", help="depths of the paper-style unrolled reference ('' for none)")
    a = p.parse_args(argv)
    spec = importlib.util.spec_from_file_location("crl_throughput", ROOT / "benchmarks" / "crl_throughput.py")
    ct = importlib.util.module_from_spec(spec)
    sys.modules["crl_throughput"] = ct   # flax dataclasses look their module up
    spec.loader.exec_module(ct)
    from scaling_rl.agents import crl

    rows = []
    for impl, depths in (("scanned", a.depths), ("unrolled", a.unrolled)):
        for depth in [int(d) for d in depths.split(",") if d.strip()]:
            cfg = ct.config(a, depth)
            agent = crl.make(cfg, **ct.IMPLS["ours" if impl == "scanned" else "unrolled"])
            t0 = time.perf_counter()
            compiled, _ = ct.compile_update(agent, cfg)
            secs = time.perf_counter() - t0
            r = report(compiled, depth // 4)
            rows.append((impl, depth, r, secs))
            print(f"{impl} depth {depth}: {r['total']:,} kernels per update, {len(r['loops'])} while loops, "
                  f"{r['top_level']} top-level kernels, compile {secs:.1f} s", flush=True)
            for d, trips, per, body in r["loops"]:
                print(f"  {'  ' * d}while x{trips}: {per} kernels per iteration ({body})", flush=True)
    print(f"\nCRL update, backend {jax.default_backend()}, width {a.width}, batch {a.batch_size}, {a.compute_dtype}, "
          f"remat={a.remat}; a block = 4 x (Dense, LayerNorm, swish) + skip")
    print(f"{'impl':>9} {'depth':>6} {'kernels/update':>15} {'while loops':>12} {'block loops':>12} "
          f"{'kernels per block (fwd/bwd loop bodies)':>42}")
    for impl, depth, r, _ in rows:
        bl = r["block_loops"]
        per = ", ".join(map(str, bl)) if bl else "-"
        print(f"{impl:>9} {depth:>6} {r['total']:>15,} {len(r['loops']):>12} {len(bl):>12} {per:>42}")
    scanned = {d: r["total"] for i, d, r, _ in rows if i == "scanned"}
    if len(scanned) > 1:
        (d0, k0), (d1, k1) = sorted(scanned.items())[0], sorted(scanned.items())[-1]
        print(f"kernels_per_extra_block={(k1 - k0) / ((d1 - d0) / 4):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
