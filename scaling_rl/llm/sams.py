"""Batch schedulers for DPO: which `k` pairs of a candidate batch train this step.

    uniform      the candidate batch *is* the training batch (k pairs drawn uniformly; no scoring)
    small_loss   pre-selection baseline: the k candidates with the smallest current DPO loss
                 (the small-loss trick against label noise; no learning, no exploration)
    sams         SamS (Huang et al., NeurIPS 2025, arXiv 2506.17252): a contextual bandit over the
                 candidates, with an exploitation and an exploration network

SamS as built here, against the reference code (github:hzx122/SamS, `trainers_dist.py`,
`scheduler.py`, `bandit_utils.py`; read, not copied):

- arms and context: each candidate pair is an arm. Its context is the policy's hidden states
  (reference: `layer_encoder`): for every transformer layer the hidden state averaged over the
  pair's tokens, then averaged over the chosen and the rejected sequence -> an (L, d) "sequence
  over layers" per arm (`DPOTrainer.pair_stats(..., hidden=True)`; it comes out of the same no-grad
  policy forward that scores the candidates, so it costs no extra forward). No function of the
  margin or loss enters the context.
- exploitation network f1 = connector -> encoder -> MLP (reference
  `Residual_Network_exploitation_with_Encoder`): each layer token is standardised (parameter-free
  layer norm; hidden-state scales differ across layers), a 2-layer ReLU connector maps d -> h, a
  one-block transformer encoder (learned layer-position embeddings, single-head self-attention over
  the L layer tokens, ReLU MLP, pre-LN residuals) mixes the layers, the tokens are mean-pooled and
  L2-normalised, and a ReLU MLP (h -> h -> h -> 1) predicts the arm's reward. Deviation: the
  reference freezes a *pretrained* text encoder; none exists at this scale, so ours is trained
  with the rest of f1.
- exploration network f2 (MLP h -> h -> 1): input f1's last hidden activation (= ∇_{W_out} f1 for
  the linear output layer; the reference feeds block-averaged f1 hidden states), target the
  residual y - f1(x). Score u_i = f1(x_i) + `explore`·f2 (reference `f2_weight` 0.1).
- selection: k arms without replacement with probabilities ∝ exp(u_i / T) (Gumbel top-k, which
  equals sequential softmax sampling without replacement, as the reference's
  `np.random.choice(..., replace=False, p=softmax(scores))`), T = 1 as in the reference.
- reward (reference `get_observed_rewards` / `cacu_bandit_reward`, mode "add_rm_logp"), observed
  with a lag of one step: L_t = mean "sigmoid loss" σ(-m_i) of step t's whole candidate batch
  before the update (reference `use_sig_loss`; m = β·logits, the implicit-reward margin),
  r_t = L_t - L_{t+1} (reference default `norm_metrics: false`) the batch-level progress of
  training on step t's selection, measured on the fresh candidates of step t+1. (Normalising by
  max(L_t, L_{t+1}) on the log-sigmoid loss, as this module did before, made the batch term ~99%
  of the reward variance.) Every candidate arm i of step t (the
  reference's `use_all_samples`) gets

      y_i = λ·σ(50·r_t + 0.5) + (1-λ)·σ(s_i),   s_i = ½·mm(m)_i + ½·(1 - mm(π_c)_i)

  with mm the min-max normalisation over the candidate batch, m the implicit-reward margin and π_c
  the policy's chosen sequence log-prob: the per-arm term is normalised per batch, so its spread
  does not depend on the margins' scale. (The reference applies σ a second time to σ(s_i); that
  squeezes the per-arm term into [0.62, 0.68] and leaves ~all the target variance to the shared
  batch term, so we apply it once.) λ = 0.5.
- lagged update: each step's (x, f1 hidden, y) join a replay pool (4096 arms); after each observed
  reward both networks take `updates` Adam steps (default 2 = the reference's f1_num_batch x
  f1_num_epochs; one jitted scan) on random minibatches of the
  pool (f1 on y with MSE, f2 on y - f1). Until the first reward arrives the selection is uniform.

`SamS.stats` keeps per-step diagnostics (fit losses, the share of the reward variance that is the
batch term every arm of a step shares, the selection's largest / smallest probability ratio).
Networks and updates are JAX (optax), jitted once per shape.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

SCHEDULERS = ("uniform", "sams", "small_loss")
POOL = 4096
MINIBATCH = 256
REWARD_SCALE = 50.0      # reference `batch_reward_mapping`: 50·r + 0.5
REWARD_SHIFT = 0.5


def features(stats: dict) -> np.ndarray:
    """(n, L, d) float32 arm contexts: the policy's per-layer hidden states of each candidate pair
    (`DPOTrainer.pair_stats(..., hidden=True)` under the key "hidden")."""
    if "hidden" not in stats:
        raise ValueError("stats: no 'hidden' (per-layer policy hidden states); SamS needs "
                         "pair_stats(..., hidden=True)")
    x = np.asarray(stats["hidden"], np.float32)
    if x.ndim != 3:
        raise ValueError(f"stats['hidden']: shape {x.shape} is not (arms, layers, width)")
    return x


def minmax(v) -> np.ndarray:
    """(v - min) / (max - min) over the batch; all zeros when the batch is constant."""
    v = np.asarray(v, np.float64)
    span = v.max() - v.min() if len(v) else 0.0
    return np.zeros_like(v) if span == 0 else (v - v.min()) / span


def _sig(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, np.float64)))


def sample_terms(margins, chosen_logp) -> np.ndarray:
    """σ(s_i), s_i = ½·mm(margin)_i + ½·(1 - mm(chosen log-prob)_i): the per-arm reward term."""
    return _sig(0.5 * minmax(margins) + 0.5 * (1.0 - minmax(chosen_logp)))


def arm_rewards(batch_progress: float, margins, chosen_logp, weight: float) -> np.ndarray:
    """y_i = λ·σ(50·r + 0.5) + (1-λ)·σ(s_i) for the arms of one candidate batch (λ = `weight`)."""
    return (weight * _sig(REWARD_SCALE * batch_progress + REWARD_SHIFT)
            + (1 - weight) * sample_terms(margins, chosen_logp)).astype(np.float32)


def batch_progress(previous_loss: float, loss: float, normalise: bool = False) -> float:
    """L_t - L_{t+1}, or with `normalise` (L_t - L_{t+1}) / max(|L_t|, |L_{t+1}|) (0 when both 0)."""
    if not normalise:
        return previous_loss - loss
    denom = max(abs(previous_loss), abs(loss))
    return 0.0 if denom == 0 else (previous_loss - loss) / denom


def sig_loss(margins) -> float:
    """Mean σ(-m) over a batch: the reference's `sig_losses` (up to a constant), its batch metric."""
    return float(np.mean(_sig(-np.asarray(margins, np.float64))))


def gumbel_top_k(scores: np.ndarray, k: int, temperature: float, rng) -> np.ndarray:
    """k indices drawn without replacement with probabilities ∝ exp(score / T) (sequentially)."""
    g = rng.gumbel(size=len(scores))
    return np.argsort(-(np.asarray(scores, np.float64) / temperature + g))[:k]


class Uniform:
    needs_stats = needs_hidden = False

    def select(self, stats, k: int, rng) -> np.ndarray:
        return np.arange(k)

    def observe(self, loss: float, losses) -> None:
        pass


class SmallLoss:
    """The k candidates with the smallest current loss (ties broken at random)."""
    needs_stats, needs_hidden = True, False

    def select(self, stats, k: int, rng) -> np.ndarray:
        losses = np.asarray(stats["losses"], np.float64)
        order = np.lexsort((rng.random(len(losses)), losses))
        return order[:k]

    def observe(self, loss: float, losses) -> None:
        pass


# ---- the networks (pure JAX) ----------------------------------------------------------------------

def _dense(key, a, b):
    return {"w": jax.random.normal(key, (a, b)) * jnp.sqrt(2.0 / a), "b": jnp.zeros(b)}


def _ln(x, eps=1e-6):
    mu = jnp.mean(x, -1, keepdims=True)
    return (x - mu) / jnp.sqrt(jnp.var(x, -1, keepdims=True) + eps)


def init_f1(key, layers: int, width: int, hidden: int) -> dict:
    """Connector (width -> hidden -> hidden), one encoder block over the layer tokens, MLP head."""
    k = lambda i: jax.random.fold_in(key, i)  # noqa: E731
    h = hidden
    return {"conn": [_dense(k(0), width, h), _dense(k(1), h, h)],
            "pos": jax.random.normal(k(2), (layers, h)) * 0.02,
            "attn": {n: _dense(k(3 + i), h, h) for i, n in enumerate("qkvo")},
            "mlp": [_dense(k(7), h, 2 * h), _dense(k(8), 2 * h, h)],
            "head": [_dense(k(9), h, h), _dense(k(10), h, h), _dense(k(11), h, 1)]}


def encode(p1: dict, x):
    """(n, L, d) hidden states -> (n, h) L2-normalised context encoding (connector + encoder)."""
    lin = lambda layer, z: z @ layer["w"] + layer["b"]  # noqa: E731
    z = _ln(x)
    for layer in p1["conn"]:
        z = jax.nn.relu(lin(layer, z))
    z = z + p1["pos"]
    a = _ln(z)
    q, k, v = (lin(p1["attn"][n], a) for n in "qkv")
    w = jax.nn.softmax(jnp.einsum("nld,nmd->nlm", q, k) / jnp.sqrt(q.shape[-1]), axis=-1)
    z = z + lin(p1["attn"]["o"], jnp.einsum("nlm,nmd->nld", w, v))
    z = z + lin(p1["mlp"][1], jax.nn.relu(lin(p1["mlp"][0], _ln(z))))
    e = jnp.mean(z, axis=1)
    return e / jnp.maximum(jnp.linalg.norm(e, axis=-1, keepdims=True), 1e-6)


def _mlp(params, x):
    """Output (n,) and the last hidden activation (n, h)."""
    h = x
    for layer in params[:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    return (h @ params[-1]["w"] + params[-1]["b"])[:, 0], h


def f1_forward(p1, x):
    """f1(x) (n,) and its last hidden activation (n, h) (= ∇_{W_out} f1, the input of f2)."""
    return _mlp(p1["head"], encode(p1, x))


@functools.lru_cache(maxsize=None)
def _fns(lr: float):
    opt = optax.adam(lr)

    @jax.jit
    def score(p1, p2, x, explore):
        f1, grad_f1 = f1_forward(p1, x)
        f2, _ = _mlp(p2, grad_f1)
        return f1 + explore * f2, f1, grad_f1

    def mse1(p1, x, y):
        return jnp.mean((f1_forward(p1, x)[0] - y) ** 2)

    def mse2(p2, g, target):
        return jnp.mean((_mlp(p2, g)[0] - target) ** 2)

    @jax.jit
    def fit(p1, s1, p2, s2, xs, gs, ys):
        """len(xs) Adam steps of both networks, one per minibatch (a scan)."""
        def one(carry, batch):
            p1, s1, p2, s2 = carry
            x, g, y = batch
            l1, d1 = jax.value_and_grad(mse1)(p1, x, y)
            u1, s1 = opt.update(d1, s1, p1)
            p1 = optax.apply_updates(p1, u1)
            f1, _ = f1_forward(p1, x)
            l2, d2 = jax.value_and_grad(mse2)(p2, g, y - f1)
            u2, s2 = opt.update(d2, s2, p2)
            return (p1, s1, optax.apply_updates(p2, u2), s2), (l1, l2)
        (p1, s1, p2, s2), (l1, l2) = jax.lax.scan(one, (p1, s1, p2, s2), (xs, gs, ys))
        return p1, s1, p2, s2, l1[-1], l2[-1]

    return opt, score, fit


class SamS:
    """The bandit scheduler (module docstring). State: both networks, their Adam states, the pool
    and the pending (lagged) candidate batch. Networks are built on the first `select` (their input
    shape is the policy's (layers, width))."""
    needs_stats = needs_hidden = True

    def __init__(self, *, hidden: int = 64, lr: float = 1e-3, updates: int = 2,
                 explore: float = 0.1, temperature: float = 1.0, batch_weight: float = 0.5,
                 seed: int = 0):
        if temperature <= 0:
            raise ValueError(f"temperature: {temperature!r} must be > 0")
        if not 0.0 <= batch_weight <= 1.0:
            raise ValueError(f"batch_weight: {batch_weight!r} is outside [0, 1]")
        self.hidden, self.seed = int(hidden), int(seed)
        self.opt, self._score, self._fit = _fns(float(lr))
        self.updates, self.explore, self.temperature = int(updates), float(explore), float(temperature)
        self.batch_weight = float(batch_weight)
        self.rng = np.random.default_rng(seed + 977)
        self.p1 = self.p2 = None
        self.filled = self.cursor = 0
        self.pending = None          # (x, f1 hidden, margins, chosen log-probs, mean loss)
        self.last_fit = (float("nan"), float("nan"))
        self.stats: list[dict] = []

    def _build(self, layers: int, width: int) -> None:
        key = jax.random.PRNGKey(self.seed)
        self.p1 = init_f1(jax.random.fold_in(key, 1), layers, width, self.hidden)
        self.p2 = [_dense(jax.random.fold_in(key, 20 + i), a, b)
                   for i, (a, b) in enumerate(((self.hidden, self.hidden), (self.hidden, 1)))]
        self.s1, self.s2 = self.opt.init(self.p1), self.opt.init(self.p2)
        self.x = np.zeros((POOL, layers, width), np.float32)
        self.g = np.zeros((POOL, self.hidden), np.float32)
        self.y = np.zeros(POOL, np.float32)
        self.step_of = np.zeros(POOL, np.int64)

    def scores(self, x: np.ndarray):
        """(u, f1, f1 hidden) of the arms x (n, L, d)."""
        u, f1, g = self._score(self.p1, self.p2, jnp.asarray(x), self.explore)
        return np.asarray(u), np.asarray(f1), np.asarray(g)

    def _push(self, x, g, y, step):
        n = len(y)
        rows = (self.cursor + np.arange(n)) % POOL
        self.x[rows], self.g[rows], self.y[rows], self.step_of[rows] = x, g, y, step
        self.cursor = int((self.cursor + n) % POOL)
        self.filled = min(self.filled + n, POOL)

    def reward_batch_share(self) -> float:
        """Share of the pool's reward variance that is between steps (the batch term all arms of a
        step share): var of the per-step means / total var."""
        y, s = self.y[:self.filled].astype(np.float64), self.step_of[:self.filled]
        if self.filled < 2 or y.var() == 0:
            return float("nan")
        _, inv = np.unique(s, return_inverse=True)
        means = np.bincount(inv, y) / np.bincount(inv)
        return float(means[inv].var() / y.var())

    def _learn(self, loss_now: float) -> None:
        x, g, m, pc, loss_then = self.pending
        r = batch_progress(loss_then, loss_now)
        self._push(x, g, arm_rewards(r, m, pc, self.batch_weight), len(self.stats))
        if self.updates:
            rows = self.rng.integers(self.filled, size=(self.updates, MINIBATCH))
            (self.p1, self.s1, self.p2, self.s2, l1, l2) = self._fit(
                self.p1, self.s1, self.p2, self.s2, jnp.asarray(self.x[rows]),
                jnp.asarray(self.g[rows]), jnp.asarray(self.y[rows]))
            self.last_fit = (float(l1), float(l2))

    def select(self, stats, k: int, rng) -> np.ndarray:
        """Reward the pending batch with this batch's mean loss (the lag), fit, then pick k arms."""
        x = features(stats)
        metric = sig_loss(stats["margins"])
        if self.p1 is None:
            self._build(x.shape[1], x.shape[2])
        learned = self.pending is not None
        if learned:
            self._learn(metric)
        u, _, g = self.scores(x)
        if not learned:
            idx = rng.permutation(len(x))[:k]
        else:
            idx = gumbel_top_k(u, k, self.temperature, rng)
        z = (u - u.max()) / self.temperature
        self.stats.append({"f1_loss": self.last_fit[0], "f2_loss": self.last_fit[1],
                           "prob_ratio": float(np.exp(z.max() - z.min())) if learned else 1.0})
        self.pending = (x, g, np.asarray(stats["margins"]), np.asarray(stats["chosen_seq_logp"]),
                        metric)
        return idx

    def observe(self, loss: float, losses) -> None:
        """Nothing: the reward of a batch needs the next candidate batch's loss (see `select`)."""


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
