"""SAC family for continuous control: tanh-Gaussian actor, vmapped critic ensemble on residual
backbones (BRO / SimBa / CRL / MLP), Polyak target critics, automatic entropy tuning, AdamW with
weight decay, UTD σ, n-step returns, periodic resets, train/validation TD error.

    cfg = sac.Config(env="gymnax/Pendulum-v1", width=256, depth=2, utd=4, batch_size=256)
    agent = sac.make(cfg)                       # init / chunk / evaluate / num_chunks / param_count
    state, metrics = jax.jit(sac.make_train(cfg))(key)      # a whole run, one XLA program

The env/replay/UTD/validation loop is shared with DQN (`agents/common.py`, whose docstring says
exactly how σ, warm-up, n-step, resets and the validation buffer work). This file is the algorithm:

One gradient step minimises, in a single backward pass,
  critic: Σ_i mean_B (Q_i(s,a) - y)²,   y = r_n + discount·(agg_i Q̄_i(s', a') - α·log π(a'|s'))
          with a' ~ π(·|s') (actor held fixed), Q̄ the target critics, agg = min (default) or mean;
          `discount` = γ^m·(1 - terminated) from the n-step window: truncation still bootstraps;
  actor:  mean_B (α·log π(ã|s) - mean_i Q_i(s, ã)),  ã ~ π(·|s) reparameterised, critics held fixed;
  alpha:  mean_B (-log α · (log π(ã|s) + H_target)),  H_target = -action_dim unless configured.
The actor and temperature use the pre-update critic of the same step (one fused backward instead of
three sequential ones). All per-sample Gaussian noise is drawn before the loss and travels with the
batch, so the data-parallel (shard_map'd) update equals the single-device one.
Reported `loss/critic` and `td_error/*` are mean_{i,B}(Q_i - y)² (the per-member MSE).
`param_count` N is the number of critic parameters of the whole ensemble (num_critics × one critic).
"""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from scaling_rl import acco
from scaling_rl import nets
from scaling_rl import parallel
from scaling_rl import zero
from scaling_rl.agents import common

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

# Config fields that live in the train state, not in the program (the optimiser states' injected
# hyper-parameters; τ in the learner's `tau` entry): trials differing only in these (and the seed)
# can share one vmapped program (sweep packing; train.run(seed_configs=...)).
PACKABLE = ("lr", "actor_lr", "alpha_lr", "weight_decay", "tau")


@dataclasses.dataclass(frozen=True)
class Config(common.BaseConfig):
    """SAC hyper-parameters (see `common.BaseConfig` for the shared ones and their units)."""

    env: str = "gymnax/Pendulum-v1"
    num_critics: int = 2              # critic ensemble size (vmapped)
    critic_agg: str = "min"           # how the ensemble forms the bootstrap target: min | mean
    actor_backbone: str | None = None  # None: same as `backbone`
    actor_width: int | None = None    # None: same as `width`
    actor_depth: int | None = None    # None: same as `depth`
    actor_lr: float | None = None     # None: same as `lr`
    alpha_lr: float = 3e-4
    init_alpha: float = 1.0
    target_entropy: float | None = None  # None: -action_dim
    zero_optimizer: bool = False      # ZeRO-1: optimiser states sharded over the data mesh (scaling_rl/zero.py)
    acco: str = "off"                 # on ZeRO-1: off | ddp | dpu | acco (scaling_rl/acco.py learner_update)

    def _validate(self) -> None:
        super()._validate()
        acco.check_learner_mode(self.acco, self.zero_optimizer)
        if not common._is_int(self.num_critics) or self.num_critics < 1:
            raise ValueError(f"num_critics: must be an integer >= 1, got {self.num_critics!r}; e.g. 2")
        if self.critic_agg not in ("min", "mean"):
            raise ValueError(f"critic_agg: unknown {self.critic_agg!r}; use 'min' or 'mean'")
        for key in ("actor_lr", "alpha_lr", "init_alpha"):
            v = getattr(self, key)
            if v is not None and (not common._is_num(v) or not v > 0):
                raise ValueError(f"{key}: must be a number > 0, got {v!r}")
        if self.target_entropy is not None and not common._is_num(self.target_entropy):
            raise ValueError(f"target_entropy: must be a number or None, got {self.target_entropy!r}")
        for key in ("actor_width", "actor_depth"):
            v = getattr(self, key)
            if v is not None and (not common._is_int(v) or v < 1):
                raise ValueError(f"{key}: must be an integer >= 1 or None, got {v!r}")
        if self.actor_backbone is not None and self.actor_backbone not in common.BACKBONES:
            raise ValueError(f"actor_backbone: unknown {self.actor_backbone!r}; use None or one of "
                             f"{', '.join(common.BACKBONES)}")
        critic_backbone(self), actor_backbone(self)  # surfaces the backbone's own one-line errors


def critic_backbone(cfg: Config) -> nets.BackboneConfig:
    """Backbone of one critic."""
    return nets.BackboneConfig(kind=cfg.backbone, width=cfg.width, depth=cfg.depth,
                               activation=cfg.activation, scan=cfg.scan, remat=cfg.remat,
                               compute_dtype=cfg.compute_dtype)


def actor_backbone(cfg: Config) -> nets.BackboneConfig:
    """Backbone of the actor (defaults to the critic's shape)."""
    return dataclasses.replace(critic_backbone(cfg), kind=cfg.actor_backbone or cfg.backbone,
                               width=cfg.actor_width or cfg.width, depth=cfg.actor_depth or cfg.depth)


class Critic(nn.Module):
    """Q(s, a): backbone on concat(s, a), then a scalar Dense head."""

    backbone: nets.BackboneConfig

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        h = nets.Backbone(self.backbone)(jnp.concatenate([obs, action], axis=-1))
        return nn.Dense(1, name="head")(h)[..., 0]


class Actor(nn.Module):
    """π(·|s): backbone, then a Dense head giving the Gaussian mean and a bounded log-std."""

    backbone: nets.BackboneConfig
    action_dim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = nets.Backbone(self.backbone)(obs)
        out = nn.Dense(2 * self.action_dim, name="head")(h)
        mean, raw_log_std = jnp.split(out, 2, axis=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(raw_log_std) + 1.0)
        return mean, log_std


def tanh_gaussian_sample(mean: jax.Array, log_std: jax.Array, noise: jax.Array
                         ) -> tuple[jax.Array, jax.Array]:
    """Reparameterised a = tanh(mean + std·noise) and its log-density (change of variables)."""
    u = mean + jnp.exp(log_std) * noise
    log_normal = -0.5 * jnp.square(noise) - 0.5 * math.log(2 * math.pi) - log_std
    # log(1 - tanh(u)²) = 2·(log 2 - u - softplus(-2u)), stable for large |u|.
    log_det = 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), jnp.sum(log_normal - log_det, axis=-1)


def soft_td_target(reward, discount, q_next, logp_next, alpha, agg: str = "min") -> jax.Array:
    """y = r + discount·(agg_i Q̄_i(s', a') - α·log π(a'|s')); q_next is (num_critics, B)."""
    q = jnp.min(q_next, axis=0) if agg == "min" else jnp.mean(q_next, axis=0)
    return reward + discount * (q - alpha * logp_next)


def make(cfg: Config, mesh=None) -> common.Agent:
    """Build the SAC agent; `mesh` (or `cfg.data_parallel`) turns on the shard_map'd update."""
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg: expected sac.Config, got {type(cfg).__name__}")
    from scaling_rl import envs as envs_lib

    spec = envs_lib.make(cfg.env, num_envs=1).spec
    if spec.discrete:
        raise ValueError(f"env: {cfg.env} has discrete actions; SAC needs a continuous env (use dqn)")
    mesh = parallel.resolve_mesh(mesh, cfg.data_parallel, cfg.batch_size)
    obs_dim, act_dim = spec.obs_dim, spec.action_dim
    critic = Critic(critic_backbone(cfg))
    actor = Actor(actor_backbone(cfg), act_dim)
    target_entropy = -float(act_dim) if cfg.target_entropy is None else float(cfg.target_entropy)
    if cfg.zero_optimizer and mesh is None:
        raise ValueError("zero_optimizer: needs a data mesh; set data_parallel=True or pass mesh=")
    # ZeRO-1 clips by the global norm across shards itself (zero.py), so its optax chains do not
    clip = 0.0 if cfg.zero_optimizer else cfg.max_grad_norm
    critic_opt = common.make_optimizer(cfg.lr, cfg.weight_decay, clip)
    actor_opt = common.make_optimizer(cfg.actor_lr or cfg.lr, cfg.weight_decay, clip)
    alpha_opt = common.make_adam(cfg.alpha_lr)
    sharded = None
    if cfg.zero_optimizer:
        n = parallel.mesh_size(mesh)
        sharded = {"actor": zero.ShardedOptimizer(actor_opt, n, max_grad_norm=cfg.max_grad_norm),
                   "critic": zero.ShardedOptimizer(critic_opt, n, max_grad_norm=cfg.max_grad_norm),
                   "log_alpha": zero.ShardedOptimizer(alpha_opt, n)}
        opt_key = {"actor": "actor", "critic": "critic", "log_alpha": "alpha"}
    agg = cfg.critic_agg

    def critic_apply(params, obs, action):  # -> (num_critics, B)
        return jax.vmap(critic.apply, in_axes=(0, None, None))(params, obs, action)

    def init_learner(key):
        k_critic, k_actor = jax.random.split(key)
        obs = jnp.zeros((1, obs_dim), jnp.float32)
        act = jnp.zeros((1, act_dim), jnp.float32)
        critic_params = jax.vmap(critic.init, in_axes=(0, None, None))(
            jax.random.split(k_critic, cfg.num_critics), obs, act)
        actor_params = actor.init(k_actor, obs)
        log_alpha = jnp.asarray(math.log(cfg.init_alpha), jnp.float32)
        return {"actor": actor_params, "critic": critic_params, "target_critic": critic_params,
                "log_alpha": log_alpha, "tau": jnp.asarray(cfg.tau, jnp.float32),
                "opt": {"actor": actor_opt.init(actor_params), "critic": critic_opt.init(critic_params),
                        "alpha": alpha_opt.init(log_alpha)} if sharded is None else
                       {"actor": sharded["actor"].init(actor_params),
                        "critic": sharded["critic"].init(critic_params),
                        "alpha": sharded["log_alpha"].init(log_alpha)},
                **({} if acco_step is None else {"acco_pending": acco.pending_init(
                    {"actor": actor_params, "critic": critic_params, "log_alpha": log_alpha}, n)})}

    def targets(actor_params, target_critic, log_alpha, batch, noise_next):
        mean, log_std = actor.apply(actor_params, batch["next_obs"])
        a_next, logp_next = tanh_gaussian_sample(mean, log_std, noise_next)
        q_next = critic_apply(target_critic, batch["next_obs"], a_next)
        return soft_td_target(batch["reward"], batch["discount"], q_next, logp_next,
                              jnp.exp(log_alpha), agg)

    def loss_fn(params, batch, target_critic):
        alpha = jax.lax.stop_gradient(jnp.exp(params["log_alpha"]))
        y = jax.lax.stop_gradient(targets(jax.lax.stop_gradient(params["actor"]), target_critic,
                                          params["log_alpha"], batch, batch["noise_next"]))
        q = critic_apply(params["critic"], batch["obs"], batch["action"])
        td2 = jnp.square(q - y[None])
        critic_loss = jnp.sum(jnp.mean(td2, axis=1))
        mean, log_std = actor.apply(params["actor"], batch["obs"])
        a_pi, logp = tanh_gaussian_sample(mean, log_std, batch["noise_pi"])
        q_pi = critic_apply(jax.lax.stop_gradient(params["critic"]), batch["obs"], a_pi)
        actor_loss = jnp.mean(alpha * logp - jnp.mean(q_pi, axis=0))
        alpha_loss = jnp.mean(-params["log_alpha"] * jax.lax.stop_gradient(logp + target_entropy))
        aux = {"loss/critic": jnp.mean(td2), "loss/actor": actor_loss, "loss/alpha": alpha_loss,
               "alpha": alpha, "entropy": -jnp.mean(logp), "q_mean": jnp.mean(q)}
        return critic_loss + actor_loss + alpha_loss, aux

    value_and_grad = parallel.data_parallel_value_and_grad(loss_fn, mesh)
    zero_step = zero.zero_update(loss_fn, sharded, mesh) if sharded else None
    acco_step = acco.learner_update(loss_fn, sharded, mesh, cfg.acco) if cfg.acco != "off" else None

    def with_noise(batch, key):
        k_next, k_pi = jax.random.split(key)
        n = batch["reward"].shape[0]
        return {**batch, "noise_next": jax.random.normal(k_next, (n, act_dim), jnp.float32),
                "noise_pi": jax.random.normal(k_pi, (n, act_dim), jnp.float32)}

    def update(learner, batch, key):
        params = {k: learner[k] for k in ("actor", "critic", "log_alpha")}
        if sharded:
            states = {k: learner["opt"][opt_key[k]] for k in sharded}
            if acco_step:
                new, states, pending, _, aux = acco_step(params, states, learner["acco_pending"],
                                                         with_noise(batch, key), learner["target_critic"])
                new["acco_pending"] = pending
            else:
                new, states, _, aux = zero_step(params, states, with_noise(batch, key), learner["target_critic"])
            new["target_critic"] = common.polyak_update(learner["target_critic"], new["critic"], learner["tau"])
            new["tau"] = learner["tau"]
            new["opt"] = {opt_key[k]: v for k, v in states.items()}
            return new, aux
        (_, aux), grads = value_and_grad(params, with_noise(batch, key), learner["target_critic"])
        opt = learner["opt"]
        new, new_opt = {}, {}
        for name, tx, opt_name in (("actor", actor_opt, "actor"), ("critic", critic_opt, "critic"),
                                   ("log_alpha", alpha_opt, "alpha")):
            updates, new_opt[opt_name] = tx.update(grads[name], opt[opt_name], params[name])
            new[name] = optax.apply_updates(params[name], updates)
        new["target_critic"] = common.polyak_update(learner["target_critic"], new["critic"], learner["tau"])
        new["tau"] = learner["tau"]
        new["opt"] = new_opt
        return new, aux

    def td_error(learner, batch, key):
        batch = with_noise(batch, key)
        y = targets(learner["actor"], learner["target_critic"], learner["log_alpha"], batch,
                    batch["noise_next"])
        q = critic_apply(learner["critic"], batch["obs"], batch["action"])
        return jnp.mean(jnp.square(q - y[None]))

    def act(learner, obs, key, env_steps):
        del env_steps
        mean, log_std = actor.apply(learner["actor"], obs)
        action, _ = tanh_gaussian_sample(mean, log_std, jax.random.normal(key, mean.shape))
        return action

    def act_eval(learner, obs):
        mean, _ = actor.apply(learner["actor"], obs)
        return jnp.tanh(mean)

    def diagnostics(learner):
        return {"param_norm": common.global_norm(learner["critic"]),
                "param_norm/actor": common.global_norm(learner["actor"])}

    def set_hparams(learner, hp):
        opt = learner["opt"]
        opt = {"critic": common.set_hyperparams(opt["critic"], learning_rate=hp["lr"],
                                                weight_decay=hp["weight_decay"]),
               "actor": common.set_hyperparams(opt["actor"], learning_rate=hp["actor_lr"],
                                               weight_decay=hp["weight_decay"]),
               "alpha": common.set_hyperparams(opt["alpha"], learning_rate=hp["alpha_lr"])}
        return {**learner, "opt": opt, "tau": jnp.asarray(hp["tau"], jnp.float32)}

    algo = common.Algorithm(init=init_learner, act=act, act_eval=act_eval, update=update,
                            td_error=td_error, diagnostics=diagnostics, set_hparams=set_hparams)
    return common.build_agent(cfg, algo, param_count(cfg, obs_dim, act_dim), spec)


def hparams(cfg: Config) -> dict[str, float]:
    """The `PACKABLE` values a run of `cfg` puts in its train state (actor_lr None -> lr)."""
    return {"lr": float(cfg.lr), "actor_lr": float(cfg.actor_lr or cfg.lr),
            "alpha_lr": float(cfg.alpha_lr), "weight_decay": float(cfg.weight_decay), "tau": float(cfg.tau)}


def param_count(cfg: Config, obs_dim: int, action_dim: int) -> int:
    """Critic parameters N of the whole ensemble (exact, via the backbone's analytic count)."""
    one = (nets.backbone_param_count(critic_backbone(cfg), obs_dim + action_dim)
           + nets.dense_head_param_count(cfg.width, 1))
    return cfg.num_critics * one


def make_train(cfg: Config, mesh=None):
    """Pure `train(key) -> (state, metrics stacked over chunks)` (with `eval_return` per chunk)."""
    return common.make_train_from_agent(make(cfg, mesh))
