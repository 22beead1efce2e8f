"""What a user bringing a pretrained model and a GPU hits (issue 20), reproduced on the CPU: mixed
JAX device placement (two forced host devices), memory of the log-prob passes on a real vocabulary
size, defaults that would change a pretrained model, token budgets, the Ray source's placement."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl.llm import rollout  # noqa: E402
from scaling_rl.llm.trainer import GRPOConfig, GRPOTrainer  # noqa: E402

torch.set_num_threads(1)
TINY = dict(sft_steps=0, prompts_per_step=2, group_size=2, eval_problems=4, train_pool=16,
            hidden_size=32, num_heads=2)


@pytest.fixture(scope="module")
def trainer():
    t = GRPOTrainer(GRPOConfig(**TINY))
    t.setup()
    yield t
    t.close()


# ---- 1. JAX on the GPU: every objective input where the objective runs -------------------------

class _Recorded(Exception):
    pass


def test_every_objective_input_is_on_the_objective_device(trainer):
    """With CUDA JAX the objective runs on the GPU; an input left on the host (num_items was
    `mask.sum().cpu()`) is committed there and the jitted objective raises. A fake objective device
    (meta) shows where each input is sent."""
    data = trainer.collect()
    seen = []

    def spy(*args):
        seen.extend(a.device if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)
        raise _Recorded

    saved = trainer._objective_device, trainer.objective
    trainer._objective_device, trainer.objective = torch.device("meta"), spy
    try:
        with pytest.raises(_Recorded):
            trainer._update(data["batch"], data["rewards"])
    finally:
        trainer._objective_device, trainer.objective = saved
        trainer.model.eval()
    assert len(seen) == 6 and seen[-1] == "float"
    assert all(d == torch.device("meta") for d in seen[:-1]), seen


def test_mixed_placement_with_two_forced_devices_and_no_preallocation():
    """Two forced JAX host devices: the objective's inputs committed to device 1 (JAX's GPU) and
    num_items committed to device 0 (the host) fail; a Python number goes where the inputs are.
    Importing the LLM package turns JAX's GPU preallocation off (torch shares the card)."""
    code = textwrap.dedent("""
        import os
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
        import scaling_rl.llm
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        import jax, jax.numpy as jnp
        from scaling_rl.llm import objectives
        d0, d1 = jax.devices()
        fn = jax.jit(objectives.objective_fn("dapo", 0.2, 0.2, 0.0, 3))
        x = jax.device_put(jnp.full((2, 3), -1.0), d1)
        args = (x, x, x, jax.device_put(jnp.ones(2), d1), jax.device_put(jnp.ones((2, 3)), d1))
        try:
            fn(*args, jax.device_put(jnp.float32(6), d0))
            print("MIXED_OK")
        except ValueError as e:
            assert "incompatible devices" in str(e) or "device" in str(e), e
            print("MIXED_RAISES")
        loss, _ = fn(*args, 6.0)
        assert loss.devices() == {d1}, loss.devices()
        print("FLOAT_OK")
    """)
    from forced_devices import xla_flags

    env = dict(os.environ, XLA_FLAGS=xla_flags(2))   # 2 forced devices, before the child imports jax
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["MIXED_RAISES", "FLOAT_OK"]


# ---- 2. memory on a real vocabulary: selective, chunked log-softmax -------------------------------

QWEN_VOCAB = 151_936  # Qwen2.5's vocabulary: the logits, not the weights, are what grow


class _Sizes(torch.utils._python_dispatch.TorchDispatchMode):
    """Bytes of every tensor an op produces (the full-vocabulary copies are what we look for)."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.sizes.append(t.untyped_storage().nbytes())  # new memory, not a view
        return out


@pytest.fixture(scope="module")
def big_vocab_dir(tmp_path_factory):
    """A Qwen2 model from the real architecture's config with the real vocabulary size (tiny
    otherwise), saved with the character tokenizer, as a user's `init_from` directory."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from scaling_rl.llm.models import char_tokenizer, save_policy
    tok = char_tokenizer()
    cfg = Qwen2Config(vocab_size=QWEN_VOCAB, hidden_size=8, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=16,
                      max_position_embeddings=64, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()
    path = tmp_path_factory.mktemp("qwen_vocab") / "model"
    save_policy(model, tok, path)
    return path


def test_selective_logprobs_match_log_softmax_and_its_gradient(monkeypatch):
    import torch.nn.functional as F
    monkeypatch.setattr(rollout, "CHUNK_ELEMENTS", 3 * 50)  # several chunks of 3 rows
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 50, generator=g, requires_grad=True)
    tok = torch.randint(50, (4, 5), generator=g)
    w = torch.randn(4, 5, generator=g)
    for temp in (1.0, 0.7):
        ours = rollout.selective_logprobs(x, tok, temp)
        ref = F.log_softmax(x / temp, -1).gather(-1, tok[..., None]).squeeze(-1)
        torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)
        torch.testing.assert_close(torch.autograd.grad((ours * w).sum(), x)[0],
                                   torch.autograd.grad((ref * w).sum(), x)[0], rtol=0, atol=1e-6)
        # consume: the gradient is written over (a copy of) the logits, same values
        y = x.detach().clone().requires_grad_()
        z = y * 1.0
        torch.testing.assert_close(
            torch.autograd.grad((rollout.selective_logprobs(z, tok, temp, consume=True) * w).sum(), y)[0],
            torch.autograd.grad((F.log_softmax(x / temp, -1).gather(-1, tok[..., None]).squeeze(-1)
                                 * w).sum(), x)[0], rtol=0, atol=1e-6)
        lsm = F.log_softmax(x.detach() / temp, -1)
        torch.testing.assert_close(rollout.chunked_entropy(x, temp), -(lsm.exp() * lsm).sum(-1),
                                   rtol=0, atol=2e-6)


def test_update_never_holds_more_than_one_minibatch_of_logits(big_vocab_dir, monkeypatch):
    """One update (two minibatches, a reference pass, entropy) on a 151,936-token vocabulary: no op
    makes a tensor larger than the logits of one training minibatch, and at most two (the logits
    and their gradient) that large. Before: full-batch log-softmax and float32 copies."""
    monkeypatch.setattr(rollout, "CHUNK_ELEMENTS", 4 * QWEN_VOCAB, raising=False)
    t = GRPOTrainer(GRPOConfig(**{**TINY, "init_from": str(big_vocab_dir), "num_minibatches": 2,
                                  "beta": 0.04, "max_completion_length": 6, "group_size": 4}))
    t.setup()
    try:
        data = t.collect()
        B, T = data["batch"].completion_ids.shape
        logits = (B // 2) * T * QWEN_VOCAB * 4
        with _Sizes() as seen:
            t._update(data["batch"], data["rewards"])
    finally:
        t.close()
    assert B == 8 and max(seen.sizes) <= logits, (max(seen.sizes) / logits)
    big = [s for s in seen.sizes if s > logits // 2]
    # per minibatch: the forward's logits (the gradient reuses them), twice; no-grad passes:
    # 2 x (old, ref)
    assert len(big) <= 2 + 2 * 2, len(big)


# ---- 3. defaults that would change a pretrained model; budgets in tokens ------------------------

@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory):
    """A saved Qwen2 whose tokenizer has a multi-character token (characters are not tokens)."""
    from scaling_rl.llm.models import char_tokenizer, save_policy, tiny_model
    tok = char_tokenizer()
    tok.add_tokens(["answer"])
    model = tiny_model(tok, hidden_size=32, num_heads=2)
    path = tmp_path_factory.mktemp("pretrained") / "model"
    save_policy(model, tok, path)
    return path


def test_pretrained_model_gets_no_default_sft_and_a_token_budget(pretrained_dir):
    from scaling_rl.llm.models import load_policy
    cfg = {**TINY, "sft_steps": -1, "model": str(pretrained_dir)}
    with pytest.raises(ValueError, match="^max_completion_length: 0 .* set a budget in tokens"):
        GRPOTrainer(GRPOConfig(**cfg)).setup()
    t = GRPOTrainer(GRPOConfig(**cfg, max_completion_length=7))
    t.setup()
    try:
        saved, _ = load_policy(str(pretrained_dir))
        assert t.sft_steps() == 0 and t.max_len == 7 and not any(k.startswith("sft/") for k in t.rows[0])
        for (name, a), b in zip(t.model.state_dict().items(), saved.state_dict().values()):
            assert torch.equal(a, b), name   # RL starts from the user's weights, unchanged
        assert t.collect()["batch"].completion_ids.shape[1] == 7
    finally:
        t.close()
    # the tiny built-in models keep their warm start; an explicit count is SFT on any model
    assert GRPOTrainer(GRPOConfig(sft_steps=-1)).sft_steps() == 400
    assert GRPOTrainer(GRPOConfig(sft_steps=5, model=str(pretrained_dir))).sft_steps() == 5


# ---- 6, 7. what is consumed and counted: the groups actually received ---------------------------

def _group(batch, index, version, worker=0):
    from scaling_rl.llm import sources
    b = rollout.select(batch, [0, 1])
    b.versions = torch.full_like(b.completion_ids, version)
    return sources.Group(index, index, b, np.zeros(2, np.float32), worker)


def test_ordered_source_checks_the_groups_it_consumes(trainer):
    from scaling_rl.llm import sources

    class Fed(sources.OrderedSource):
        def __init__(self, trainer, feed):
            super().__init__(trainer)
            self.feed = feed

        def _receive(self, timeout):
            return self.feed.pop(0) if self.feed else []

    batch = trainer.collect()["batch"]
    saved_step, before = trainer.step, trainer.counters["rollouts"]
    trainer.step = 3                      # P = 2: step 3 takes groups 6 and 7; η = 1
    try:
        # out of order, plus group 5 from before a restart (generated, never trained on again)
        src = Fed(trainer, [[_group(batch, 7, 2, worker=1), _group(batch, 5, 2)],
                            [_group(batch, 6, 3, worker=1)]])
        data = src.pull()
        assert src.consumed == [6, 7] and src.consumed_from == [1, 1]
        assert data["batch"].versions.min() == 2 and data["rewards"].shape == (4,)
        assert trainer.counters["rollouts"] - before == 3 * 2   # every generated completion
        # the staleness bound is checked at consumption: a version-1 token at step 3, η = 1
        with pytest.raises(RuntimeError, match="group 6 has a token of version 1, 2 versions behind"):
            Fed(trainer, [[_group(batch, 6, 1), _group(batch, 7, 2)]]).pull()
    finally:
        trainer.step = saved_step


def test_tba_counts_generated_completions_not_replays(trainer):
    import types

    from scaling_rl.llm import sources
    batch = trainer.collect()["batch"]
    feed = [[_group(batch, 0, 0), _group(batch, 1, 0)], [_group(batch, 2, 1)]]
    src = object.__new__(sources.TBASource)
    src.trainer, src.cfg = trainer, types.SimpleNamespace(prompts_per_step=2)
    src.buffer = sources.ReplayBuffer(8, reward_fraction=0.5, temperature=0.1, seed=0)
    src.workers = [types.SimpleNamespace(get=lambda timeout: feed.pop(0) if feed else [])]
    src.fresh = 1
    before = trainer.counters["rollouts"]
    assert len(src.pull()["rewards"]) == 4 and len(src.pull()["rewards"]) == 4
    assert trainer.counters["rollouts"] - before == 3 * 2      # 3 groups generated, 4 trained on


def test_trained_on_counts_completions_in_updates(trainer):
    before = dict(trainer.counters)
    data = trainer.collect()
    trainer._update(data["batch"], data["rewards"])
    trainer.model.eval()
    assert trainer.counters["trained_on"] - before["trained_on"] == 4
    assert trainer.counters["rollouts"] - before["rollouts"] == 4


# ---- 4. Ray: actors on the trainer's device, units ahead of pull(), close() ---------------------

class _FakeRay:
    """The slice of the `ray` API RaySource uses, recording placement and calls."""

    class exceptions:
        RayActorError = ActorDiedError = ActorUnavailableError = RuntimeError

    def __init__(self, gpus):
        self.initialized, self.shutdowns, self.gpus = False, 0, gpus
        self.options, self.specs, self.calls = None, [], []

    def is_initialized(self):
        return self.initialized

    def init(self, **kw):
        self.initialized = True

    def shutdown(self):
        self.initialized, self.shutdowns = False, self.shutdowns + 1

    def cluster_resources(self):
        return {"CPU": 2.0, "GPU": float(self.gpus)}

    def put(self, x):
        return object()

    def kill(self, actor, no_restart=True):
        pass

    def remote(self, **options):
        import types
        self.options = options
        fake = self

        def actor(spec):
            fake.specs.append(spec)
            gen = types.SimpleNamespace(remote=lambda *a: fake.calls.append(a) or object())
            return types.SimpleNamespace(generate=gen)
        return lambda cls: types.SimpleNamespace(remote=actor)


def test_ray_actors_use_the_gpu_get_units_ahead_and_close_their_ray(trainer, monkeypatch):
    import types

    from scaling_rl.llm.ray_source import RaySource
    cfg = GRPOConfig(**{**TINY, "rollout": "ray", "searchers": 2, "max_staleness": 2})
    fake_trainer = types.SimpleNamespace(cfg=cfg, step=0, model=trainer.model,
                                         tokenizer=trainer.tokenizer, device=torch.device("cuda"))
    ray = _FakeRay(gpus=1)
    monkeypatch.setitem(sys.modules, "ray", ray)
    src = RaySource(fake_trainer)
    assert ray.options["num_gpus"] == 0.5 and {s["device"] for s in ray.specs} == {"cuda"}
    # η = 2, K = 2 units per step: steps 0..2 (units 0..5) start now, before any pull(), queued
    # three per actor; a new version unlocks step 3
    assert sorted(c[0] for c in ray.calls) == [0, 1, 2, 3, 4, 5]       # first group of each unit
    assert [c[4] for c in ray.calls].count(0) == 3
    src.publish(trainer.model, 1)
    assert len(ray.calls) == 8
    src.close()
    assert ray.shutdowns == 1 and not ray.initialized                 # it started Ray: it stops it
    no_gpu = _FakeRay(gpus=0)
    monkeypatch.setitem(sys.modules, "ray", no_gpu)
    with pytest.raises(ValueError, match="^device: cuda with rollout=ray, but the Ray cluster has no GPU"):
        RaySource(fake_trainer)                                       # no silent CPU fallback
    assert no_gpu.shutdowns == 1


# ---- 5. weight shipping and per-step reads ------------------------------------------------------

def test_weights_ship_each_tensor_once_by_value_and_load_back(trainer):
    from transformers import AutoModelForCausalLM

    from scaling_rl.llm import sources
    model = trainer.model
    full = model.state_dict()
    state = sources.cpu_state(model)
    # the tied LM head is the embedding: listed twice by state_dict(), shipped once
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert set(full) - set(state) == {"lm_head.weight"}
    assert sum(v.numel() for v in state.values()) == sum(p.numel() for p in model.parameters())
    packed = sources.pack_state(state)           # numpy: by value through a pipe, no /dev/shm
    assert all(isinstance(v, np.ndarray) for v in packed.values())
    twin = AutoModelForCausalLM.from_config(model.config, attn_implementation="sdpa")
    sources.load_weights(twin, packed)
    for k, v in twin.state_dict().items():
        assert torch.equal(v, full[k]), k
    with pytest.raises(KeyError, match="model.norm.weight"):
        sources.load_weights(twin, {k: v for k, v in packed.items() if k != "model.norm.weight"})


class _ScalarReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts tensor -> Python scalar reads (a device sync each on a GPU)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
        return func(*args, **(kwargs or {}))


def test_pipeline_decode_reads_the_device_once_per_step_not_per_row(trainer):
    from scaling_rl.llm import inflight
    tok = trainer.tokenizer
    requests = [(i, tok("12+34=", add_special_tokens=False)["input_ids"]) for i in range(8)]
    polls, done = [0], {}

    def poll(idle):
        polls[0] += 1
        return 0

    with _ScalarReads() as reads:
        inflight.decode_stream(trainer.model, slots=8,
                               next_request=lambda: requests.pop(0) if requests else None,
                               poll=poll, emit=lambda k, *rest: done.__setitem__(k, rest),
                               should_stop=lambda: len(done) == 8, max_new_tokens=6,
                               eos_id=(), pad_id=tok.pad_token_id,
                               generator=torch.Generator().manual_seed(0))
    assert len(done) == 8 and all(len(v[1]) == 6 for v in done.values())
    # 8 live rows x 6 steps: 4 reads per row per step would be 192; now a few per step
    assert reads.n <= 3 * polls[0], (reads.n, polls[0])
