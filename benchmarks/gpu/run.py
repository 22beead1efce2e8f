"""The one GPU run: what a lent CUDA machine should answer, each section in its own process and budget.

  a  backbone forward+backward throughput, bf16: width 2048 (batch 4096) and CRL's operating point
     (width 256/512/1024 x batch 256/1024, depth 64); MFU = matmul FLOPs / (time x 989e12, the H200's
     dense BF16 peak), and the same against a measured 8192^3 bf16 jnp.dot (the reachable ceiling).
     Only matmul FLOPs count (nets.backbone_flops_breakdown: forward, dW of every Dense, dX of every
     Dense but the input one), so elementwise work never flatters it.
  b  one CRL update (width 256, batch 256, bf16) scanned vs unrolled at depth 16 (the unrolled side
     only where it compiles inside its limit; depth 64 did not fit), then scanned alone at the operating
     point, depth 64, without and with XLA command buffers for while loops
     (benchmarks/crl_throughput.py: step-time ratio, XLA's peak bytes).
  c  launch -> first trained chunk at depth 64 on the goal task point_maze/big_maze (512 envs, batch
     512, width 256, utd 1/40, 25,600 env steps a chunk): seconds from this section's process start.
  d  packed trials: 1, 8, 32, 128 CRL trials (own seed and lr each; depth 64, width 256, batch 256)
     as one vmapped chunk program vs one by one (k calls of the 1-trial program): trials/hour ratio,
     compile excluded and printed beside; each row printed as it is measured (goal >= 20x at 128).
  e  CRL depth 4 vs 16 vs 64 on point_maze/big_maze at the paper's width/batch (256/512), 4 seeds
     vmapped, the same env steps for every depth: depth 64 runs first for its time share and sets the
     env-step budget; final deterministic eval, mean ± 95% t-interval over seeds, random policy beside.
     (The paper's largest effect, humanoid, needs brax + mujoco, not on the machine's image.)
  f  GRPO with torch and JAX on the same GPU (bf16 autocast; the objective runs in JAX on the GPU via
     DLPack), one step of each rollout mode: sync, async, pipeline, tba.
  g  a user's pretrained directory on the GPU: a model of Qwen2.5-0.5B's exact architecture (24 layers,
     width 896, 14/2 heads, vocabulary 151,936, tied head; random weights, no hub here) saved with
     save_pretrained and trained with `scaling-rl grpo init_from=DIR device=cuda` for 2 steps per rollout
     mode (sync, async, pipeline): no crash, no CPU fallback, seconds per step and peak GPU memory of
     torch and of JAX.

Writes under --out: results.md (every table, appended as each section ends), results.json (per-section
status, seconds, lines), and run.sh adds log.txt. A section that runs over its budget is killed and
marked; the others still run. Without a GPU it stops at once with one line (exit 2) unless --dry, which
runs every section with tiny sizes on whatever backend JAX has (CI: scripts/gpu_emulate.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEAK = 989e12                       # H200 SXM dense BF16 FLOP/s (spec sheet)
SECTIONS = "abcdefg"
BUDGET_S = {"a": 50, "b": 105, "c": 60, "d": 60, "e": 130, "f": 75, "g": 90}    # 570 s in all
DRY_BUDGET_S = {**{k: 120 for k in SECTIONS}, "b": 320, "d": 300, "e": 300, "f": 200, "g": 200}   # loaded 2-core box
TITLES = {"a": "backbone fwd+bwd throughput, bf16 (MFU)",
          "b": "CRL update: scanned vs unrolled, bf16",
          "c": "launch -> first trained chunk, depth 64",
          "d": "packed trials: k trials in one program vs one by one",
          "e": "CRL depth 4 vs 16 vs 64 at equal env steps",
          "f": "GRPO, torch + JAX on one GPU, one step per rollout mode",
          "g": "GRPO from a Qwen2.5-0.5B-architecture init_from directory on the GPU"}


def emit(line: str = "") -> None:
    print(line, flush=True)


def timed(fn, *args):
    import jax
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, out


# --- sections (each runs in its own process: `run.py --section X`) --------------------------------
def section_a(dry: bool) -> None:
    import jax
    import jax.numpy as jnp

    from scaling_rl import nets

    n = 256 if dry else 8192
    x = jnp.ones((n, n), jnp.bfloat16)
    dot = jax.jit(lambda a, b: a @ b)
    timed(dot, x, x)
    reps = 2 if dry else 10
    secs = min(timed(dot, x, x)[0] for _ in range(reps))
    ceiling = 2 * n ** 3 / secs
    emit(f"jnp.dot {n}^3 bf16: {ceiling / 1e12:.1f} TFLOP/s = {ceiling / PEAK:.1%} of the 989 TFLOP/s spec "
         f"(best of {reps})")
    emit("| depth | width | batch | compile s | step ms | matmul TFLOP/s | MFU vs 989 | vs jnp.dot |")
    emit("|---:|---:|---:|---:|---:|---:|---:|---:|")
    in_dim = 64
    points = ([(4, 16, 16)] if dry else
              [(16, 2048, 4096)] + [(64, w, b) for w in (256, 512, 1024) for b in (256, 1024)])
    for depth, width, batch in points:
        cfg = nets.BackboneConfig(kind="crl", width=width, depth=depth, compute_dtype="bfloat16")
        net = nets.Backbone(cfg)
        xb = jax.random.normal(jax.random.PRNGKey(0), (batch, in_dim))
        params = net.init(jax.random.PRNGKey(1), xb)
        fwd_bwd = jax.jit(jax.grad(lambda p, x: jnp.mean(jnp.square(net.apply(p, x)))))
        compile_s, _ = timed(fwd_bwd, params, xb)
        reps = 3 if dry else 20
        t0 = time.perf_counter()
        for _ in range(reps):
            g = fwd_bwd(params, xb)
        jax.block_until_ready(g)
        secs = (time.perf_counter() - t0) / reps
        matmul = nets.backbone_flops_breakdown(cfg, in_dim)["matmul"]       # forward, per sample
        flops = (3 * matmul - 2 * in_dim * width) * batch                  # + dW all, + dX all but input
        emit(f"| {depth} | {width} | {batch} | {compile_s:.1f} | {secs * 1e3:.3f} | {flops / secs / 1e12:.1f} | "
             f"{flops / secs / PEAK:.1%} | {flops / secs / ceiling:.1%} |")


def _run_child(cmd: list[str], budget: float, env: dict | None = None) -> int:
    """A child process whose lines are passed through as they come; killed at `budget` seconds."""
    import threading

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=None if env is None else {**os.environ, **env})
    th = threading.Thread(target=lambda: [emit(line.rstrip()) for line in proc.stdout], daemon=True)
    th.start()
    try:
        rc = proc.wait(timeout=max(1.0, budget))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        emit(f"stopped after {budget:.0f} s")
        rc = 124
    th.join(timeout=5)
    return rc


WHILE_IN_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"


def section_b(dry: bool) -> None:
    # the unrolled reference compiles in ~0.9 s per depth on the H200 (14.7 s at depth 16, 2026-12-04):
    # depth 64 did not fit the section, so the side-by-side runs at 16 only; then the scanned stack alone
    # at the operating point (64), plainly and with its while loops captured in CUDA graphs (XLA command
    # buffers: one launch per loop instead of ~530 kernels and a host-read condition per block;
    # benchmarks/crl_launches.py counts them). Each child prints its rows as it goes.
    bench = str(ROOT / "benchmarks" / "crl_throughput.py")
    common = [sys.executable, bench, "--compute-dtype", "bfloat16"]
    if dry:
        both = ["--depths", "4", "--width", "8", "--batch-size", "8", "--repeats", "1",
                "--unrolled-compile-limit", "60"]
        alone = ["--depths", "8", "--width", "8", "--batch-size", "8", "--repeats", "1", "--no-unrolled"]
    else:
        both = ["--depths", "16", "--width", "256", "--batch-size", "256", "--repeats", "10",
                "--unrolled-compile-limit", "25"]
        alone = ["--depths", "64", "--width", "256", "--batch-size", "256", "--repeats", "10", "--no-unrolled"]
    emit("-- scanned vs unrolled --")
    rc = _run_child(common + both, 45 if not dry else 150)
    emit("-- scanned alone --")
    # dry: the next child runs these very arguments (with the flag added), so this one would only repeat
    # its compile on the CPU; on the GPU both run (the plain time is the flag's baseline)
    rc2 = 0 if dry else _run_child(common + alone, 30)
    if dry:
        emit("dry: not run (the command-buffer child below runs the same arguments)")
    emit(f"-- scanned alone, XLA_FLAGS {WHILE_IN_COMMAND_BUFFERS} --")
    flags = (os.environ.get("XLA_FLAGS", "") + " " + WHILE_IN_COMMAND_BUFFERS).strip()
    rc3 = _run_child(common + alone, 30 if not dry else 150, env={"XLA_FLAGS": flags})
    if rc or rc2 or rc3:
        raise RuntimeError(f"crl_throughput exited {rc} / {rc2} / {rc3}")


def _crl_config(dry: bool, depth: int, **kw):
    from scaling_rl.agents import crl

    if dry:
        base = dict(env="point_maze/big_maze", num_envs=4, batch_size=8, width=8, utd=1 / 8,
                    chunk_env_steps=4 * 8, learning_starts=8, episode_length=10, eval_episodes=2,
                    buffer_size=4 * 16, repr_dim=4)
    else:
        base = dict(env="point_maze/big_maze", num_envs=512, batch_size=512, width=256, utd=1 / 40,
                    chunk_env_steps=512 * 50, learning_starts=512 * 4, episode_length=200,
                    eval_episodes=64, buffer_size=512 * 1000)
    base.update(kw)
    base.setdefault("env_steps", base["learning_starts"] + 3 * base["chunk_env_steps"])
    return crl.Config(depth=depth, actor_width=base["width"], actor_depth=depth, **base)


def section_c(dry: bool) -> None:
    import jax

    from scaling_rl.agents import crl

    t_launch = float(os.environ.get("GPU_RUN_T0", time.time()))
    depth = 4 if dry else 64
    cfg = _crl_config(dry, depth, compute_dtype="bfloat16")
    agent = crl.make(cfg)
    t0 = time.perf_counter()
    step = jax.jit(agent.chunk, donate_argnums=0).lower(
        jax.eval_shape(agent.init, jax.random.PRNGKey(0))).compile()
    compile_s = time.perf_counter() - t0
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    state, m = step(state)
    jax.block_until_ready(m)
    first = time.time() - t_launch
    secs, (state, m) = timed(step, state)
    chunk = cfg.chunk_env_steps
    emit(f"{cfg.env} depth {depth} width {cfg.width} batch {cfg.batch_size} envs {cfg.num_envs} utd {cfg.utd:g} "
         f"N={agent.param_count:,}")
    emit(f"launch -> first chunk {first:.1f} s (chunk compile {compile_s:.1f} s); second chunk {secs:.2f} s: "
         f"{chunk / secs:,.0f} env-steps/s, {chunk * cfg.utd / secs:,.1f} updates/s, "
         f"loss/critic {float(m['loss/critic']):.3f}")


PACK_SIZES = (1, 8, 32, 128)
DRY_PACK_SIZES = (1, 2)   # one-by-one and one pack: every code path of a larger size


def section_d(dry: bool, budget: float) -> None:
    """Packed trials: k CRL trials (own seed, own lr) as one vmapped chunk program vs k calls of the
    1-trial program; trials/hour ratio = k x t(1) / t(k), compile excluded (printed beside).
    Every row is printed as soon as it is measured; a size that would not fit the device (the agent's
    peak estimate, nets.memory) or the section's time left is skipped with a line that says so."""
    import jax
    import numpy as np

    from scaling_rl.agents import crl
    from scaling_rl.nets import memory

    t_start = time.perf_counter()
    sizes = DRY_PACK_SIZES if dry else PACK_SIZES
    cfg = (_crl_config(True, 4, compute_dtype="bfloat16") if dry else
           _crl_config(False, 64, num_envs=64, batch_size=256, chunk_env_steps=64 * 8, learning_starts=256,
                       utd=1 / 16, buffer_size=64 * 256, eval_episodes=16, compute_dtype="bfloat16"))
    agent = crl.make(cfg)
    per_seed = memory.estimate_peak_bytes(crl, cfg, agent, 1) or 0
    limit, source = memory.memory_budget_bytes()
    emit(f"CRL {cfg.env} depth {cfg.depth} width {cfg.width} batch {cfg.batch_size} envs {cfg.num_envs} "
         f"utd {cfg.utd:g}, {cfg.chunk_env_steps} env steps a chunk; trial i: seed i, lr 3e-4 x 1.1^i; "
         f"per-trial peak estimate {per_seed / 2 ** 20:.0f} MiB of {limit / 2 ** 30:.1f} GiB ({source})")
    emit("| trials | compile s | chunk s | trials x chunks / s | ratio vs one by one |")
    emit("|---:|---:|---:|---:|---:|")
    reps = 1 if dry else 2
    t_one, last_compile = None, 0.0
    for k in sizes:
        if k * per_seed > 0.8 * limit:
            emit(f"| {k} | – | – | – | skipped: needs ~{k * per_seed / 2 ** 30:.1f} GiB |")
            continue
        left = budget - (time.perf_counter() - t_start)
        # what this size needs if packing pays >= 4x: its compile (~ the last one) and reps + 1 chunks
        if t_one is not None and left < last_compile + 3 + (reps + 1) * k * t_one / 4:
            emit(f"| {k} | – | – | – | skipped: {left:.0f} s left |")
            continue
        keys = jax.random.split(jax.random.PRNGKey(0), k)
        lrs = np.asarray([3e-4 * 1.1 ** i for i in range(k)], np.float32)
        init = jax.jit(jax.vmap(lambda key, lr: agent.set_hparams(agent.init(key), {"lr": lr})))
        state = init(keys, lrs)
        t0 = time.perf_counter()
        chunk = jax.jit(jax.vmap(agent.chunk), donate_argnums=0).lower(state).compile()
        compile_s = last_compile = time.perf_counter() - t0
        state, m = chunk(state)                 # warm-up run: first-call allocations
        jax.block_until_ready(m)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            state, m = chunk(state)
            jax.block_until_ready(m)
            best = min(best, time.perf_counter() - t0)
        if k == 1:
            t_one = best
        ratio = k * t_one / best
        emit(f"| {k} | {compile_s:.1f} | {best:.3f} | {k / best:.2f} | {ratio:.2f} |")
        emit(f"packed_ratio_{k}={ratio:.2f}")
        del state, chunk


def section_e(dry: bool, budget: float) -> None:
    import importlib.util

    import jax
    import numpy as np

    from scaling_rl.agents import crl

    spec = importlib.util.spec_from_file_location("crl_depth", ROOT / "experiments" / "crl_depth.py")
    crl_depth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(crl_depth)
    mean_ci = crl_depth.mean_ci
    depths = (8, 4) if dry else (64, 16, 4)
    seeds = 2 if dry else 4
    share = budget * (0.4 if not dry else 0.3)      # wall share of the deepest (first) depth: the other two
    # take ~0.5 and ~0.35 of it (measured on the H200, 2026-12-04), compile and eval included
    emit(f"point_maze/big_maze, {seeds} seeds vmapped; the deepest depth trains for ~{share:.0f} s and sets "
         "the env-step budget of the others; final deterministic eval; mean ± 95% t-interval over seeds")
    emit("| depth | encoder N | env steps | updates | time at goal | success | wall s |")
    emit("|---:|---:|---:|---:|---:|---:|---:|")
    # σ = 1/16 (not the paper's 1/40): more updates per env step inside the minutes this has;
    # 25 vector steps a chunk (800 updates at 512 envs), so the time share is checked often
    base = _crl_config(dry, 4, compute_dtype="bfloat16", utd=1 / 16,
                       **({} if dry else {"chunk_env_steps": 512 * 32}))
    rnd = jax.device_get(jax.jit(lambda k: crl.random_policy_metrics(base, k, 256))(jax.random.PRNGKey(10_000)))
    emit(f"| random | 0 | – | – | {float(rnd['eval_time_at_goal']):.1f} | {float(rnd['eval_success_any']):.2f} | – |")
    chunks_budget = None
    for depth in depths:
        t0 = time.perf_counter()
        cfg = _crl_config(dry, depth, compute_dtype="bfloat16", utd=base.utd, env_steps=10 ** 9,
                          chunk_env_steps=base.chunk_env_steps)
        agent = crl.make(cfg)
        keys = jax.random.split(jax.random.PRNGKey(0), seeds)
        state = jax.jit(jax.vmap(agent.init))(keys)
        chunk = jax.jit(jax.vmap(agent.chunk), donate_argnums=0)
        n = 0
        while True:
            state, m = chunk(state)
            jax.block_until_ready(m)
            n += 1
            if chunks_budget is not None and n >= chunks_budget:
                break
            if chunks_budget is None and time.perf_counter() - t0 >= share:
                break
        chunks_budget = chunks_budget or n
        ev = jax.device_get(jax.jit(jax.vmap(agent.evaluate))(
            state, jax.random.split(jax.random.PRNGKey(1), seeds)))
        steps = cfg.learning_starts + n * cfg.chunk_env_steps
        t, s = mean_ci(np.asarray(ev["eval_time_at_goal"])), mean_ci(np.asarray(ev["eval_success_any"]))
        emit(f"| {depth} | {agent.param_count:,} | {steps:,} | {int(n * cfg.chunk_env_steps * cfg.utd):,} | "
             f"{t[0]:.1f} ± {t[1]:.1f} | {s[0]:.2f} ± {s[1]:.2f} | {time.perf_counter() - t0:.0f} |")
    emit(f"episode length {base.episode_length or 'env default'}, width {base.width}, batch {base.batch_size}, "
         f"envs {base.num_envs}, utd {base.utd:g}")


def section_f(dry: bool) -> None:
    import jax

    from scaling_rl import cli

    if dry:
        size = ["device=cpu", "hidden_size=32", "num_layers=2", "num_heads=2", "sft_steps=2",
                "prompts_per_step=4", "group_size=4", "eval_problems=8"]
    else:
        size = ["device=cuda", "bf16=true", "hidden_size=512", "num_layers=8", "num_heads=8", "sft_steps=5",
                "prompts_per_step=16", "group_size=8", "eval_problems=32"]
    emit(f"jax backend {jax.default_backend()}; torch + JAX in one process")
    emit("| rollout | rc | seconds |")
    emit("|---|---:|---:|")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("sync", "async", "pipeline", "tba"):
            t0 = time.perf_counter()
            try:
                rc = cli.main(["grpo", "--out", f"{tmp}/{mode}", "--quiet", *size, f"rollout={mode}",
                               "steps=1", "eval_every=1", "checkpoint_every=1", "torch_threads=4"])
            except Exception as e:                      # noqa: BLE001  (a section reports, never hides)
                emit(f"{mode}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                rc = 1
            rc = rc or 0
            if rc:
                failed.append(mode)
            emit(f"| {mode} | {rc} | {time.perf_counter() - t0:.1f} |")
    if failed:
        raise RuntimeError(f"GRPO failed for rollout {', '.join(failed)}")


QWEN25_05B = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def section_g(dry: bool) -> None:
    import jax
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from scaling_rl import cli
    from scaling_rl.llm.models import char_tokenizer, save_policy

    arch = dict(QWEN25_05B, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1) if dry else QWEN25_05B
    device = "cpu" if dry else "cuda"
    tok = char_tokenizer()
    cfg = Qwen2Config(**arch, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    params = sum(p.numel() for p in model.parameters())
    size = ["device=cpu", "prompts_per_step=4", "group_size=4", "eval_problems=8"] if dry else \
        ["device=cuda", "bf16=true", "prompts_per_step=16", "group_size=8", "eval_problems=32", "torch_threads=4"]
    with tempfile.TemporaryDirectory() as tmp:
        save_policy(model, tok, f"{tmp}/model")
        del model
        if not dry:
            torch.cuda.empty_cache()
        emit(f"Qwen2.5-0.5B architecture{' (DRY: 1 tiny layer)' if dry else ''}: {params / 1e6:.1f} M parameters "
             f"(vocabulary {arch['vocab_size']:,}), built and saved in {time.perf_counter() - t0:.1f} s; "
             f"jax backend {jax.default_backend()}")
        emit("| rollout | rc | seconds (2 steps, load included) | torch peak GiB | JAX peak GiB |")
        emit("|---|---:|---:|---:|---:|")
        failed = []
        for mode in ("sync", "pipeline", "async"):
            if not dry:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            try:
                rc = cli.main(["grpo", "--out", f"{tmp}/{mode}", "--quiet", *size, f"init_from={tmp}/model",
                               f"rollout={mode}", "steps=2", "eval_every=2", "checkpoint_every=2",
                               "max_completion_length=8"]) or 0
            except Exception as e:                      # noqa: BLE001  (a section reports, never hides)
                emit(f"{mode}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                rc = 1
            secs = time.perf_counter() - t0
            tpeak = torch.cuda.max_memory_allocated() / 2**30 if not dry else float("nan")
            stats = jax.devices()[0].memory_stats() or {}
            jpeak = stats.get("peak_bytes_in_use", float("nan")) / 2**30
            if rc:
                failed.append(mode)
            emit(f"| {mode} | {rc} | {secs:.1f} | {tpeak:.2f} | {jpeak:.2f} |")
    if failed:
        raise RuntimeError(f"GRPO from init_from failed for rollout {', '.join(failed)}")


# --- orchestration --------------------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def child(section: str, dry: bool, budget: float) -> int:
    fn = globals()[f"section_{section}"]
    try:
        fn(dry, budget) if section in ("d", "e") else fn(dry)
    except Exception as e:                              # noqa: BLE001
        emit(f"section {section} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu")
    p.add_argument("--dry", action="store_true", help="tiny sizes, any backend (CPU emulation / CI)")
    p.add_argument("--sections", default=SECTIONS, help="which of a..g, e.g. a,b,e (default: all)")
    p.add_argument("--total", type=float, default=None, help="seconds for all sections (default 570; dry 1400)")
    p.add_argument("--budgets", default="", metavar="X=S,...",
                   help="override section budgets in seconds, e.g. e=170,g=90 (a rerun of what ran over)")
    p.add_argument("--section", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.section:
        return child(args.section, args.dry, args.budget)

    sections = [s for s in args.sections.replace(",", "") if s.strip()]
    if not sections or any(s not in SECTIONS for s in sections):
        print(f"run.py: --sections {args.sections!r}: use letters of {SECTIONS}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    import jax
    backend = jax.default_backend()
    if backend != "gpu" and not args.dry:
        print(f"run.py: jax.default_backend() is {backend!r}, not 'gpu' (jax {jax.__version__}); "
              "this run needs a CUDA GPU (use --dry for the CPU smoke)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = jax.devices()[0]
    header = (f"# GPU run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}{' (DRY: tiny sizes)' if args.dry else ''}\n\n"
              f"device {dev.device_kind} x{jax.device_count()} ({backend}), jax {jax.__version__}, "
              f"python {sys.version.split()[0]}\n")
    del jax
    emit(header)
    md, record = [header], {"dry": args.dry, "device": dev.device_kind, "sections": {}}
    total = args.total or (1400.0 if args.dry else 570.0)
    budgets = dict(DRY_BUDGET_S if args.dry else BUDGET_S)
    for item in filter(None, args.budgets.split(",")):
        key, _, val = item.partition("=")
        try:
            budgets[key.strip()] = float(val) if key.strip() in SECTIONS else float("x")
        except ValueError:
            print(f"run.py: --budgets {item!r}: use X=SECONDS with X one of {SECTIONS}", file=sys.stderr)
            return 2
    failed = 0
    for s in sections:
        left = total - (time.perf_counter() - t_start)
        budget = min(budgets[s], left)
        title = f"## {s}. {TITLES[s]}"
        emit(title)
        if budget < 5:
            lines, status, secs = ["not run: the run's time is spent"], "skipped", 0.0
        else:
            env = dict(os.environ, GPU_RUN_T0=repr(time.time()))
            cmd = [sys.executable, __file__, "--section", s, "--budget", str(budget)] + (["--dry"] if args.dry else [])
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                    start_new_session=True)
            lines = []
            import threading

            def pump(proc=proc, lines=lines):
                for line in proc.stdout:
                    line = line.rstrip()
                    lines.append(line)
                    emit(line)
            th = threading.Thread(target=pump, daemon=True)
            th.start()
            try:
                rc = proc.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                rc = 124
            th.join(timeout=5)
            secs = time.perf_counter() - t0
            status = "ok" if rc == 0 else ("timeout" if rc == 124 else f"failed rc={rc}")
            if rc == 124:
                lines.append(f"section {s} ran over its {budget:.0f} s budget and was stopped")
                emit(lines[-1])
        failed += status != "ok"
        shown = [ln for ln in lines if not ln.startswith(("WARNING", "I0000", "W0000"))][-60:]
        md.append(f"{title}  ({status}, {secs:.0f} s)\n\n" + "\n".join(shown) + "\n")
        record["sections"][s] = {"title": TITLES[s], "status": status, "seconds": round(secs, 1),
                                 "budget_s": round(budget, 1), "lines": lines[-200:]}
        write_atomic(out / "results.md", "\n".join(md))
        write_atomic(out / "results.json", json.dumps(record, indent=1))
    emit(f"gpu_run done: {len(sections) - failed}/{len(sections)} sections ok in "
         f"{time.perf_counter() - t_start:.0f} s; tables in {out}/results.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
