"""Batch schedulers for DPO: which `k` pairs of a candidate batch train this step.

    uniform      the candidate batch *is* the training batch (k pairs drawn uniformly; no features)
    small_loss   pre-selection baseline: the k candidates with the smallest current DPO loss
                 (the small-loss trick against label noise; no learning, no exploration)
    sams         SamS (Huang et al., NeurIPS 2025, arXiv 2506.17252): a contextual bandit over the
                 candidates, with an exploitation and an exploration network

SamS as built here, against the paper / reference code (github:hzx122/SamS, read, not copied):

- arms and context: each candidate pair is an arm; its context x_i comes from the current policy.
  The paper feeds the policy's hidden states; we use the model's own per-pair preference state,
  as the issue asks: implicit-reward margin m_i = β·logits, p_i = σ(m_i), uncertainty 4·p_i(1-p_i),
  the current DPO loss, and the per-token log-probs of the chosen and rejected completions
  (`FEATURES`). Computing them costs one no-grad forward of policy and reference on the candidates.
- exploitation network f1(x) (MLP, 2 hidden layers): predicted reward of training on the arm.
- exploration network f2 (MLP): input ∇_{W_out} f1(x), the gradient of f1 with respect to its
  output layer, which for a linear output layer is f1's last hidden activation (the reference code
  feeds the same hidden states); target the residual y - f1(x) (EE-Net's exploration target).
- score u_i = f1(x_i) + `explore`·f2(∇f1(x_i)); k arms are drawn without replacement with
  probabilities ∝ exp(u_i / T) (Gumbel top-k), as the reference code samples from a softmax of scores.
- reward (observed with a lag of one step): batch-level learning progress of the batch chosen at
  step t is r_t = (L_t - L_{t+1}) / max(L_t, L_{t+1}), L the pre-update DPO loss of each step's
  training batch (the reference code's normalised loss difference between consecutive batches).
  Arm i of that batch gets y_i = λ·σ(50·r_t) + (1-λ)·σ(m_i): batch progress mixed with the
  sample-level margin term (reference code: "add" mode, scale 50, λ = 0.5).
- lagged update: (x, ∇f1, y) of each step join a replay pool (4096 arms); after each observed
  reward both networks take `updates` Adam steps on random minibatches of the pool (f1 on y with
  MSE, f2 on y - f1). Until the first reward arrives the selection is uniform.

Networks and their updates are JAX (optax), jitted once per shape.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

SCHEDULERS = ("uniform", "sams", "small_loss")
FEATURES = ("margin", "pref_prob", "uncertainty", "loss", "chosen_logp", "rejected_logp")
POOL = 4096
MINIBATCH = 256
REWARD_SCALE = 50.0


def features(stats: dict) -> np.ndarray:
    """(n, len(FEATURES)) context matrix from `DPOTrainer.pair_stats` output."""
    m = np.asarray(stats["margins"], dtype=np.float32)
    p = 1.0 / (1.0 + np.exp(-m))
    return np.stack([m, p, 4 * p * (1 - p), np.asarray(stats["losses"], np.float32),
                     np.asarray(stats["chosen_logp"], np.float32),
                     np.asarray(stats["rejected_logp"], np.float32)], axis=1).astype(np.float32)


def arm_rewards(batch_progress: float, margins: np.ndarray, weight: float) -> np.ndarray:
    """y_i = λ·σ(50·r) + (1-λ)·σ(m_i) for the arms of one batch (λ = `weight`)."""
    sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    return (weight * sig(REWARD_SCALE * batch_progress)
            + (1 - weight) * sig(np.asarray(margins, np.float64))).astype(np.float32)


def batch_progress(previous_loss: float, loss: float) -> float:
    """(L_t - L_{t+1}) / max(L_t, L_{t+1}); 0 when both are 0."""
    denom = max(abs(previous_loss), abs(loss))
    return 0.0 if denom == 0 else (previous_loss - loss) / denom


def gumbel_top_k(scores: np.ndarray, k: int, temperature: float, rng) -> np.ndarray:
    """k indices drawn without replacement with probabilities ∝ exp(score / T) (sequentially)."""
    g = rng.gumbel(size=len(scores))
    return np.argsort(-(np.asarray(scores, np.float64) / temperature + g))[:k]


class Uniform:
    needs_features = False

    def select(self, feats, k: int, rng) -> np.ndarray:
        return np.arange(k)

    def observe(self, loss: float, losses) -> None:
        pass


class SmallLoss:
    """The k candidates with the smallest current loss (ties broken at random)."""
    needs_features = True

    def select(self, stats, k: int, rng) -> np.ndarray:
        losses = np.asarray(stats["losses"], np.float64)
        order = np.lexsort((rng.random(len(losses)), losses))
        return order[:k]

    def observe(self, loss: float, losses) -> None:
        pass


def _mlp_init(key, sizes):
    params = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        k = jax.random.fold_in(key, i)
        params.append({"w": jax.random.normal(k, (a, b)) * jnp.sqrt(2.0 / a), "b": jnp.zeros(b)})
    return params


def _mlp(params, x):
    """Output (n,) and the last hidden activation (n, h)."""
    h = x
    for layer in params[:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    return (h @ params[-1]["w"] + params[-1]["b"])[:, 0], h


@functools.lru_cache(maxsize=None)
def _fns(lr: float):
    opt = optax.adam(lr)

    @jax.jit
    def score(p1, p2, x, explore):
        f1, grad_f1 = _mlp(p1, x)        # ∇_{W_out} f1 = last hidden activation
        f2, _ = _mlp(p2, grad_f1)
        return f1 + explore * f2, f1, grad_f1

    def mse(params, inputs, target):
        out, _ = _mlp(params, inputs)
        return jnp.mean((out - target) ** 2)

    @jax.jit
    def fit(p1, s1, p2, s2, x, g, y):
        l1, d1 = jax.value_and_grad(mse)(p1, x, y)
        u1, s1 = opt.update(d1, s1, p1)
        p1 = optax.apply_updates(p1, u1)
        f1, _ = _mlp(p1, x)
        l2, d2 = jax.value_and_grad(mse)(p2, g, y - f1)
        u2, s2 = opt.update(d2, s2, p2)
        return p1, s1, optax.apply_updates(p2, u2), s2, l1, l2

    return opt, score, fit


class SamS:
    """The bandit scheduler (module docstring). State: both networks, their Adam states, the pool
    and the pending (lagged) selection."""
    needs_features = True

    def __init__(self, *, hidden: int = 64, lr: float = 1e-3, updates: int = 4,
                 explore: float = 0.5, temperature: float = 0.05, batch_weight: float = 0.5,
                 seed: int = 0):
        d = len(FEATURES)
        key = jax.random.PRNGKey(seed)
        self.p1 = _mlp_init(jax.random.fold_in(key, 1), (d, hidden, hidden, 1))
        self.p2 = _mlp_init(jax.random.fold_in(key, 2), (hidden, hidden, 1))
        self.opt, self._score, self._fit = _fns(float(lr))
        self.s1, self.s2 = self.opt.init(self.p1), self.opt.init(self.p2)
        self.updates, self.explore, self.temperature = updates, explore, temperature
        self.batch_weight = batch_weight
        self.rng = np.random.default_rng(seed + 977)
        self.x = np.zeros((POOL, d), np.float32)
        self.g = np.zeros((POOL, hidden), np.float32)
        self.y = np.zeros(POOL, np.float32)
        self.filled = self.cursor = 0
        self.pending = None          # (x, grad_f1, margins) of the batch awaiting its reward
        self.previous_loss = None
        self.last_fit = (float("nan"), float("nan"))

    def scores(self, x: np.ndarray):
        u, f1, g = self._score(self.p1, self.p2, jnp.asarray(x), self.explore)
        return np.asarray(u), np.asarray(f1), np.asarray(g)

    def select(self, stats, k: int, rng) -> np.ndarray:
        x = features(stats)
        u, _, g = self.scores(x)
        if self.filled == 0:
            idx = rng.permutation(len(x))[:k]
        else:
            idx = gumbel_top_k(u, k, self.temperature, rng)
        self._selected = (x[idx], g[idx], np.asarray(stats["margins"])[idx])
        return idx

    def _push(self, x, g, y):
        for row in range(len(y)):
            self.x[self.cursor], self.g[self.cursor], self.y[self.cursor] = x[row], g[row], y[row]
            self.cursor = (self.cursor + 1) % POOL
            self.filled = min(self.filled + 1, POOL)

    def observe(self, loss: float, losses) -> None:
        """`loss`: this step's pre-update loss on its training batch. Rewards the previous batch
        (one-step lag), trains both networks, then makes this batch the pending one."""
        if self.pending is not None and self.previous_loss is not None:
            r = batch_progress(self.previous_loss, loss)
            x, g, m = self.pending
            self._push(x, g, arm_rewards(r, m, self.batch_weight))
            for _ in range(self.updates):
                rows = self.rng.integers(self.filled, size=MINIBATCH)
                (self.p1, self.s1, self.p2, self.s2, l1, l2) = self._fit(
                    self.p1, self.s1, self.p2, self.s2, jnp.asarray(self.x[rows]),
                    jnp.asarray(self.g[rows]), jnp.asarray(self.y[rows]))
            self.last_fit = (float(l1), float(l2)) if self.updates else self.last_fit
        self.pending, self.previous_loss = self._selected, float(loss)


def make_scheduler(cfg):
    """The scheduler a `DPOConfig` asks for."""
    if cfg.scheduler == "uniform":
        return Uniform()
    if cfg.scheduler == "small_loss":
        return SmallLoss()
    if cfg.scheduler == "sams":
        return SamS(hidden=cfg.sams_hidden, lr=cfg.sams_lr, updates=cfg.sams_updates,
                    explore=cfg.sams_explore, temperature=cfg.sams_temperature,
                    batch_weight=cfg.sams_batch_weight, seed=cfg.seed)
    raise ValueError(f"scheduler: {cfg.scheduler!r} is unknown; use one of {SCHEDULERS}")
