"""DPO on a `transformers` causal LM (policy + frozen reference), the loss in JAX through the bridge,
with pluggable batch schedulers (`scaling_rl.llm.sams`: uniform | sams | small_loss).

    df = run({"steps": 60, "beta": 0.1, "scheduler": "sams", "noise": 0.2}, "runs/dpo")

Loss (Rafailov et al. 2023; variants and conventions as TRL's `DPOTrainer.dpo_loss`): with
sequence log-probs π_c, π_r of the chosen / rejected completion under the policy and ρ_c, ρ_r under
the reference, logits = (π_c - π_r) - (ρ_c - ρ_r) and

    sigmoid: -(1-ε)·log σ(β·logits) - ε·log σ(-β·logits)      (ε = label_smoothing, cDPO)
    robust:  (-(1-ε)·log σ(β·logits) + ε·log σ(-β·logits)) / (1 - 2ε)   (rDPO)
    hinge:   relu(1 - β·logits)                                  (SLiC)
    ipo:     (logits - 1/(2β))²  with length-averaged log-ratios (TRL's IPO convention)

Implicit rewards β(π - ρ) give the preference accuracy (margin > 0; held-out ties count ½). The batch loss is the mean.

Preference data (`preference_pairs`) is made from a verifiable task (2-digit addition): chosen = the
correct answer, rejected = a wrong answer of the same format (the sum with one digit changed), and a
known fraction `noise` of the training pairs has its labels flipped (held-out pairs never are).

One run = SFT warm start (`warm_start.sft`, a weak start so DPO has room; or `init_from` a saved
policy) -> `base_model/` (also the frozen reference) -> `steps` DPO updates. Each step the
scheduler receives a candidate batch of `batch_size * candidates` pairs drawn uniformly from the
training pool, scored by one no-grad policy + reference forward (per-pair loss, margin, log-probs
and, for SamS, the policy's per-layer hidden states; uniform is not scored and gets exactly
`batch_size`), and returns the `batch_size` pairs that train (their reference log-probs are reused
from the scoring). Rows (metrics.parquet): step, pairs (training pairs consumed), compute_pairs
(compute spent in trained-pair equivalents, candidate forwards included: `step_cost`), loss,
margin, reward accuracy, selected_flipped (fraction of flipped pairs among those trained on),
score_s / sched_s / step_s (candidate forwards / scheduler / whole-step wall time) and, every
`eval_every` steps,
eval/pref_accuracy (held-out pairs) and eval/accuracy (greedy task accuracy). Files:
dpo_config.json, metrics.parquet, base_model/, final_model/ (a finished run reruns as a no-op;
an unfinished one restarts from its base model).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

LOSS_TYPES = ("sigmoid", "ipo", "hinge", "robust")


# ---- the loss, in JAX ---------------------------------------------------------------------------

def dpo_losses(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *,
               beta: float, loss_type: str = "sigmoid", label_smoothing: float = 0.0):
    """Per-pair DPO loss and implicit rewards from sequence log-probs (all (B,)).

    Returns (losses, chosen_rewards, rejected_rewards), rewards = β·(π - ρ) without gradient.
    """
    logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
    z = beta * logits
    eps = label_smoothing
    if loss_type == "sigmoid":
        losses = -jax.nn.log_sigmoid(z) * (1 - eps) - jax.nn.log_sigmoid(-z) * eps
    elif loss_type == "robust":
        losses = (-jax.nn.log_sigmoid(z) * (1 - eps) + jax.nn.log_sigmoid(-z) * eps) / (1 - 2 * eps)
    elif loss_type == "hinge":
        losses = jax.nn.relu(1 - z)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"loss_type: {loss_type!r} is unknown; use one of {LOSS_TYPES}")
    stop = jax.lax.stop_gradient
    return (losses, stop(beta * (chosen_logps - ref_chosen_logps)),
            stop(beta * (rejected_logps - ref_rejected_logps)))


def dpo_objective(chosen_tok, rejected_tok, ref_chosen_tok, ref_rejected_tok, chosen_mask,
                  rejected_mask, *, beta: float, loss_type: str, label_smoothing: float):
    """Mean DPO loss from per-token log-probs (B, T) and 0/1 masks, plus per-pair diagnostics.

    Sequence log-probs are masked sums. IPO's loss uses length-averaged log-ratios (TRL's
    convention); the implicit rewards are always β·(summed log-ratio), as TRL logs them.
    Returns (loss, aux) with aux: losses, margins (chosen - rejected implicit reward),
    chosen_rewards, rejected_rewards (all (B,), no gradient).
    """
    cm, rm = chosen_mask.astype(chosen_tok.dtype), rejected_mask.astype(rejected_tok.dtype)
    seq = lambda tok, m: jnp.sum(tok * m, axis=-1)  # noqa: E731
    c, r = seq(chosen_tok, cm), seq(rejected_tok, rm)
    rc, rr = seq(ref_chosen_tok, cm), seq(ref_rejected_tok, rm)
    if loss_type == "ipo":
        cl, rl = jnp.maximum(jnp.sum(cm, -1), 1.0), jnp.maximum(jnp.sum(rm, -1), 1.0)
        losses, _, _ = dpo_losses(c / cl, r / rl, rc / cl, rr / rl, beta=beta, loss_type=loss_type,
                                  label_smoothing=label_smoothing)
    else:
        losses, _, _ = dpo_losses(c, r, rc, rr, beta=beta, loss_type=loss_type,
                                  label_smoothing=label_smoothing)
    stop = jax.lax.stop_gradient
    chosen_rewards, rejected_rewards = stop(beta * (c - rc)), stop(beta * (r - rr))
    return jnp.mean(losses), {"losses": stop(losses), "margins": chosen_rewards - rejected_rewards,
                              "chosen_rewards": chosen_rewards, "rejected_rewards": rejected_rewards}


@functools.lru_cache(maxsize=None)
def objective_fn(beta: float, loss_type: str, label_smoothing: float):
    """`dpo_objective` with its hyper-parameters bound (cached: one jit per setting)."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type: {loss_type!r} is unknown; use one of {LOSS_TYPES}")
    return functools.partial(dpo_objective, beta=beta, loss_type=loss_type,
                             label_smoothing=label_smoothing)


@functools.lru_cache(maxsize=None)
def torch_objective(beta: float, loss_type: str, label_smoothing: float):
    """The objective as a torch autograd op (backward = JAX VJP)."""
    from scaling_rl.bridge import torch_op
    return torch_op(objective_fn(beta, loss_type, label_smoothing))


# ---- preference data ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str
    flipped: bool     # labels swapped: `chosen` is the wrong answer


def wrong_answer(answer: str, rng: np.random.Generator) -> str:
    """The answer with one digit changed (same length, never equal)."""
    i = int(rng.integers(len(answer)))
    d = int(answer[i])
    new = (d + int(rng.integers(1, 10))) % 10
    return answer[:i] + str(new) + answer[i + 1:]


def preference_pairs(task, split: str, n: int, *, noise: float, seed: int) -> list[Pair]:
    """n pairs (correct vs wrong completion) of `split`; a fraction `noise` (exactly
    round(noise * n), chosen at random) has chosen/rejected swapped."""
    if not 0.0 <= noise < 0.5:
        raise ValueError(f"noise: {noise!r} is outside [0, 0.5)")
    rng = np.random.default_rng(seed + 31)
    problems = task.problems(split, n, seed=seed)
    flip = np.zeros(len(problems), dtype=bool)
    flip[rng.permutation(len(problems))[:int(round(noise * len(problems)))]] = True
    pairs = []
    for p, f in zip(problems, flip):
        good, bad = task.solution(p), wrong_answer(task.solution(p), rng)
        pairs.append(Pair(p.prompt, bad if f else good, good if f else bad, bool(f)))
    return pairs


# ---- config -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DPOConfig:
    # policy (tiny built-in model or a local path)
    model: str = "tiny"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    init_from: str = ""               # saved policy directory to start from (then no SFT)
    digits: int = 2
    # data
    train_pairs: int = 2048
    eval_pairs: int = 256
    eval_problems: int = 200
    noise: float = 0.0                # fraction of training pairs with flipped labels
    # SFT warm start (then frozen as the reference)
    sft_steps: int = 150
    sft_batch_size: int = 64
    sft_lr: float = 1e-2
    # DPO
    steps: int = 60
    batch_size: int = 32
    lr: float = 1e-3
    max_grad_norm: float = 1.0
    beta: float = 0.1
    loss_type: str = "sigmoid"        # sigmoid | ipo | hinge | robust
    label_smoothing: float = 0.0
    # scheduler (scaling_rl.llm.sams)
    scheduler: str = "uniform"        # uniform | sams | small_loss
    candidates: int = 2               # candidate batch = batch_size * candidates (not uniform)
    sams_hidden: int = 64
    sams_lr: float = 1e-3
    sams_updates: int = 2             # scheduler-network Adam steps per observed reward (ref. 2)
    sams_explore: float = 0.1         # weight of the exploration network in the score (ref. f2_weight)
    sams_temperature: float = 1.0     # selection ~ softmax(score / T) without replacement (ref. T = 1)
    sams_batch_weight: float = 0.5    # λ: batch-level vs sample-level part of the reward
    # bookkeeping
    eval_every: int = 10
    seed: int = 0
    torch_threads: int = 1
    device: str = "cpu"

    def __post_init__(self):
        from scaling_rl.llm import sams

        def need(cond, key, what):
            if not cond:
                raise ValueError(f"{key}: {getattr(self, key)!r} {what}")
        need(self.loss_type in LOSS_TYPES, "loss_type", f"is unknown; use one of {LOSS_TYPES}")
        need(self.scheduler in sams.SCHEDULERS, "scheduler",
             f"is unknown; use one of {sams.SCHEDULERS}")
        need(0.0 <= self.noise < 0.5, "noise", "is outside [0, 0.5)")
        need(0.0 <= self.label_smoothing < 0.5, "label_smoothing", "is outside [0, 0.5)")
        need(self.beta > 0, "beta", "must be > 0")
        need(self.lr > 0 and self.sft_lr > 0 and self.sams_lr > 0, "lr", "must be > 0 (all lrs)")
        need(self.sams_temperature > 0, "sams_temperature", "must be > 0")
        need(0.0 <= self.sams_batch_weight <= 1.0, "sams_batch_weight", "is outside [0, 1]")
        for key in ("steps", "sft_steps", "seed", "sams_explore"):
            need(getattr(self, key) >= 0, key, "is negative; use a value >= 0")
        for key in ("batch_size", "candidates", "train_pairs", "eval_pairs", "eval_problems",
                    "eval_every", "torch_threads", "hidden_size", "num_layers", "num_heads",
                    "sft_batch_size", "sams_hidden", "sams_updates", "digits"):
            need(getattr(self, key) >= 1, key, "must be >= 1")
        need(self.batch_size * self.candidates <= self.train_pairs, "candidates",
             "makes a candidate batch larger than train_pairs")
        need(not self.init_from or (Path(self.init_from) / "config.json").is_file(), "init_from",
             "is not a saved policy directory (no config.json)")
        need(self.hidden_size % self.num_heads == 0, "hidden_size",
             f"is not divisible by num_heads={self.num_heads}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DPOConfig":
        from scaling_rl.llm.grpo_config import config_from_dict
        return config_from_dict(cls, d, "DPO")


# ---- compute accounting -------------------------------------------------------------------------
# In forward-pass equivalents of one pair (chosen + rejected rows; a backward costs two forwards):
TRAIN_UNITS = 4      # a trained pair: policy forward + backward (3) + reference forward (1)
SCORE_UNITS = 2      # a scored candidate: policy forward + reference forward, no gradient
REUSED_REF_UNITS = 1 # a trained pair whose reference log-probs came from its scoring saves this


def candidate_count(cfg: "DPOConfig") -> int:
    """Pairs drawn per step: batch_size for uniform, batch_size * candidates otherwise."""
    return cfg.batch_size if cfg.scheduler == "uniform" else cfg.batch_size * cfg.candidates


def step_cost(cfg: "DPOConfig") -> float:
    """Compute of one DPO step in trained-pair equivalents (a uniform step of B pairs costs B):
    uniform B·4/4; a scoring scheduler (2·B·candidates + 3·B)/4 -- every candidate's policy and
    reference forward is charged, and the trained pairs reuse the reference log-probs of their
    scoring. The scheduler's own networks are not FLOP-counted (measured as time in sched_s)."""
    if cfg.scheduler == "uniform":
        return float(cfg.batch_size)
    units = (SCORE_UNITS * candidate_count(cfg)
             + (TRAIN_UNITS - REUSED_REF_UNITS) * cfg.batch_size)
    return units / TRAIN_UNITS


def steps_for_compute(cfg: "DPOConfig", compute_pairs: float) -> int:
    """The number of steps of `cfg` that spends `compute_pairs` (rounded to the nearest step)."""
    return max(int(round(compute_pairs / step_cost(cfg))), 0)


# ---- the trainer --------------------------------------------------------------------------------

class DPOTrainer:
    """Policy, frozen reference, optimizer, data and scheduler of one DPO run."""

    def __init__(self, config: DPOConfig, out_dir=None):
        import torch

        from scaling_rl.llm.tasks import AdditionTask
        from scaling_rl.llm.grpo_config import resolve_device
        self.cfg = config
        self.out = Path(out_dir) if out_dir is not None else None
        self.device = resolve_device(config.device)
        self.task = AdditionTask(config.digits)
        self.train = preference_pairs(self.task, "train", config.train_pairs, noise=config.noise,
                                      seed=config.seed)
        self.eval_set = preference_pairs(self.task, "test", config.eval_pairs, noise=0.0, seed=12345)
        self.eval_problems = self.task.problems("test", config.eval_problems, seed=1234)
        self.rng = np.random.default_rng(config.seed + 101)
        self.width = self.task.max_answer_chars() + 1
        self.rows: list[dict] = []
        self.step = 0
        self.policy = self.reference = self.tokenizer = self.opt = None
        self._torch = torch

    # -- model side
    def setup(self, log=None) -> None:
        import copy

        from scaling_rl.llm import sams
        from scaling_rl.llm.models import load_policy, save_policy
        from scaling_rl.llm.warm_start import sft
        torch, cfg = self._torch, self.cfg
        torch.manual_seed(cfg.seed)
        model, tok = load_policy(cfg.init_from or cfg.model, hidden_size=cfg.hidden_size,
                                 num_layers=cfg.num_layers, num_heads=cfg.num_heads, seed=cfg.seed)
        model.to(self.device)
        if cfg.sft_steps and not cfg.init_from:
            sft(model, tok, self.task, steps=cfg.sft_steps, batch_size=cfg.sft_batch_size,
                lr=cfg.sft_lr, seed=cfg.seed, max_len=self.width, log=log)
        model.eval()
        if self.out is not None:
            save_policy(model, tok, self.out / "base_model")
        self.policy, self.tokenizer = model, tok
        self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.scheduler = sams.make_scheduler(cfg)

    def _encode(self, pairs: list[Pair]):
        from scaling_rl.llm import rollout
        from scaling_rl.llm.warm_start import _completion_tensors
        p_ids, p_mask = rollout.encode_prompts(self.tokenizer, [p.prompt for p in pairs], False,
                                               self.device)
        c_ids, c_mask = _completion_tensors(self.tokenizer, [p.chosen for p in pairs], self.width,
                                            self.device)
        r_ids, r_mask = _completion_tensors(self.tokenizer, [p.rejected for p in pairs], self.width,
                                            self.device)
        return p_ids, p_mask, c_ids, c_mask, r_ids, r_mask

    def token_logps(self, model, enc, hidden: bool = False):
        """Per-token log-probs (chosen (B, T), rejected (B, T)); one forward on the 2B rows.
        `hidden`: also the per-layer hidden states averaged over each pair's tokens and over its
        chosen and rejected rows, (B, L, d) float32 (no gradient; SamS's context)."""
        from scaling_rl.llm import rollout
        torch = self._torch
        p_ids, p_mask, c_ids, c_mask, r_ids, r_mask = enc
        n = p_ids.shape[0]
        if not hidden:
            logp, _ = rollout.completion_logprobs(model, torch.cat([p_ids, p_ids]),
                                                  torch.cat([p_mask, p_mask]),
                                                  torch.cat([c_ids, r_ids]),
                                                  torch.cat([c_mask, r_mask]))
            return logp[:n], logp[n:]
        comp, T = torch.cat([c_ids, r_ids]), c_ids.shape[1]
        ids = torch.cat([torch.cat([p_ids, p_ids]), comp[:, :-1]], dim=1)
        mask = torch.cat([torch.cat([p_mask, p_mask]),
                          torch.cat([c_mask, r_mask])[:, :-1].to(p_mask.dtype)], dim=1)
        out = model(input_ids=ids, attention_mask=mask, position_ids=rollout._positions(mask),
                    logits_to_keep=T, use_cache=False, output_hidden_states=True)
        logp = rollout.selective_logprobs(out.logits, comp)
        w = mask.to(torch.float32)[None, :, :, None]                       # (1, 2B, S, 1)
        h = torch.stack([x.detach().float() for x in out.hidden_states[1:]])  # (L, 2B, S, d)
        per_row = (h * w).sum(2) / w.sum(2).clamp(min=1.0)                 # (L, 2B, d)
        ctx = (0.5 * (per_row[:, :n] + per_row[:, n:])).permute(1, 0, 2)   # (B, L, d)
        return logp[:n], logp[n:], ctx

    def pair_stats(self, pairs: "list[Pair] | None" = None, *, enc=None, hidden: bool = False) -> dict:
        """Per-pair loss / margin / log-probs under the current policy (no gradient), from one
        policy and one reference forward on `pairs` (or an encoding `enc` of them). Also returned:
        the reference's per-token log-probs ("ref_logps", reusable by `update`) and, with `hidden`,
        the per-layer hidden states ("hidden", (n, L, d); see `token_logps`)."""
        torch, cfg = self._torch, self.cfg
        enc = self._encode(pairs) if enc is None else enc
        with torch.no_grad():
            pol = self.token_logps(self.policy, enc, hidden=hidden)
            pc, pr = pol[0], pol[1]
            rc, rr = self.token_logps(self.reference, enc)
            _, aux = objective_fn(cfg.beta, cfg.loss_type, cfg.label_smoothing)(
                *(jnp.asarray(x.cpu().numpy()) for x in (pc, pr, rc, rr, enc[3], enc[5])))
        c_len, r_len = enc[3].sum(-1).cpu().numpy(), enc[5].sum(-1).cpu().numpy()
        c_seq = (pc * enc[3]).sum(-1).cpu().numpy()
        out = {"losses": np.asarray(aux["losses"]), "margins": np.asarray(aux["margins"]),
               "chosen_seq_logp": c_seq, "chosen_logp": c_seq / c_len,
               "rejected_logp": (pr * enc[5]).sum(-1).cpu().numpy() / r_len, "ref_logps": (rc, rr)}
        if hidden:
            out["hidden"] = pol[2].cpu().numpy()
        return out

    def update(self, pairs: "list[Pair] | None" = None, *, enc=None, ref_logps=None) -> dict:
        """One optimizer step of DPO on `pairs` (or their encoding `enc`); returns loss, margin,
        accuracy, grad norm. `ref_logps`: the reference's per-token log-probs of these pairs when
        already computed (the candidate scoring made them), else one reference forward here."""
        torch, cfg = self._torch, self.cfg
        from scaling_rl.llm import rollout
        enc = self._encode(pairs) if enc is None else enc
        rollout.set_training(self.policy, True)   # no per-step re-kernelisation (model.train() has one)
        if ref_logps is None:
            with torch.no_grad():
                rc, rr = self.token_logps(self.reference, enc)
        else:
            rc, rr = ref_logps
        pc, pr = self.token_logps(self.policy, enc)
        loss, aux = torch_objective(cfg.beta, cfg.loss_type, cfg.label_smoothing)(
            pc, pr, rc, rr, enc[3].float(), enc[5].float())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
        self.opt.step()
        rollout.set_training(self.policy, False)
        margins = aux["margins"].detach().cpu().numpy()
        return {"loss": float(loss.detach()), "margin": float(margins.mean()),
                "reward_accuracy": float((margins > 0).mean()), "grad_norm": float(gn),
                "losses": aux["losses"].detach().cpu().numpy().copy()}

    def evaluate(self) -> dict:
        from scaling_rl.llm import rollout
        stats = self.pair_stats(self.eval_set)
        acc = rollout.accuracy(self.policy, self.tokenizer, self.task, self.eval_problems,
                               max_new_tokens=self.width)
        m = stats["margins"]    # ties (policy == reference, e.g. step 0) count one half
        return {"eval/pref_accuracy": float((m > 0).mean() + 0.5 * (m == 0).mean()),
                "eval/loss": float(stats["losses"].mean()), "eval/accuracy": acc}

    def train_step(self) -> dict:
        """Draw candidates, score them (non-uniform schedulers: one no-grad policy + reference
        forward on all of them), select, train. Timing columns: score_s (candidate forwards),
        sched_s (the scheduler itself: select + observe, its networks' fits included), step_s."""
        cfg, torch = self.cfg, self._torch
        t0 = time.perf_counter()
        n_cand = candidate_count(cfg)
        cand_idx = self.rng.choice(len(self.train), size=n_cand, replace=False)
        cand = [self.train[i] for i in cand_idx]
        enc = self._encode(cand)
        stats, ref = None, None
        if self.scheduler.needs_stats:
            stats = self.pair_stats(enc=enc, hidden=self.scheduler.needs_hidden)
        t1 = time.perf_counter()
        chosen = np.asarray(self.scheduler.select(stats, cfg.batch_size, self.rng))
        sched_s = time.perf_counter() - t1
        batch = [cand[i] for i in chosen]
        if stats is not None:      # train on the scored encoding's rows, reusing the reference's log-probs
            sel = torch.as_tensor(chosen, dtype=torch.long, device=enc[0].device)
            enc = tuple(t[sel] for t in enc)
            ref = tuple(t[sel] for t in stats["ref_logps"])
        out = self.update(enc=enc, ref_logps=ref)
        t2 = time.perf_counter()
        self.scheduler.observe(out["loss"], out["losses"])
        sched_s += time.perf_counter() - t2
        self.step += 1
        row = {"step": self.step, "pairs": self.step * cfg.batch_size,
               "compute_pairs": self.step * step_cost(cfg), "loss": out["loss"],
               "margin": out["margin"], "reward_accuracy": out["reward_accuracy"],
               "grad_norm": out["grad_norm"],
               "selected_flipped": float(np.mean([p.flipped for p in batch])),
               "score_s": t1 - t0, "sched_s": sched_s, "step_s": time.perf_counter() - t0}
        return row

    def fit(self, log=None) -> "list[dict]":
        cfg = self.cfg
        self.rows.append({"step": 0, "pairs": 0, **self.evaluate()})
        for _ in range(cfg.steps):
            row = self.train_step()
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                row.update(self.evaluate())
            self.rows.append(row)
            if log and "eval/accuracy" in row:
                log(f"dpo step {self.step:4d}  loss {row['loss']:.4f}  pref acc "
                    f"{row['eval/pref_accuracy']:.3f}  task acc {row['eval/accuracy']:.3f}")
        return self.rows


def run(config: "dict | DPOConfig", out_dir, *, progress: bool = False):
    """Train one DPO run in `out_dir` (atomic files); a finished run with the same config returns
    its table without training; a different config in the same directory is refused."""
    import pandas as pd
    import torch

    from scaling_rl import io as sio
    from scaling_rl.llm.models import save_policy
    from scaling_rl.llm.trainer import _torch_threads
    cfg = config if isinstance(config, DPOConfig) else DPOConfig.from_dict(dict(config))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path, metrics = out / "dpo_config.json", out / "metrics.parquet"
    resolved = dataclasses.asdict(cfg)
    if cfg_path.exists():
        previous = json.loads(cfg_path.read_text())
        diff = sorted(k for k in set(previous) | set(resolved) if previous.get(k) != resolved.get(k))
        if diff:
            raise ValueError(f"out_dir: {out} holds a run with a different config ({', '.join(diff)}); "
                             "use a new directory")
        if (out / "final_model" / "config.json").is_file() and metrics.is_file():
            return pd.read_parquet(metrics)
    sio.atomic_write_json(cfg_path, resolved)
    log = print if progress else None
    with _torch_threads(cfg.torch_threads):
        torch.manual_seed(cfg.seed)
        trainer = DPOTrainer(cfg, out)
        trainer.setup(log)
        df = pd.DataFrame(trainer.fit(log))
    sio.atomic_write_parquet(metrics, df)
    tmp, final = out / ".final_model.tmp", out / "final_model"
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(trainer.policy, trainer.tokenizer, tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return df


# ---- the `dpo` sweep trial kind -------------------------------------------------------------------

class Diverged(RuntimeError):
    """Non-finite DPO loss; `step` is the pairs count (env_steps) then."""

    def __init__(self, step: int, message: str = ""):
        self.step = int(step)
        super().__init__(message or f"diverged at env step {self.step}")


def _config_cls():
    return DPOConfig


def _check(config: dict) -> None:
    if config.get("seed", 0) != 0:
        raise ValueError(f"seed: {config['seed']!r} in the DPO config; set seeds with the spec's "
                         "`seed`/`seeds` keys or a `grid: {seed: [...]}` axis")
    DPOConfig.from_dict(dict(config))


def _param_count(config: dict) -> int:
    from scaling_rl.llm.sweep import param_count
    cfg = DPOConfig.from_dict(dict(config))
    return param_count({"model": cfg.model, "init_from": cfg.init_from, "hidden_size": cfg.hidden_size,
                        "num_layers": cfg.num_layers, "num_heads": cfg.num_heads})


def trial_run(config: dict, out_dir: str, seeds: int, seed: int, *, wandb=False,
              checkpoint_every: int = 1):
    """Run `seeds` DPO runs (seeds trial_seed*seeds + 0..seeds-1) one after another in
    <trial>/seed_<i>/; <trial>/metrics.parquet holds every seed's rows with seed / chunk (= DPO
    step; row 0 is the reference policy) / env_steps (compute spent, in trained-pair equivalents:
    `step_cost`, candidate scoring forwards included; `pairs` = pairs trained on) / grad_steps. A
    finished seed is not rerun; an unfinished one restarts (`checkpoint_every` is not used)."""
    import math

    import pandas as pd

    from scaling_rl import io as sio
    base = DPOConfig.from_dict(dict(config))
    _check(dataclasses.asdict(base))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfgs = [dataclasses.replace(base, seed=seed * seeds + i) for i in range(seeds)]
    sio.atomic_write_json(out / "config.json", {
        "agent": "dpo", "config": dict(config), "seeds": int(seeds), "seed": int(seed),
        "param_count": _param_count(dataclasses.asdict(base)),
        "seed_dirs": {f"seed_{i}": c.seed for i, c in enumerate(cfgs)}})
    frames = []
    for i, cfg in enumerate(cfgs):
        df = run(cfg, out / f"seed_{i}").copy()
        bad = df["loss"].dropna() if "loss" in df else pd.Series(dtype=float)
        bad = bad[~bad.map(math.isfinite)]
        step = df["step"].astype("int64")
        df.insert(0, "seed", i)
        df.insert(1, "chunk", step)
        df.insert(2, "env_steps", np.round(df["step"] * step_cost(cfg)).astype("int64"))
        df.insert(3, "grad_steps", step)
        frames.append(df)
        sio.atomic_write_parquet(out / "metrics.parquet", pd.concat(frames, ignore_index=True))
        if len(bad):
            n = int(df.loc[bad.index[0], "pairs"])
            raise Diverged(n, f"diverged at env step {n} (seed {cfg.seed}): loss non-finite")
    return pd.concat(frames, ignore_index=True)


def _budget(config: dict) -> int:
    """Per-seed budget in env_steps = compute in trained-pair equivalents (`step_cost`)."""
    cfg = DPOConfig.from_dict(dict(config))
    return int(round(int(cfg.steps) * step_cost(cfg)))


def _trial_kind():
    from scaling_rl.sweep.registry import TrialKind
    return TrialKind(name="dpo", config_cls=_config_cls, run=trial_run, param_count=_param_count,
                     check=_check, budget=_budget)


TRIAL_KIND = _trial_kind()
