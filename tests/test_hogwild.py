"""Hogwild! Inference: one worker is ordinary KV-cached sampling; with several workers every
worker's logits equal its view laid out contiguously (the model's own forward on the full
sequence where each token's context was that prefix; the naive re-encoding of the stored keys
in general), to 1e-5 on CPU; a wrong view layout or a missing query rotation breaks both; the
`rollout=hogwild` source trains with behaviour log-probs and versions."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl.llm import hogwild, rollout  # noqa: E402
from scaling_rl.llm.models import load_policy  # noqa: E402

torch.set_num_threads(1)
TOL = 1e-5


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def policy(request):
    model, tok = load_policy(f"tiny:{request.param}", seed=1)
    model.eval()
    ids, mask = rollout.encode_prompts(tok, ["12+3=", "114+25="])   # left-padded
    return model, tok, ids, mask


def _gen(policy, **kw):
    model, tok, ids, mask = policy
    kw.setdefault("generator", torch.Generator().manual_seed(0))
    return hogwild.generate(model, ids, mask, max_new_tokens=10, eos_id=rollout.stop_ids(model, tok),
                            pad_id=tok.pad_token_id, record_logp=True, **kw)


@pytest.mark.parametrize("layout", hogwild.LAYOUTS)
def test_one_worker_is_ordinary_kv_cached_sampling(policy, layout):
    model, tok, ids, mask = policy
    ref = rollout.sample(model, ids, mask, max_new_tokens=10, eos_id=rollout.stop_ids(model, tok),
                         pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0),
                         record_logp=True)
    got = _gen(policy, workers=1, layout=layout, step_tokens=3)
    assert torch.equal(got.completion_ids, ref.completion_ids)
    assert torch.equal(got.completion_mask, ref.completion_mask)
    np.testing.assert_allclose(got.logp, ref.logp, atol=TOL)
    assert torch.equal(got.prompt_ids, ids) and got.versions.eq(0).all()


def _forced(cache, W, writer, tokens, stepper):
    """Feed `tokens` (one per step) to worker `writer` only; its logits per step."""
    out = []
    for t in tokens:
        tok = torch.full((cache.B, W), 5)
        tok[:, writer] = t
        write = torch.zeros(cache.B, W, dtype=torch.bool)
        write[:, writer] = True
        out.append(stepper(tok, write)[:, writer])
    return torch.stack(out, 1)                                          # (B, steps, vocab)


@pytest.mark.parametrize("layout", hogwild.LAYOUTS)
def test_logits_equal_a_full_forward_of_the_view(policy, layout):
    """Worker 0 writes a, then worker 2 writes b: worker 2's view is [prompt, a, (empty block 1),
    b] (interleaved: a's first step and later a's rest and b's first step are committed to the
    history on the way) and every token was written seeing exactly its prefix of it, so the
    model's ordinary forward over prompt + a + b (no cache) must give the writer's logits."""
    model, tok, ids, mask = policy
    a, b = [7, 12, 9, 20], [15, 8, 30]
    with torch.inference_mode():
        cache = hogwild.SharedCache(model, ids, mask, workers=3, capacity=8, layout=layout,
                                    step_tokens=2)
        la = _forced(cache, 3, 0, a, cache.step)
        lb = _forced(cache, 3, 2, b, cache.step)
        full_ids = torch.cat([ids, torch.tensor([a + b] * 2)], 1)
        full_mask = torch.cat([mask, torch.ones(2, len(a + b), dtype=mask.dtype)], 1)
        ref = model(input_ids=full_ids, attention_mask=full_mask,
                    position_ids=rollout._positions(full_mask)).logits
    P = ids.shape[1]
    np.testing.assert_allclose(la, ref[:, P:P + len(a)], atol=TOL)
    np.testing.assert_allclose(lb, ref[:, P + len(a):], atol=TOL)
    if layout == "interleaved":
        assert cache.hist_len.tolist() == [6, 6]                        # two commits


def _lockstep(policy, layout, steps=9, W=3):
    """Hogwild! and naive caches fed the same tokens (some workers idle at some steps):
    (hogwild logits, naive logits, write masks, caches)."""
    model, tok, ids, mask = policy
    rng = np.random.default_rng(0)
    caches = [hogwild.SharedCache(model, ids, mask, workers=W, capacity=steps, layout=layout,
                                  step_tokens=3) for _ in range(2)]
    hw, nv, writes = [], [], []
    with torch.inference_mode():
        for _ in range(steps):
            tokens = torch.as_tensor(rng.integers(3, len(tok), size=(2, W)))
            write = torch.as_tensor(rng.random((2, W)) < 0.8)
            hw.append(caches[0].step(tokens, write))
            nv.append(caches[1].naive_step(tokens, write))
            writes.append(write)
    return torch.stack(hw, 1), torch.stack(nv, 1), torch.stack(writes, 1), caches


@pytest.mark.parametrize("layout", hogwild.LAYOUTS)
def test_every_worker_matches_its_view_re_encoded(policy, layout):
    hw, nv, writes, (c_hw, c_nv) = _lockstep(policy, layout)
    assert writes.any(-1).all() and not writes.all()
    diff = (hw - nv).abs().amax(-1)[writes]                             # rows that wrote
    assert float(diff.max()) < TOL
    for a, b in zip(c_hw.wk + c_hw.hk, c_nv.wk + c_nv.hk):               # the same keys stored
        np.testing.assert_allclose(a, b, atol=TOL)
    assert torch.equal(c_hw.L, c_nv.L) and torch.equal(c_hw.hist_len, c_nv.hist_len)


OFFSETS = hogwild.SharedCache.offsets


def _own_block_first(self):    # a wrong layout: own block right after the prompt
    off, pos = OFFSETS(self)
    base = self.n_prompt + self.hist_len
    return torch.where(torch.eye(self.W, dtype=torch.bool)[None], base[:, None, None],
                       off + self.L[:, :, None]), pos


def _no_rotation(self):        # queries not rotated per block (every block at offset 0)
    off, pos = OFFSETS(self)
    return torch.zeros_like(off), pos


@pytest.mark.parametrize("mutant", [_own_block_first, _no_rotation])
def test_exactness_checks_fail_when_layout_or_rotation_is_wrong(policy, monkeypatch, mutant):
    monkeypatch.setattr(hogwild.SharedCache, "offsets", mutant)
    hw, nv, writes, _ = _lockstep(policy, "contiguous")
    assert float((hw - nv).abs().amax(-1)[writes].max()) > 1e-3


@pytest.mark.parametrize("layout", hogwild.LAYOUTS)
def test_naive_generation_gives_the_same_samples(policy, layout):
    model, tok, ids, mask = policy
    headers = hogwild.header_ids(tok, 3)
    headers[1] = headers[1] + tok("ab", add_special_tokens=False)["input_ids"]  # unequal lengths
    got = _gen(policy, workers=3, layout=layout, step_tokens=4, headers=headers)
    ref = _gen(policy, workers=3, layout=layout, step_tokens=4, headers=headers, naive=True)
    assert got.completion_ids.shape == (6, 10)
    assert torch.equal(got.completion_ids, ref.completion_ids)
    np.testing.assert_allclose(got.logp, ref.logp, atol=TOL)
    # each row's prompt: the shared prompt, then its worker's header
    assert tok.decode(got.prompt_ids[4][got.prompt_mask[4].bool()]) == "114+25=worker 1: ab"


def test_the_shared_cache_holds_the_prompt_once(policy):
    model, tok, ids, mask = policy
    with torch.inference_mode():
        c = hogwild.SharedCache(model, ids, mask, workers=4, capacity=6)
    per_token = 2 * c.n_layers * c.Hkv * c.D * 4                       # k and v, fp32
    assert c.cache_bytes() == per_token * 2 * (ids.shape[1] + 4 * 6)
    assert c.view_bytes() == per_token * 2 * 4 * (ids.shape[1] + 4 * 6)


def test_bad_inputs_are_refused(policy):
    model, tok, ids, mask = policy
    with pytest.raises(ValueError, match="layout"):
        hogwild.SharedCache(model, ids, mask, workers=2, capacity=4, layout="diagonal")
    with pytest.raises(ValueError, match="headers"):
        _gen(policy, workers=2, headers=[[5]])
    from scaling_rl.llm.trainer import GRPOConfig
    with pytest.raises(ValueError, match="hogwild_workers"):
        GRPOConfig(rollout="hogwild", objective="tis", group_size=8, hogwild_workers=3)
    with pytest.raises(ValueError, match="hogwild_layout"):
        GRPOConfig(rollout="hogwild", objective="tis", hogwild_layout="x")
    model.config.model_type, kind = "gpt2", model.config.model_type
    try:
        with pytest.raises(ValueError, match="not supported"):
            hogwild.SharedCache(model, ids, mask, workers=2, capacity=4)
    finally:
        model.config.model_type = kind


def test_hogwild_needs_an_objective_that_corrects_for_the_shared_context():
    """Plain grpo would take the prompt-only log-probs as the sampling policy's: refused."""
    from scaling_rl.llm.trainer import GRPOConfig
    with pytest.raises(ValueError, match=r"^objective: 'grpo' cannot train on hogwild rollouts"):
        GRPOConfig(rollout="hogwild")
    with pytest.raises(ValueError, match="objective: 'grpo'"):
        GRPOConfig(rollout="hogwild", objective="grpo", num_iterations=2)
    for objective in hogwild.OFF_POLICY_OBJECTIVES:
        assert GRPOConfig(rollout="hogwild", objective=objective).objective == objective
    assert GRPOConfig(rollout="sync").objective == "grpo"          # elsewhere grpo stays the default


def test_rollout_hogwild_trains_with_behaviour_logprobs(tmp_path):
    from scaling_rl.llm.trainer import GRPOConfig, GRPOTrainer
    cfg = GRPOConfig(rollout="hogwild", objective="decoupled_ppo", hogwild_workers=2,
                     hogwild_layout="interleaved", hogwild_step_tokens=2, hogwild_prompt=True,
                     sft_steps=0, steps=2, prompts_per_step=2, group_size=4, eval_problems=4,
                     eval_every=2, checkpoint_every=2)
    trainer = GRPOTrainer(cfg, tmp_path)
    pulled, seen = [], []
    try:
        trainer.setup()
        assert type(trainer.source).__name__ == "HogwildSource"
        pull = trainer.source.pull
        trainer.source.pull = lambda: pulled.append(pull()) or pulled[-1]
        objective = trainer.policy_objective

        def spy(logp, prox, behav, *rest):
            seen.append((logp.detach().clone(), prox.clone(), behav.clone()))
            return objective(logp, prox, behav, *rest)
        trainer.policy_objective = spy
        df = trainer.train()
    finally:
        trainer.close()
    # the objective's behaviour log-probs are the shared-context ones recorded at sampling time,
    # not the prompt-only scores the trainer computes (those are the proximal / current policy)
    assert len(seen) == 2
    for (logp, prox, behav), data in zip(seen, pulled):
        m = data["batch"].completion_mask.bool()
        assert torch.equal(behav, data["batch"].logp)
        torch.testing.assert_close(prox, logp)
        assert float((behav - logp)[m].abs().max()) > 1e-3
    assert list(df["step"]) == [0, 1, 2] and np.isfinite(df["loss"].iloc[1:]).all()
    for step, data in enumerate(pulled):
        batch = data["batch"]
        assert batch.completion_ids.shape == (8, trainer.max_len)
        assert data["generated"].shape == (2, 4)
        m = batch.completion_mask.bool()
        assert batch.logp[m].lt(0).all() and batch.versions[m].eq(step).all()
        texts = trainer.tokenizer.batch_decode(batch.prompt_ids[:2], skip_special_tokens=True)
        assert texts[0].startswith("2 workers solve this together") and texts[0].endswith("worker 0: ")
        assert texts[1].endswith("worker 1: ")
    assert len(pulled) == 2


def test_rollout_hogwild_resumes_to_the_same_numbers(tmp_path):
    import pandas as pd

    from scaling_rl.llm.trainer import run
    cfg = dict(rollout="hogwild", objective="tis", hogwild_workers=2, sft_steps=0, steps=2,
               prompts_per_step=2, group_size=4, eval_problems=4, eval_every=1, checkpoint_every=1)
    full = run(cfg, tmp_path / "full")
    run(dict(cfg, steps=1), tmp_path / "part")
    resumed = run(cfg, tmp_path / "part")
    cols = ["reward", "loss", "rollouts", "eval/accuracy"]
    assert list(resumed["step"]) == [0, 1, 2]
    pd.testing.assert_frame_equal(full[cols], resumed[cols])


@pytest.mark.parametrize("layout", hogwild.LAYOUTS)
def test_a_step_reads_only_written_slots(policy, layout):
    """Unwritten block and history slots hold NaN: a step that attended over the whole capacity
    (a 0 weight times a NaN value is NaN) would return NaN; one over the written slots returns the
    clean cache's logits exactly."""
    model, tok, ids, mask = policy
    W, steps = 3, 5
    caches = [hogwild.SharedCache(model, ids, mask, workers=W, capacity=12, layout=layout,
                                  step_tokens=2) for _ in range(2)]
    for group in (caches[1].wk, caches[1].wv, caches[1].hk, caches[1].hv):
        for x in group:
            x.fill_(float("nan"))
    rng = np.random.default_rng(1)
    with torch.inference_mode():
        for _ in range(steps):
            tokens = torch.as_tensor(rng.integers(3, len(tok), size=(2, W)))
            write = torch.ones(2, W, dtype=torch.bool)
            clean, poisoned = caches[0].step(tokens, write), caches[1].step(tokens, write)
            assert torch.isfinite(poisoned).all()
            torch.testing.assert_close(poisoned, clean, atol=0, rtol=0)
