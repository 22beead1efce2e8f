"""Double DQN for discrete gymnax envs on the same residual backbones, UTD σ and diagnostics as SAC.

    cfg = dqn.Config(env="gymnax/CartPole-v1", width=64, depth=1, utd=0.25)
    state, metrics = jax.jit(dqn.make_train(cfg))(key)

Design choice: a replay-based double DQN with Polyak target network, not PQN's on-policy λ-returns.
The point of this toolkit is studying σ (gradient steps per env step), batch size and the
train/validation TD gap; those need a replay buffer that is re-sampled σ times per env step, which
is the regime of SAC and of the value-scaling papers. PQN has no buffer and no meaningful σ.

One gradient step minimises mean_B (Q(s,a) - y)², y = r_n + discount·Q̄(s', argmax_a' Q(s', a'))
(online network picks, target network evaluates; `discount` = γ^m·(1 - terminated) from the n-step
window, so time-limit truncation still bootstraps), then Q̄ <- (1-τ)Q̄ + τQ. Behaviour is ε-greedy
with ε linear from `epsilon_start` to `epsilon_end` over the first `epsilon_decay_steps` env steps
(warm-up included); warm-up actions are uniform. Evaluation is greedy.
`param_count` N is the Q-network's parameter count. Shared loop: `agents/common.py`.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from scaling_rl import nets
from scaling_rl import parallel
from scaling_rl.agents import common


@dataclasses.dataclass(frozen=True)
class Config(common.BaseConfig):
    """DQN hyper-parameters (see `common.BaseConfig` for the shared ones and their units)."""

    env: str = "gymnax/CartPole-v1"
    width: int = 64
    depth: int = 1
    batch_size: int = 128
    lr: float = 5e-4
    weight_decay: float = 0.0
    utd: float = 0.25
    num_envs: int = 4
    n_step: int = 3
    learning_starts: int = 1_000
    buffer_size: int = 50_000
    tau: float = 0.01
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_decay_steps: int = 10_000   # env steps
    double: bool = True                 # double-DQN target (False: max over the target network)

    def _validate(self) -> None:
        super()._validate()
        for key in ("epsilon_start", "epsilon_end"):
            v = getattr(self, key)
            if not common._is_num(v) or not 0 <= v <= 1:
                raise ValueError(f"{key}: must be in [0, 1], got {v!r}; e.g. 0.05")
        if not common._is_int(self.epsilon_decay_steps) or self.epsilon_decay_steps < 0:
            raise ValueError(f"epsilon_decay_steps: must be an integer >= 0, got "
                             f"{self.epsilon_decay_steps!r}; e.g. 10000")
        q_backbone(self)


def q_backbone(cfg: Config) -> nets.BackboneConfig:
    """Backbone of the Q-network."""
    return nets.BackboneConfig(kind=cfg.backbone, width=cfg.width, depth=cfg.depth,
                               activation=cfg.activation, scan=cfg.scan, remat=cfg.remat,
                               compute_dtype=cfg.compute_dtype)


class QNetwork(nn.Module):
    """Q(s, ·): backbone, then a Dense head with one output per action."""

    backbone: nets.BackboneConfig
    num_actions: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return nn.Dense(self.num_actions, name="head")(nets.Backbone(self.backbone)(obs))


def double_q_target(reward, discount, q_next_online, q_next_target, double: bool = True) -> jax.Array:
    """y = r + discount·Q̄(s', a*), a* = argmax Q(s') (double) or argmax Q̄(s'); q_next_* are (B, A)."""
    chooser = q_next_online if double else q_next_target
    best = jnp.argmax(chooser, axis=-1)
    return reward + discount * jnp.take_along_axis(q_next_target, best[:, None], axis=-1)[:, 0]


# Config fields that live in the train state (see sac.PACKABLE).
PACKABLE = ("lr", "weight_decay", "tau")


def hparams(cfg: Config) -> dict[str, float]:
    """The `PACKABLE` values a run of `cfg` puts in its train state."""
    return {"lr": float(cfg.lr), "weight_decay": float(cfg.weight_decay), "tau": float(cfg.tau)}


def make(cfg: Config, mesh=None) -> common.Agent:
    """Build the DQN agent; `mesh` (or `cfg.data_parallel`) turns on the shard_map'd update."""
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg: expected dqn.Config, got {type(cfg).__name__}")
    from scaling_rl import envs as envs_lib

    spec = envs_lib.make(cfg.env, num_envs=1).spec
    if not spec.discrete:
        raise ValueError(f"env: {cfg.env} has continuous actions; DQN needs a discrete env (use sac)")
    mesh = parallel.resolve_mesh(mesh, cfg.data_parallel, cfg.batch_size)
    qnet = QNetwork(q_backbone(cfg), spec.num_actions)
    tx = common.make_optimizer(cfg.lr, cfg.weight_decay, cfg.max_grad_norm)

    def init_learner(key):
        params = qnet.init(key, jnp.zeros((1, spec.obs_dim), jnp.float32))
        return {"q": params, "target": params, "opt": tx.init(params), "tau": jnp.asarray(cfg.tau, jnp.float32)}

    def td_target(params, target, batch):
        return double_q_target(batch["reward"], batch["discount"], qnet.apply(params, batch["next_obs"]),
                               qnet.apply(target, batch["next_obs"]), cfg.double)

    def q_taken(params, batch):
        q = qnet.apply(params, batch["obs"])
        return jnp.take_along_axis(q, batch["action"][:, None].astype(jnp.int32), axis=-1)[:, 0], q

    def loss_fn(params, batch, target):
        y = jax.lax.stop_gradient(td_target(params, target, batch))
        q_sa, _ = q_taken(params, batch)
        td2 = jnp.square(q_sa - y)
        return jnp.mean(td2), {"loss/critic": jnp.mean(td2), "q_mean": jnp.mean(q_sa)}

    value_and_grad = parallel.data_parallel_value_and_grad(loss_fn, mesh)

    def update(learner, batch, key):
        del key  # DQN's update is deterministic given the batch
        (_, aux), grads = value_and_grad(learner["q"], batch, learner["target"])
        updates, opt = tx.update(grads, learner["opt"], learner["q"])
        q = optax.apply_updates(learner["q"], updates)
        return {"q": q, "target": common.polyak_update(learner["target"], q, learner["tau"]), "opt": opt,
                "tau": learner["tau"]}, aux

    def td_error(learner, batch, key):
        del key
        y = td_target(learner["q"], learner["target"], batch)
        return jnp.mean(jnp.square(q_taken(learner["q"], batch)[0] - y))

    def epsilon(env_steps):
        return common.linear_schedule(cfg.epsilon_start, cfg.epsilon_end, cfg.epsilon_decay_steps,
                                      env_steps)

    def act(learner, obs, key, env_steps):
        k_explore, k_random = jax.random.split(key)
        greedy = jnp.argmax(qnet.apply(learner["q"], obs), axis=-1).astype(jnp.int32)
        random = jax.random.randint(k_random, greedy.shape, 0, spec.num_actions, jnp.int32)
        explore = jax.random.uniform(k_explore, greedy.shape) < epsilon(env_steps)
        return jnp.where(explore, random, greedy)

    def act_eval(learner, obs):
        return jnp.argmax(qnet.apply(learner["q"], obs), axis=-1).astype(jnp.int32)

    def diagnostics(learner):
        return {"param_norm": common.global_norm(learner["q"])}

    def set_hparams(learner, hp):
        return {**learner, "opt": common.set_hyperparams(learner["opt"], learning_rate=hp["lr"],
                                                         weight_decay=hp["weight_decay"]),
                "tau": jnp.asarray(hp["tau"], jnp.float32)}

    algo = common.Algorithm(init=init_learner, act=act, act_eval=act_eval, update=update,
                            td_error=td_error, diagnostics=diagnostics, set_hparams=set_hparams)
    agent = common.build_agent(cfg, algo, param_count(cfg, spec.obs_dim, spec.num_actions), spec)
    chunk = agent.chunk

    def chunk_with_epsilon(state):
        state, metrics = chunk(state)
        metrics["epsilon"] = epsilon(state.env_steps)
        return state, metrics

    return agent._replace(chunk=chunk_with_epsilon)


def param_count(cfg: Config, obs_dim: int, num_actions: int) -> int:
    """Q-network parameters N (exact, via the backbone's analytic count)."""
    return (nets.backbone_param_count(q_backbone(cfg), obs_dim)
            + nets.dense_head_param_count(cfg.width, num_actions))


def make_train(cfg: Config, mesh=None):
    """Pure `train(key) -> (state, metrics stacked over chunks)` (with `eval_return` per chunk)."""
    return common.make_train_from_agent(make(cfg, mesh))
