"""Contrastive RL (CRL) with deep residual encoders (Eysenbach et al. 2022; Wang et al. 2025).

The critic is a similarity between a state-action representation φ(s, a) and a goal representation
ψ(g), both from the CRL residual backbone (Dense -> LN -> swish, blocks of 4 with a skip, scanned over
depth) and a linear head to `repr_dim`. It is trained with InfoNCE on hindsight-relabelled batches:
row i pairs (s_i, a_i) with a future state g_i of the same episode (goal_replay, P ∝ γ^k), and the
other goals of the batch are negatives. Q(s, a, g) = energy(φ(s, a), ψ(g)) then ranks actions by how
likely they reach g. The actor maximises Q(s, π(s, g), g) with SAC-style automatic entropy tuning
(target entropy −`target_entropy_scale`·|A|). No target networks; Adam.

    cfg = crl.Config(env="point_maze/u_maze", depth=16)
    agent = crl.make(cfg)                   # init / chunk / evaluate / num_chunks / param_count
    out = jax.jit(crl.make_train(cfg))(key)  # the whole run as one program

Loop (inside one jitted `chunk`): the update ratio σ = `utd` gradient steps per env step is exact:
σ·num_envs = U/P in lowest terms, one period = P vectorised env steps then U gradient steps (the
paper: 512 envs, σ = 1/40 -> P = 5, U = 64). Warm-up (`learning_starts` env steps of uniform random
actions) runs in `init`, so every chunk learns (no per-update `cond` under the seed vmap).

Metrics per chunk: `time_at_goal` (mean over finished episodes of the number of steps at the goal),
`success_any` (fraction of finished episodes that touched the goal), `episode_return`, `loss/critic`,
`loss/actor`, `loss/alpha`, `alpha`, `entropy`, `accuracy` (categorical accuracy of the InfoNCE
logits: argmax over goals == the positive), `logits/pos`, `logits/neg`, `logits/std`, `logsumexp`,
`q_mean`, `param_norm`, `env_steps`, `grad_steps`. `evaluate` runs `eval_episodes` fresh envs for one
episode with the deterministic policy: `eval_time_at_goal`, `eval_success_any`, `eval_return`.

Data parallel (`data_parallel=True` or `make(cfg, mesh=...)`): the gradient is shard_map'd over the
mesh axis `data` (`parallel.data_parallel_value_and_grad`). InfoNCE then uses each shard's B/n rows
as negatives (as per-device batches do in the paper's multi-GPU runs); the actor/entropy terms are
exact means over the global batch. With `global_negatives=True` the representations are all-gathered
over `data` and every row is contrasted with the B goals of the global batch (each device computes its
B/n rows of the B x B logits, and its B/n goals' columns for the backward term): the data-parallel
update is then the 1-device update up to float summation order, so the contrastive batch size is a
knob that devices scale (tests/test_multiprocess.py). Without a mesh the flag changes nothing.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from scaling_rl import acco
from scaling_rl import envs as envs_lib
from scaling_rl import goal_replay
from scaling_rl import nets
from scaling_rl import parallel
from scaling_rl import zero
from scaling_rl.agents import common

ENERGIES = ("l2", "l2_squared", "dot", "cosine")
CONTRASTIVE_LOSSES = ("forward", "backward", "symmetric")
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _round_up(x: int, m: int) -> int:
    return max(m, -(-x // m) * m)


def _depth_hint(d: int) -> str:
    lo = max(4, d // 4 * 4)
    return f"{lo}" if lo == d or d < 4 else f"{lo} or {lo + 4}"


@dataclasses.dataclass(frozen=True)
class Config:
    """CRL hyper-parameters. Env-step units count single env transitions (a vectorised step of
    num_envs envs = num_envs env steps); `utd` = gradient steps per env step (may be < 1)."""

    env: str = "point_maze/u_maze"
    episode_length: int = 0           # 0: the env's own max_episode_steps
    num_envs: int = 64
    env_steps: int = 200_000          # total per seed, including the warm-up
    learning_starts: int = 2_048      # env steps of uniform random actions (in init)
    chunk_env_steps: int = 8_192      # env steps per jitted host chunk
    utd: float = 0.0625               # σ: gradient steps per env step (paper ≈ 1/40 with 512 envs)
    batch_size: int = 256
    lr: float = 3e-4
    width: int = 256                  # critic encoders φ and ψ
    depth: int = 4                    # Dense layers in the residual blocks (multiple of 4; paper 4..1024)
    actor_width: int = 256
    actor_depth: int = 4
    repr_dim: int = 64
    energy: str = "l2"                # l2 (paper: −‖φ−ψ‖₂) | l2_squared | dot | cosine
    contrastive_loss: str = "forward"  # InfoNCE forward | backward | symmetric
    logsumexp_penalty: float = 0.1
    cosine_temperature: float = 0.1   # logits = cos / temperature for energy="cosine"
    gamma: float = 0.99               # future-goal sampling: P(j) ∝ γ^(j−i)
    target_entropy_scale: float = 0.5  # target entropy = −scale·|A|
    buffer_size: int = 1_000_000      # env transitions kept (rows of num_envs)
    scan: bool = True                 # scan the depth stack (compile time flat in depth)
    remat: bool = False
    compute_dtype: str = "float32"    # backbone matmuls: float32 | bfloat16
    eval_episodes: int = 32
    data_parallel: bool = False
    zero_optimizer: bool = False      # ZeRO-1: Adam moments sharded over the data mesh (scaling_rl/zero.py)
    acco: str = "off"                 # on ZeRO-1: off | ddp | dpu | acco (scaling_rl/acco.py learner_update)
    global_negatives: bool = False    # data parallel: InfoNCE negatives from the global batch (all-gather)
    # host-driven updates on acco.OverlappedAcco (docs/acco.md): separate per-device compute and
    # communication programs, the communication overlapped with the next micro-batches, micro-batch
    # counts decided at run time. acco=acco: ACCO; zero_optimizer and acco off|ddp: ZeRO-1; else DDP
    overlap: bool = False
    overlap_micro: int = 2            # micro-batches per device and update (the batch splits into n x this)
    overlap_max_micro: int = 0        # ACCO: at most this many per device and round (0: no cap)
    overlap_slowdown: float = 1.0     # the mesh's last device computes this many times slower (a straggler)
    overlap_latency_ms: float = 0.0   # simulated link latency added to each communication round

    def __post_init__(self):
        for key in ("num_envs", "env_steps", "chunk_env_steps", "batch_size", "width", "depth",
                    "actor_width", "actor_depth", "repr_dim", "buffer_size", "eval_episodes"):
            v = getattr(self, key)
            if not _is_int(v) or v < 1:
                raise ValueError(f"{key}: must be an integer >= 1, got {v!r}; e.g. {getattr(Config, key)}")
        for key in ("learning_starts", "episode_length"):
            v = getattr(self, key)
            if not _is_int(v) or v < 0:
                raise ValueError(f"{key}: must be an integer >= 0, got {v!r}; e.g. {getattr(Config, key)}")
        for key in ("utd", "lr", "logsumexp_penalty", "gamma", "target_entropy_scale", "cosine_temperature"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"{key}: must be a finite number, got {v!r}; e.g. {getattr(Config, key)}")
        for key in ("depth", "actor_depth"):
            v = getattr(self, key)
            if v % 4:
                raise ValueError(f"{key}: counts Dense layers of CRL blocks (4 per block), got {v}; "
                                 f"use {_depth_hint(v)}")
        acco.check_learner_mode(self.acco, self.zero_optimizer)
        self._check_overlap()
        if self.energy not in ENERGIES:
            raise ValueError(f"energy: unknown {self.energy!r}; use one of {', '.join(ENERGIES)}")
        if self.contrastive_loss not in CONTRASTIVE_LOSSES:
            raise ValueError(f"contrastive_loss: unknown {self.contrastive_loss!r}; "
                             f"use one of {', '.join(CONTRASTIVE_LOSSES)}")
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}; e.g. 3e-4")
        if not 0 < self.gamma < 1:
            raise ValueError(f"gamma: must be in (0, 1), got {self.gamma}; e.g. 0.99")
        if self.logsumexp_penalty < 0:
            raise ValueError(f"logsumexp_penalty: must be >= 0, got {self.logsumexp_penalty}; e.g. 0.1")
        if not self.cosine_temperature > 0:
            raise ValueError(f"cosine_temperature: must be > 0, got {self.cosine_temperature}; e.g. 0.1")
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"compute_dtype: unknown {self.compute_dtype!r}; use 'float32' or 'bfloat16'")
        if self.batch_size < 2:
            raise ValueError(f"batch_size: {self.batch_size} leaves no negatives for InfoNCE; use >= 2, e.g. 256")
        common.utd_fraction(self.utd)       # one-line error for unrepresentable σ
        sched = common.utd_schedule(self.utd, self.num_envs)
        period = sched.vector_steps * self.num_envs
        if self.chunk_env_steps % period:
            raise ValueError(f"chunk_env_steps: {self.chunk_env_steps} is not a multiple of the update "
                             f"period ({period} env steps for utd={self.utd}, num_envs={self.num_envs}); "
                             f"use {_round_up(self.chunk_env_steps, period)}")
        if self.learning_starts % self.num_envs:
            raise ValueError(f"learning_starts: {self.learning_starts} is not a multiple of num_envs="
                             f"{self.num_envs}; use {_round_up(self.learning_starts, self.num_envs)}")
        if self.buffer_size % self.num_envs:
            raise ValueError(f"buffer_size: {self.buffer_size} is not a multiple of num_envs={self.num_envs}"
                             f" (the buffer keeps whole vectorised steps); use "
                             f"{_round_up(self.buffer_size, self.num_envs)}")
        if self.buffer_size // self.num_envs < 2:
            raise ValueError(f"buffer_size: {self.buffer_size} holds < 2 steps per env; use "
                             f"{2 * self.num_envs} or more")
        if self.learning_starts < self.num_envs:
            raise ValueError(f"learning_starts: {self.learning_starts} leaves the buffer empty at the first "
                             f"update; use at least num_envs={self.num_envs}")
        if self.env_steps < self.learning_starts + self.chunk_env_steps:
            raise ValueError(f"env_steps: {self.env_steps} leaves no learning chunk after "
                             f"{self.learning_starts} warm-up env steps; use at least "
                             f"{self.learning_starts + self.chunk_env_steps}")
        if self.data_parallel and self.batch_size % jax.device_count():
            n = jax.device_count()
            raise ValueError(f"batch_size: {self.batch_size} does not split over {n} devices for "
                             f"data_parallel; use {_round_up(self.batch_size, n)}")

    @property
    def num_chunks(self) -> int:
        """Chunks after the warm-up; the last may overshoot env_steps by < chunk_env_steps."""
        return math.ceil((self.env_steps - self.learning_starts) / self.chunk_env_steps)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """Build from a plain dict (e.g. parsed JSON); unknown keys are a one-line error."""
        return common.config_from_dict(cls, d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def _check_overlap(self) -> None:
        """The `overlap*` fields: one-line ValueErrors (the mesh-dependent checks are in `make`)."""
        if not isinstance(self.overlap, bool):
            raise ValueError(f"overlap: must be true or false, got {self.overlap!r}")
        for key in ("overlap_micro", "overlap_max_micro"):
            v = getattr(self, key)
            if not _is_int(v) or v < (1 if key == "overlap_micro" else 0):
                raise ValueError(f"{key}: must be an integer >= {1 if key == 'overlap_micro' else 0}, got {v!r}")
        for key, low in (("overlap_slowdown", 1.0), ("overlap_latency_ms", 0.0)):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < low:
                raise ValueError(f"{key}: must be a finite number >= {low:g}, got {v!r}")
        if not self.overlap:
            return
        if self.acco == "dpu":
            raise ValueError("overlap: acco='dpu' runs only inside the jitted chunk; use acco=acco, ddp or off")
        if self.global_negatives:
            raise ValueError("overlap: each device's micro-batches are computed on their own (no all-gather); "
                             "set global_negatives=false")


def encoder_backbone(cfg: Config) -> nets.BackboneConfig:
    return nets.BackboneConfig(kind="crl", width=cfg.width, depth=cfg.depth, scan=cfg.scan,
                               remat=cfg.remat, compute_dtype=cfg.compute_dtype)


def actor_backbone(cfg: Config) -> nets.BackboneConfig:
    return nets.BackboneConfig(kind="crl", width=cfg.actor_width, depth=cfg.actor_depth, scan=cfg.scan,
                               remat=cfg.remat, compute_dtype=cfg.compute_dtype)


# --------------------------------------------------------------------------------------------------
# Networks and losses
# --------------------------------------------------------------------------------------------------


class Encoder(nn.Module):
    """x -> CRL residual backbone -> Dense(repr_dim): φ(s, a) or ψ(g)."""

    backbone: nets.BackboneConfig
    repr_dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nets.Backbone(self.backbone, name="backbone")(x)
        return nn.Dense(self.repr_dim, name="head")(h)


class Actor(nn.Module):
    """π(·|s, g): backbone over concat(state, goal), Gaussian mean and bounded log-std (tanh-squashed)."""

    backbone: nets.BackboneConfig
    action_dim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = nets.Backbone(self.backbone, name="backbone")(obs)
        mean, raw = jnp.split(nn.Dense(2 * self.action_dim, name="head")(h), 2, axis=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(raw) + 1.0)
        return mean, log_std


def tanh_gaussian(mean, log_std, noise):
    """a = tanh(mean + std·noise) and log π(a) (change of variables, stable log(1 − tanh²))."""
    u = mean + jnp.exp(log_std) * noise
    log_normal = -0.5 * jnp.square(noise) - 0.5 * math.log(2 * math.pi) - log_std
    log_det = 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), jnp.sum(log_normal - log_det, axis=-1)


def energy_matrix(phi: jax.Array, psi: jax.Array, kind: str, temperature: float = 0.1) -> jax.Array:
    """logits[i, j] = energy(φ_i, ψ_j) for (B, R) x (B', R) -> (B, B')."""
    if kind in ("l2", "l2_squared"):
        sq = (jnp.sum(phi ** 2, -1)[:, None] + jnp.sum(psi ** 2, -1)[None, :] - 2.0 * phi @ psi.T)
        sq = jnp.maximum(sq, 0.0)
        return -sq if kind == "l2_squared" else -jnp.sqrt(sq + 1e-12)
    if kind == "dot":
        return phi @ psi.T
    if kind == "cosine":
        n = lambda x: x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-8)  # noqa: E731
        return n(phi) @ n(psi).T / temperature
    raise ValueError(f"energy: unknown {kind!r}; use one of {', '.join(ENERGIES)}")


def energy_pairs(phi: jax.Array, psi: jax.Array, kind: str, temperature: float = 0.1) -> jax.Array:
    """energy(φ_i, ψ_i) row by row -> (B,); the diagonal of `energy_matrix`."""
    if kind == "l2":
        return -jnp.sqrt(jnp.sum((phi - psi) ** 2, -1) + 1e-12)
    if kind == "l2_squared":
        return -jnp.sum((phi - psi) ** 2, -1)
    if kind == "dot":
        return jnp.sum(phi * psi, -1)
    if kind == "cosine":
        n = lambda x: x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-8)  # noqa: E731
        return jnp.sum(n(phi) * n(psi), -1) / temperature
    raise ValueError(f"energy: unknown {kind!r}; use one of {', '.join(ENERGIES)}")


def infonce_loss(logits: jax.Array, kind: str, logsumexp_penalty: float, *, logits_t: jax.Array | None = None,
                 offset: jax.Array | int = 0, axis: str | None = None) -> tuple[jax.Array, dict]:
    """InfoNCE with positives on the diagonal: forward = softmax over goals (rows), backward = over
    state-actions (columns), symmetric = their mean; plus penalty·mean(logsumexp_rows²).

    Row block (`global_negatives`, inside shard_map over `axis`): `logits` holds this device's b
    state-actions against the B goals of the global batch, the positive of row i at column offset + i;
    `logits_t` (needed for backward / symmetric) its b goals against the B state-actions, i.e. its
    columns as rows (every energy here is symmetric). Loss and stats are then this device's means, which
    the caller's pmean makes those of the global batch (`logits/std` is made global here)."""
    if kind not in CONTRASTIVE_LOSSES:
        raise ValueError(f"contrastive_loss: unknown {kind!r}; use one of {', '.join(CONTRASTIVE_LOSSES)}")
    b, n = logits.shape
    diag = logits[jnp.arange(b), offset + jnp.arange(b)]
    lse_rows = jax.nn.logsumexp(logits, axis=1)
    forward = jnp.mean(lse_rows - diag)
    if kind == "forward":
        loss = forward
    else:
        lse_cols = jax.nn.logsumexp(logits, axis=0) if logits_t is None else jax.nn.logsumexp(logits_t, axis=1)
        backward = jnp.mean(lse_cols - diag)
        loss = backward if kind == "backward" else 0.5 * (forward + backward)
    loss = loss + logsumexp_penalty * jnp.mean(lse_rows ** 2)
    if axis is None:
        std = jnp.std(logits)
    else:  # over the whole B x B matrix: from the global first and second moments
        m1, m2 = jax.lax.pmean((jnp.mean(logits), jnp.mean(logits ** 2)), axis)
        std = jnp.sqrt(jnp.maximum(m2 - m1 ** 2, 0.0))
    off = (jnp.sum(logits) - jnp.sum(diag)) / (b * (n - 1))
    stats = {"accuracy": jnp.mean(jnp.argmax(logits, axis=1) == offset + jnp.arange(b)),
             "logits/pos": jnp.mean(diag), "logits/neg": off, "logits/std": std,
             "logsumexp": jnp.mean(lse_rows)}
    return loss, stats


def contrastive_loss(phi: jax.Array, psi: jax.Array, cfg: Config, axis: str | None = None
                     ) -> tuple[jax.Array, dict]:
    """The critic's InfoNCE of φ(s, a) against ψ(g) (row i's positive is goal i) under `cfg`'s energy
    and loss. With `axis` (`global_negatives`: called per device inside shard_map over that axis) φ and
    ψ are all-gathered, so this device's rows meet the B goals of the global batch; the gradient flows
    back through the all-gather (its transpose, a reduce-scatter, returns every device's share of the
    cotangent), and the pmean of the per-device gradients is the gradient of the global-batch loss."""
    def gather(x):
        return jax.lax.all_gather(x, axis, tiled=True) if axis else x

    logits = energy_matrix(phi, gather(psi), cfg.energy, cfg.cosine_temperature)
    logits_t = (energy_matrix(psi, gather(phi), cfg.energy, cfg.cosine_temperature)
                if axis and cfg.contrastive_loss != "forward" else None)
    offset = jax.lax.axis_index(axis) * phi.shape[0] if axis else 0
    return infonce_loss(logits, cfg.contrastive_loss, cfg.logsumexp_penalty, logits_t=logits_t,
                        offset=offset, axis=axis)


# --------------------------------------------------------------------------------------------------
# Agent
# --------------------------------------------------------------------------------------------------


@flax.struct.dataclass
class Learner:
    params: dict          # {"sa": φ params, "g": ψ params, "actor": π params, "log_alpha": ()}
    opt_state: Any


@flax.struct.dataclass
class TrainState:
    learner: Learner
    env_state: Any
    obs: jax.Array
    buffer: goal_replay.TrajectoryBuffer
    rng: jax.Array
    env_steps: jax.Array      # int32
    grad_steps: jax.Array     # int32
    chunk: jax.Array          # int32
    ep_at_goal: jax.Array     # (E,) steps at goal in each env's current episode
    ep_any: jax.Array         # (E,) bool: touched the goal in the current episode


def overlap_mode(cfg: Config) -> str:
    """acco.OverlappedAcco's mode for an `overlap=true` config: acco, zero1 (ZeRO-1, acco off or ddp) or ddp."""
    if cfg.acco == "acco":
        return "acco"
    return "zero1" if cfg.zero_optimizer else "ddp"


def _goal_env(cfg: Config, num_envs: int):
    kw = {"max_episode_steps": cfg.episode_length} if cfg.episode_length else {}
    env = envs_lib.make(cfg.env, num_envs=num_envs, **kw)
    if not hasattr(env, "goal_spec"):
        goal_envs = [n for n in envs_lib.known() if n.startswith(("point_maze/", "goal/"))]
        raise ValueError(f"env: {cfg.env!r} is not goal-conditioned (no goal_spec); use one of "
                         f"{', '.join(goal_envs)}")
    if env.spec.discrete:
        raise ValueError(f"env: {cfg.env!r} has discrete actions; CRL here needs continuous actions")
    return env


def _success(env, ts) -> jax.Array:
    info = getattr(ts, "info", None) or {}
    return info["success"] if "success" in info else env.goal_spec.success(ts.next_obs)


def make(cfg: Config, mesh=None, *, encoder_cls=None, actor_cls=None) -> common.Agent:
    """Build the CRL agent (contract in docs/architecture.md); `mesh`/`data_parallel` shards updates.

    `encoder_cls(backbone_config, repr_dim)` / `actor_cls(backbone_config, action_dim)` swap in other
    linen modules with the same call signature (benchmarks/crl_throughput.py passes the unrolled
    reference networks); default `Encoder` / `Actor`.
    """
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg: expected crl.Config, got {type(cfg).__name__}; use crl.Config(...)")
    mesh = parallel.resolve_mesh(mesh, cfg.data_parallel, cfg.batch_size)
    env = _goal_env(cfg, cfg.num_envs)
    eval_env = _goal_env(cfg, cfg.eval_episodes)
    spec, gs = env.spec, env.goal_spec
    s_dim, g_dim, a_dim = gs.state_dim, gs.goal_dim, spec.action_dim
    goal_idx = jnp.asarray(gs.goal_indices)
    rows = cfg.buffer_size // cfg.num_envs
    sched = common.utd_schedule(cfg.utd, cfg.num_envs)
    periods_per_chunk = cfg.chunk_env_steps // (sched.vector_steps * cfg.num_envs)
    warmup_vector_steps = cfg.learning_starts // cfg.num_envs
    target_entropy = -cfg.target_entropy_scale * a_dim

    encoder_cls, actor_cls = encoder_cls or Encoder, actor_cls or Actor
    sa_net = encoder_cls(encoder_backbone(cfg), cfg.repr_dim)
    g_net = encoder_cls(encoder_backbone(cfg), cfg.repr_dim)
    actor_net = actor_cls(actor_backbone(cfg), a_dim)
    optimizer = common.make_adam(cfg.lr)  # lr in the optimiser state: packable per seed
    example_step = {"state": jnp.zeros((s_dim,)), "action": jnp.zeros((a_dim,)), "achieved": jnp.zeros((g_dim,))}

    def init_params(key):
        k_sa, k_g, k_pi = jax.random.split(key, 3)
        return {"sa": sa_net.init(k_sa, jnp.zeros((1, s_dim + a_dim)))["params"],
                "g": g_net.init(k_g, jnp.zeros((1, g_dim)))["params"],
                "actor": actor_net.init(k_pi, jnp.zeros((1, s_dim + g_dim)))["params"],
                "log_alpha": jnp.zeros((), jnp.float32)}

    shapes = jax.eval_shape(init_params, jax.random.PRNGKey(0))
    encoder_params = nets.param_count(shapes["sa"]) + nets.param_count(shapes["g"])

    def policy(actor_params, obs, noise):
        mean, log_std = actor_net.apply({"params": actor_params}, obs)
        return tanh_gaussian(mean, log_std, noise)

    gather_axis = parallel.DATA_AXIS if cfg.global_negatives and mesh is not None else None

    def loss_fn(params, batch, _extra):
        s, a, g = batch["state"], batch["action"], batch["goal"]
        phi = sa_net.apply({"params": params["sa"]}, jnp.concatenate([s, a], -1))
        psi = g_net.apply({"params": params["g"]}, g)
        critic_loss, stats = contrastive_loss(phi, psi, cfg, gather_axis)
        # actor: the critic is held fixed (its gradient comes from InfoNCE only)
        # (ψ(g) is the critic's own forward pass, reused without its gradient)
        pi_a, logp = policy(params["actor"], jnp.concatenate([s, g], -1), batch["noise"])
        phi_pi = sa_net.apply({"params": jax.lax.stop_gradient(params["sa"])}, jnp.concatenate([s, pi_a], -1))
        q = energy_pairs(phi_pi, jax.lax.stop_gradient(psi), cfg.energy, cfg.cosine_temperature)
        alpha = jnp.exp(jax.lax.stop_gradient(params["log_alpha"]))
        actor_loss = jnp.mean(alpha * logp - q)
        alpha_loss = -jnp.mean(params["log_alpha"] * jax.lax.stop_gradient(logp + target_entropy))
        aux = {"loss/critic": critic_loss, "loss/actor": actor_loss, "loss/alpha": alpha_loss,
               "alpha": alpha, "entropy": -jnp.mean(logp), "q_mean": jnp.mean(q), **stats}
        return critic_loss + actor_loss + alpha_loss, aux

    value_and_grad = parallel.data_parallel_value_and_grad(loss_fn, mesh)
    if cfg.zero_optimizer and mesh is None:
        raise ValueError("zero_optimizer: needs a data mesh; set data_parallel=True or pass mesh=")
    sharded = zero.ShardedOptimizer(optimizer, parallel.mesh_size(mesh)) if cfg.zero_optimizer else None
    zero_step = zero.zero_update(loss_fn, sharded, mesh) if sharded else None
    acco_step = acco.learner_update(loss_fn, sharded, mesh, cfg.acco) if cfg.acco != "off" else None

    def opt_init(params):
        if acco_step:  # the sharded state and the gradients waiting for the next update
            return {"opt": sharded.init(params), "pending": acco.pending_init(params, sharded.n)}
        return sharded.init(params) if sharded else optimizer.init(params)

    def update(learner: Learner, batch: dict, key: jax.Array) -> tuple[Learner, dict]:
        """One gradient step on a relabelled batch {state, action, goal[, noise]} (noise: the actor's
        reparameterisation noise, drawn from `key` unless given, so results do not depend on sharding)."""
        if "noise" not in batch:
            batch = {**batch, "noise": jax.random.normal(key, (batch["state"].shape[0], a_dim))}
        if acco_step:
            s = learner.opt_state
            params, opt_state, pending, _, aux = acco_step(learner.params, s["opt"], s["pending"], batch, None)
            return Learner(params, {"opt": opt_state, "pending": pending}), aux
        if sharded:
            params, opt_state, _, aux = zero_step(learner.params, learner.opt_state, batch, None)
            return Learner(params, opt_state), aux
        (_, aux), grads = value_and_grad(learner.params, batch, None)
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        return Learner(optax.apply_updates(learner.params, updates), opt_state), aux

    def sample_batch(buf, key):
        now, fut, _ = goal_replay.sample(buf, key, cfg.batch_size, cfg.gamma)
        return {"state": now["state"], "action": now["action"], "goal": fut["achieved"]}

    def env_step(state: TrainState, action):
        env_state, ts = env.step(state.env_state, action)
        step = {"state": state.obs[:, :s_dim], "action": action,
                "achieved": ts.next_obs[:, :s_dim][:, goal_idx]}
        buf = goal_replay.add(state.buffer, step, ts.done)
        success = _success(env, ts)
        at_goal = state.ep_at_goal + success.astype(jnp.float32)
        any_ = state.ep_any | success
        done = ts.done
        stats = (jnp.sum(jnp.where(done, at_goal, 0.0)), jnp.sum(jnp.where(done, any_, False)),
                 jnp.sum(jnp.where(done, ts.episode_return, 0.0)), jnp.sum(done))
        state = state.replace(env_state=env_state, obs=ts.obs, buffer=buf,
                              env_steps=state.env_steps + cfg.num_envs,
                              ep_at_goal=jnp.where(done, 0.0, at_goal), ep_any=jnp.where(done, False, any_))
        return state, stats

    def random_step(state: TrainState, _):
        rng, k = jax.random.split(state.rng)
        action = jax.random.uniform(k, (cfg.num_envs, a_dim), minval=-1.0, maxval=1.0)
        return env_step(state.replace(rng=rng), action)

    def policy_step(state: TrainState, _):
        rng, k = jax.random.split(state.rng)
        noise = jax.random.normal(k, (cfg.num_envs, a_dim))
        action, _ = policy(state.learner.params["actor"], state.obs, noise)
        return env_step(state.replace(rng=rng), action)

    def grad_step(state: TrainState, _):
        rng, k_batch, k_upd = jax.random.split(state.rng, 3)
        learner, aux = update(state.learner, sample_batch(state.buffer, k_batch), k_upd)
        return state.replace(learner=learner, rng=rng, grad_steps=state.grad_steps + 1), aux

    def period(state: TrainState, _):
        state, stats = jax.lax.scan(policy_step, state, None, length=sched.vector_steps)
        state, aux = jax.lax.scan(grad_step, state, None, length=sched.updates)
        return state, (jax.tree.map(jnp.sum, stats), jax.tree.map(jnp.mean, aux))

    def init(key: jax.Array) -> TrainState:
        k_params, k_env, rng = jax.random.split(key, 3)
        params = init_params(k_params)
        env_state, obs = env.reset(k_env)
        n = cfg.num_envs
        state = TrainState(
            learner=Learner(params, opt_init(params)), env_state=env_state, obs=obs,
            buffer=goal_replay.init(rows, n, example_step), rng=rng,
            env_steps=jnp.zeros((), jnp.int32), grad_steps=jnp.zeros((), jnp.int32),
            chunk=jnp.zeros((), jnp.int32), ep_at_goal=jnp.zeros((n,), jnp.float32),
            ep_any=jnp.zeros((n,), bool))
        state, _ = jax.lax.scan(random_step, state, None, length=warmup_vector_steps)
        return state

    def chunk(state: TrainState) -> tuple[TrainState, dict]:
        state, (stats, aux) = jax.lax.scan(period, state, None, length=periods_per_chunk)
        return chunk_metrics(state, stats, aux)

    def chunk_metrics(state: TrainState, stats, aux) -> tuple[TrainState, dict]:
        """The chunk's metrics from its periods' episode statistics (4 sums each) and the updates'
        aux (leading axis: period or update); the state with its chunk counter advanced."""
        at_goal, any_, ret, n_done = (jnp.sum(x) for x in stats)
        episodes = jnp.maximum(n_done, 1)
        finished = n_done > 0
        metrics = jax.tree.map(lambda m: jnp.mean(m, axis=0), aux)
        metrics.update({
            "time_at_goal": jnp.where(finished, at_goal / episodes, jnp.nan),
            "success_any": jnp.where(finished, any_ / episodes, jnp.nan),
            "episode_return": jnp.where(finished, ret / episodes, jnp.nan),
            "episodes": n_done.astype(jnp.int32),
            "param_norm": optax.global_norm({k: v for k, v in state.learner.params.items()
                                             if k != "log_alpha"}),
            "env_steps": state.env_steps, "grad_steps": state.grad_steps})
        return state.replace(chunk=state.chunk + 1), metrics

    def evaluate(state: TrainState, key: jax.Array) -> dict:
        actor = state.learner.params["actor"]
        return rollout_metrics(eval_env, lambda obs, k: policy(actor, obs, jnp.zeros(obs.shape[:-1] + (a_dim,)))[0],
                               key)

    def set_hparams(state: TrainState, hp: dict) -> TrainState:
        opt_state = state.learner.opt_state
        if acco_step:   # {"opt": the sharded optimiser state, "pending": ...}
            opt_state = {**opt_state, "opt": common.set_hyperparams(opt_state["opt"], learning_rate=hp["lr"])}
        else:
            opt_state = common.set_hyperparams(opt_state, learning_rate=hp["lr"])
        return state.replace(learner=state.learner.replace(opt_state=opt_state))

    host_chunk = None
    if cfg.overlap:
        host_chunk = _overlapped_chunk(cfg, mesh, loss_fn, sharded or zero.ShardedOptimizer(
            optimizer, parallel.mesh_size(mesh) if mesh is not None else 1), policy_step, chunk_metrics,
            sched.vector_steps, sched.updates * periods_per_chunk, periods_per_chunk, a_dim)

        def chunk(state):  # noqa: F811 -- the overlapped learner has no jittable chunk
            raise ValueError("overlap: the overlapped learner runs its chunks from the host "
                             "(Agent.host_chunk; train.run does this); it has no jittable chunk")

    return common.Agent(init=init, chunk=chunk, evaluate=evaluate, num_chunks=cfg.num_chunks,
                        param_count=int(encoder_params), update=update, env_spec=spec,
                        set_hparams=set_hparams, host_chunk=host_chunk)


def _overlapped_chunk(cfg: Config, mesh, loss_fn, opts: zero.ShardedOptimizer, policy_step, chunk_metrics,
                      vector_steps: int, updates: int, periods: int, a_dim: int):
    """`host_chunk(states) -> (states, metrics)` for `overlap=true`: seed-stacked train states (one
    device, as `init` makes them) in and out, each seed's chunk run from the host: per period one
    jitted act program (vector_steps env steps), then its updates on `acco.OverlappedAcco` — per
    device `accumulate` programs fed micro-batches of batch_size / (devices x overlap_micro) rows
    sampled from the buffer, one `communicate` program per round, dispatched asynchronously. The
    learner state is kept between chunks in the jitted learner's layout (checkpointed as usual).
    Metrics: the jitted chunk's, plus `micro_batches/d<i>` (per update, device i, mean over the chunk)."""
    from scaling_rl import multiprocess

    if mesh is None:
        raise ValueError("overlap: needs a data mesh; set data_parallel=true or pass mesh=")
    if multiprocess.process_count() > 1:
        raise ValueError("overlap: the host-driven learner runs in one process (its devices addressable)")
    n = parallel.mesh_size(mesh)
    if cfg.batch_size % (n * cfg.overlap_micro):
        raise ValueError(f"batch_size: {cfg.batch_size} does not split into {n} devices x overlap_micro="
                         f"{cfg.overlap_micro} micro-batches; use {_round_up(cfg.batch_size, n * cfg.overlap_micro)}")
    size = cfg.batch_size // (n * cfg.overlap_micro)
    if size < 2:
        raise ValueError(f"overlap_micro: micro-batches of {size} row leave no InfoNCE negatives; use a larger "
                         f"batch_size or overlap_micro <= {cfg.batch_size // (2 * n)}")
    learner = acco.OverlappedAcco(
        loss_fn, opts, mesh, overlap_mode(cfg), micro=cfg.overlap_micro, min_micro=max(1, cfg.overlap_micro // 2),
        max_micro=cfg.overlap_max_micro or None, slowdown=(1.0,) * (n - 1) + (float(cfg.overlap_slowdown),),
        latency_s=cfg.overlap_latency_ms / 1e3)
    fused_pending = cfg.acco != "off"   # the jitted learner's layout: {"opt": ..., "pending": ...}

    @jax.jit
    def sample(buf, k_batch, k_noise, j, d):
        """Device d's rows of the update's j-th global micro-batch (n x size rows; j = 0 draws with the
        update's own keys, as the jitted chunk draws its batch: so overlap_micro=1 on ZeRO-1 is the
        jitted ZeRO-1 update, tests/acco_overlap_check.py)."""
        k_batch, k_noise = (jnp.where(j == 0, k, jax.random.fold_in(k, j)) for k in (k_batch, k_noise))
        now, fut, _ = goal_replay.sample(buf, k_batch, n * size, cfg.gamma)
        rows = {"state": now["state"], "action": now["action"], "goal": fut["achieved"],
                "noise": jax.random.normal(k_noise, (n * size, a_dim))}
        return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, d * size, size), rows)

    @jax.jit
    def act(state: TrainState, actor):
        state = state.replace(learner=Learner({"actor": actor}, None))
        state, stats = jax.lax.scan(policy_step, state, None, length=vector_steps)
        return state.replace(learner=None), jax.tree.map(jnp.sum, stats)

    finish = jax.jit(chunk_metrics)
    device = learner.devices[0]

    def one_seed(state: TrainState):
        opt, pending = state.learner.opt_state, None
        if fused_pending:
            opt, pending = opt["opt"], opt["pending"]
        rest = state.replace(learner=None)
        key0 = jax.random.PRNGKey(0)
        ostate = learner.from_learner(state.learner.params, opt, pending, sample(rest.buffer, key0, key0, 0, 0))
        stats, aux, counts = [], [], []
        for _ in range(periods):
            rest, s = act(rest, jax.device_put(ostate.params["actor"], device))
            stats.append(s)
            for _ in range(updates // periods):
                rng, k_batch, k_noise = jax.random.split(rest.rng, 3)   # as the jitted grad_step
                rest = rest.replace(rng=rng)

                def source(d, i, keys=(k_batch, k_noise), buf=rest.buffer):
                    return sample(buf, *keys, i, d)
                ostate, _, a = learner.update(ostate, source)
                aux.append(a)
                counts.append(np.sum(learner.last_counts, axis=0))
        params, opt, pending = learner.to_learner(ostate, device)
        rest = rest.replace(grad_steps=rest.grad_steps + updates)
        state = rest.replace(learner=Learner(params, {"opt": opt, "pending": pending} if fused_pending else opt))
        state, metrics = finish(state, jax.tree.map(lambda *x: jnp.stack(x), *stats),
                                {k: jnp.asarray(np.stack([a[k] for a in aux])) for k in aux[0]})
        metrics = dict(metrics)
        for d, c in enumerate(np.mean(counts, axis=0)):
            metrics[f"micro_batches/d{d}"] = jnp.asarray(c, jnp.float32)
        return state, metrics

    # seed split and stack as one program each (eager per-leaf indexing compiles once per leaf shape)
    unstack = jax.jit(lambda t: [jax.tree.map(lambda x: x[i], t) for i in range(jax.tree.leaves(t)[0].shape[0])])
    stack = jax.jit(lambda ts: jax.tree.map(lambda *xs: jnp.stack(xs), *ts))

    def host_chunk(states: TrainState):
        outs = [one_seed(s) for s in unstack(states)]
        return stack([o[0] for o in outs]), stack([o[1] for o in outs])

    return host_chunk


# Config fields that live in the optimiser state (see sac.PACKABLE).
PACKABLE = ("lr",)


def hparams(cfg: Config) -> dict[str, float]:
    """The `PACKABLE` values a run of `cfg` puts in its optimiser state."""
    return {"lr": float(cfg.lr)}


def rollout_metrics(env, act_fn, key: jax.Array) -> dict:
    """First episode of each of env.num_envs fresh envs under act_fn(obs, key): time at goal
    (steps with success), success-any and return, averaged over envs (`eval_` prefixed)."""
    env_state, obs = env.reset(key)
    n = env.num_envs

    def step(carry, k):
        env_state, obs, at_goal, any_, ret, live = carry
        env_state, ts = env.step(env_state, act_fn(obs, k))
        success = _success(env, ts) & live
        at_goal = at_goal + success
        any_ = any_ | success
        ret = ret + jnp.where(live, ts.reward, 0.0)
        return (env_state, ts.obs, at_goal, any_, ret, live & ~ts.done), None

    zeros = jnp.zeros((n,), jnp.float32)
    carry = (env_state, obs, zeros, jnp.zeros((n,), bool), zeros, jnp.ones((n,), bool))
    keys = jax.random.split(jax.random.fold_in(key, 1), env.spec.max_episode_steps)
    (_, _, at_goal, any_, ret, _), _ = jax.lax.scan(step, carry, keys)
    return {"eval_time_at_goal": jnp.mean(at_goal), "eval_success_any": jnp.mean(any_),
            "eval_return": jnp.mean(ret)}


def random_policy_metrics(cfg: Config, key: jax.Array, episodes: int | None = None) -> dict:
    """The same evaluation under uniformly random actions: the baseline a learner must beat."""
    env = _goal_env(cfg, episodes or cfg.eval_episodes)
    a_dim = env.spec.action_dim
    return rollout_metrics(env, lambda obs, k: jax.random.uniform(k, (obs.shape[0], a_dim), minval=-1, maxval=1),
                           key)


def memory_bytes(cfg: Config, agent: common.Agent) -> dict[str, int]:
    """Analytic bytes of one seed's training (nets.memory.estimate_peak_bytes; nothing is traced).
    Inputs of every network are taken as obs_dim wide (an upper bound: the input layer is tiny)."""
    obs, a = agent.env_spec.obs_dim, agent.env_spec.action_dim
    enc, act = encoder_backbone(cfg), actor_backbone(cfg)
    params = 4 * (2 * (nets.backbone_param_count(enc, obs + a) + nets.dense_head_param_count(cfg.width, cfg.repr_dim))
                  + nets.backbone_param_count(act, obs) + nets.dense_head_param_count(cfg.actor_width, 2 * a) + 1)
    b = cfg.batch_size
    # one update keeps φ(s, a), ψ(g), the actor and φ(s, π(s, g)) (the actor's Q) for its backward,
    # counted in float32 also under bf16 compute: XLA's peak of the seed-vmapped chunk does not show the
    # bf16 saving (measured: bf16 and fp32 peaks within 0.3%)
    enc32, act32 = (dataclasses.replace(c, compute_dtype="float32") for c in (enc, act))
    activations = 3 * nets.backbone_activation_bytes(enc32, b) + nets.backbone_activation_bytes(act32, b)
    parts = {"params": params, "adam_moments": 2 * params, "grads_and_updates": 2 * params,
             "replay": 4 * cfg.buffer_size * (obs + a) + 8 * cfg.buffer_size,
             "activations": activations}
    # XLA's other temporaries of vmap(chunk): measured 2-11% over the arrays above (test_crl's cases)
    parts["xla_temporaries"] = sum(parts.values()) // 10
    # the B x B logits and what their loss and backward keep: 5-6 float32 B x B arrays in vmap(chunk)
    # at B = 512 (by repr_dim), counted as 6
    parts["logits"] = 6 * 4 * b * b
    return parts


def param_count(cfg: Config) -> int:
    """Encoder (φ + ψ) parameter count N for `cfg` (builds the env to read its dimensions)."""
    return make(cfg).param_count


def make_train(cfg: Config, mesh=None, **networks):
    """Pure `train(key) -> (state, metrics stacked over chunks)`, evaluating after every chunk."""
    return common.make_train_from_agent(make(cfg, mesh, **networks))
