"""Micro study: Hogwild! workers vs independent samples at equal tokens on two-part addition.

    python experiments/hogwild_study.py --out runs/hogwild_study [--workers 2,4] [--seeds 3]
        [--problems 200] [--sft-steps 800] [--view-sft-steps 400]

Task: "3+4,5+9=" -> "07,14" (two 1-digit sums; reward 1 only when both are right), parts
that one worker could leave to another. A tiny Qwen2 model is SFT-trained on single answers
(`trainer.sft`), then for each N in `--workers` every held-out problem gets N completions of at
most 6 tokens, made four ways with the same token budget:
    independent   N ordinary KV-cached samples (`rollout.sample`)
    hogwild       one team of N workers on a shared cache (contiguous layout)
    hogwild+prompt  the same, with the collaboration prompt and "worker w: " headers
    hogwild, view-SFT  `hogwild` with a copy of the model further SFT-trained on lockstep views
                    (`sft_views`: the others' partial answers before its own), i.e. taught to
                    tolerate the shared context, not to split the work
Metrics per problem: mean accuracy of the N completions and "any" (at least one fully right),
averaged over problems and `--seeds` sampling seeds; intervals: 95% percentile bootstrap over
problems (1000 resamples of the seed-averaged per-problem values). Wall time: generation only,
one thread. Writes <out>/results.parquet, <out>/table.md and <out>/hogwild_study.png (accuracy
vs wall time). Nothing here trains the model to collaborate: it answers as it was taught, so
this measures whether seeing the others' tokens helps or hurts a policy not trained for it, and
one cheaply adapted to it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from scaling_rl.llm.tasks import Problem, _split_of  # noqa: E402

METHODS = ("independent", "hogwild", "hogwild+prompt", "hogwild, view-SFT")


class TwoSums:
    """Two additions of `digits`-digit numbers in one prompt ("3+4,5+9=" -> "07,14"); pairs are
    split into train / test by a hash of the pair (`tasks._split_of`)."""

    name = "two_sums"

    def __init__(self, digits: int = 1):
        self.digits, self.base = digits, 10 ** digits
        keys = np.arange(self.base ** 4)
        test = np.array([_split_of(int(k), 0.1) == "test" for k in keys])
        self._keys = {"test": keys[test], "train": keys[~test]}

    def problem(self, key: int) -> Problem:
        d, base = self.digits, self.base
        a, b, c, e = key // base ** 3, key // base ** 2 % base, key // base % base, key % base
        return Problem(int(key), f"{a:0{d}d}+{b:0{d}d},{c:0{d}d}+{e:0{d}d}=",
                       f"{a + b:0{d + 1}d},{c + e:0{d + 1}d}", (a, b, c, e), 0)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        pool = self._keys[split]
        keys = np.random.default_rng(seed).choice(pool, size=min(n, len(pool)), replace=False)
        return [self.problem(int(k)) for k in keys]

    def max_answer_chars(self) -> int:
        return 2 * self.digits + 3

    def solution(self, problem: Problem) -> str:
        return problem.answer

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        parts = completion.strip().split(",")
        if not finished or len(parts) != 2 or not all(p.isdigit() for p in parts):
            return 0.0
        a, b, c, d = problem.numbers
        return float(int(parts[0]) == a + b and int(parts[1]) == c + d)


def sft_views(model, tok, task, *, workers: int, steps: int, seed: int, lr: float = 3e-3,
              batch_size: int = 64) -> float:
    """Continue SFT on lockstep views: prompt + k other workers' first t answer tokens (each, the
    reference answer for all) + the first t of its own, target own token t; k uniform in
    0..workers-1 (k = 0 keeps single answers), t uniform over the answer (+ EOS). The view is
    laid out contiguously as in the `contiguous` layout. Returns the last loss."""
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(seed)
    pool = task.problems("train", 100_000, seed=seed + 1)
    eos = tok.eos_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        rows, targets = [], []
        for i in rng.integers(len(pool), size=batch_size):
            q = pool[int(i)]
            ans = tok(q.answer, add_special_tokens=False)["input_ids"] + [eos]
            t, k = int(rng.integers(len(ans))), int(rng.integers(workers))
            rows.append(tok(q.prompt, add_special_tokens=False)["input_ids"] + ans[:t] * k + ans[:t])
            targets.append(ans[t])
        width = max(len(r) for r in rows)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        model.train()
        logits = model(input_ids=ids, attention_mask=mask, position_ids=rollout_positions(mask),
                       logits_to_keep=1).logits[:, -1]
        loss = F.cross_entropy(logits.float(), torch.tensor(targets))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def rollout_positions(mask):
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def bootstrap(values: np.ndarray, rng, n: int = 1000) -> tuple[float, float]:
    idx = rng.integers(len(values), size=(n, len(values)))
    means = values[idx].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/hogwild_study")
    p.add_argument("--workers", default="2,4")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--problems", type=int, default=200)
    p.add_argument("--sft-steps", type=int, default=800)
    p.add_argument("--view-sft-steps", type=int, default=400)
    args = p.parse_args(argv)
    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        workers = []
    if not workers or min(workers) < 1 or args.seeds < 1 or args.problems < 2:
        print("hogwild_study: --workers a,b,... >= 1, --seeds >= 1, --problems >= 2", file=sys.stderr)
        return 2
    import pandas as pd
    import torch

    from scaling_rl import io as sio
    from scaling_rl.llm import hogwild, rollout
    from scaling_rl.llm.models import load_policy
    from scaling_rl.llm.trainer import sft
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task = TwoSums()
    model, tok = load_policy("tiny", seed=0)
    info = sft(model, tok, task, steps=args.sft_steps, batch_size=64, lr=1e-2, seed=0,
               max_len=task.max_answer_chars() + 1)
    print(f"sft: {info}", flush=True)
    import copy
    adapted = copy.deepcopy(model)
    view_loss = sft_views(adapted, tok, task, workers=max(workers), steps=args.view_sft_steps, seed=0)
    info["view_sft_loss"] = view_loss
    print(f"view sft: loss {view_loss:.4f}", flush=True)
    problems = task.problems("test", args.problems, seed=123)
    eos = rollout.stop_ids(model, tok)
    rows = []
    for N in workers:
        for seed in range(args.seeds):
            for method in METHODS:
                gen = torch.Generator().manual_seed(1000 * seed + N)
                texts = [q.prompt for q in problems]
                kw = dict(max_new_tokens=task.max_answer_chars() + 1, eos_id=eos,
                          pad_id=tok.pad_token_id, generator=gen)
                t0 = time.perf_counter()
                if method == "independent":
                    ids, mask = rollout.encode_prompts(tok, [t for t in texts for _ in range(N)])
                    batch = rollout.sample(model, ids, mask, **kw)
                else:
                    collab = method == "hogwild+prompt"
                    if collab:
                        texts = [hogwild.collab_text(t, N) for t in texts]
                    ids, mask = rollout.encode_prompts(tok, texts)
                    policy = adapted if method.endswith("view-SFT") else model
                    batch = hogwild.generate(policy, ids, mask, workers=N,
                                             headers=hogwild.header_ids(tok, N) if collab else None,
                                             **kw)
                wall = time.perf_counter() - t0
                r = rollout.score(task, [q for q in problems for _ in range(N)], tok, batch)
                r = r.reshape(len(problems), N)
                tokens = int(batch.completion_mask.sum())
                for j, q in enumerate(problems):
                    rows.append(dict(workers=N, seed=seed, method=method, problem=q.id,
                                     accuracy=float(r[j].mean()), any=float(r[j].max()),
                                     wall_s=wall, tokens=tokens))
                print(f"N={N} seed={seed} {method:15s} acc {r.mean():.3f} any "
                      f"{r.max(1).mean():.3f} wall {wall:.2f}s tokens {tokens}", flush=True)
    df = pd.DataFrame(rows)
    sio.atomic_write_parquet(out / "results.parquet", df)
    rng = np.random.default_rng(0)
    table = []
    for (N, method), g in df.groupby(["workers", "method"], sort=False):
        per_problem = g.groupby("problem")[["accuracy", "any"]].mean()
        acc, any_ = per_problem["accuracy"].to_numpy(), per_problem["any"].to_numpy()
        lo, hi = bootstrap(acc, rng)
        alo, ahi = bootstrap(any_, rng)
        runs = g.groupby("seed")[["wall_s", "tokens"]].first()
        table.append({"N": N, "method": method, "accuracy": acc.mean(), "acc 95% CI": f"[{lo:.3f}, {hi:.3f}]",
                      "any correct": any_.mean(), "any 95% CI": f"[{alo:.3f}, {ahi:.3f}]",
                      "wall s": runs["wall_s"].median(), "tokens": int(runs["tokens"].mean())})
    table = pd.DataFrame(table)
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
             for row in table.itertuples(index=False)]
    md = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    md += ["| " + " | ".join(c) + " |" for c in cells]
    sio.atomic_write_text(out / "table.md", f"SFT: {info}\n\n" + "\n".join(md) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for method, g in table.groupby("method", sort=False):
        ax.plot(g["wall s"], g["accuracy"], marker="o", label=method)
        for _, row in g.iterrows():
            ax.annotate(f"N={row['N']}", (row["wall s"], row["accuracy"]), fontsize=7)
    ax.set_xlabel("generation wall time (s, median over seeds)")
    ax.set_ylabel("held-out accuracy per completion")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    sio.atomic_savefig(fig, out / "hogwild_study.png")
    plt.close(fig)
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
