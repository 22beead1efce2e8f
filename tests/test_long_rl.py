"""Long-RL's MR-SP at micro scale (issue 25): video policy, long-video task, embedding cache,
sequence-parallel log-probs over gloo workers, and `multimodal=video` GRPO through the CLI."""
import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl.cli import main  # noqa: E402
from scaling_rl.llm.models import char_tokenizer, load_policy, save_policy, tiny_model  # noqa: E402
from scaling_rl.llm.multimodal import (EmbeddingCache, VideoLM, sample_video, split_range,  # noqa: E402
                                       video_lm_from, video_logprobs)
from scaling_rl.llm.seq_parallel import launch, sp_completion_logprobs, sp_logprobs  # noqa: E402
from scaling_rl.llm.trainer import GRPOConfig  # noqa: E402
from scaling_rl.llm.video_task import VideoCountTask  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def video_model():
    tok = char_tokenizer()
    lm = tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, seed=3)
    model = video_lm_from(lm, frame_dim=8, encoder_hidden=16, frames_per_token=1, seed=3).eval()
    return model, tok


@pytest.fixture(scope="module")
def sp_inputs(video_model):
    model, _ = video_model
    g = torch.Generator().manual_seed(0)
    frames = torch.randn(2, 37, 8, generator=g)
    question = torch.tensor([5, 6, 7])
    completion = torch.randint(3, 20, (2, 4), generator=g)
    with torch.no_grad():
        prefix = model.prefix_embeds(model.encode_frames(frames), question)
        ref, _ = video_logprobs(model, prefix, completion)
    return frames, prefix, completion, ref


def test_video_lm_keeps_lm_weights_and_round_trips(tmp_path, video_model):
    model, tok = video_model
    lm = tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, seed=3)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():  # same LM: text-only logits unchanged by the wrap
        torch.testing.assert_close(model(input_ids=ids).logits, lm(input_ids=ids).logits)
    save_policy(model, tok, tmp_path)
    loaded, _ = load_policy(str(tmp_path))
    assert isinstance(loaded, VideoLM) and loaded.config.frame_dim == 8
    frames = torch.randn(1, 6, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode_frames(frames), model.encode_frames(frames))
        assert loaded.encode_frames(frames).shape == (1, 6, 32)


def test_sampling_logprobs_match_scoring_pass(video_model, sp_inputs):
    model, tok = video_model
    _, prefix, _, _ = sp_inputs
    g = torch.Generator().manual_seed(1)
    b = sample_video(model, prefix, max_new_tokens=5, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                     temperature=1.0, generator=g, record_logp=True)
    assert b.completion_ids.shape == (2, 5) and b.prompt_ids.shape == (2, 0)
    with torch.no_grad():
        logp, _ = video_logprobs(model, prefix, b.completion_ids)
    m = b.completion_mask.bool()
    torch.testing.assert_close(logp[m], b.logp[m], atol=1e-5, rtol=1e-5)


def test_frames_per_token_groups_frames(video_model):
    model, _ = video_model
    pooled = video_lm_from(tiny_model(char_tokenizer(), hidden_size=32, num_heads=4), frame_dim=8,
                           encoder_hidden=16, frames_per_token=4)
    x = torch.randn(1, 12, 8)
    assert pooled.encode_frames(x).shape == (1, 3, 32)
    assert pooled.frame_encoder.flops(12) == 2 * 3 * (4 * 8 * 16 + 16 * 32)
    with pytest.raises(ValueError, match="frames_per_token"):
        pooled.encode_frames(torch.randn(1, 10, 8))


def test_video_task_is_deterministic_verifiable_and_harder_when_longer():
    short, long = VideoCountTask(frames=64), VideoCountTask(frames=1024)
    p = short.problems("train", 50, seed=0)
    assert [q.id for q in p] == [q.id for q in short.problems("train", 50, seed=0)]
    assert not {q.id for q in p} & {q.id for q in short.problems("test", 200, seed=0)}
    counts = np.array([q.target for q in p])
    assert counts.min() >= 1 and counts.max() <= 4 and len(set(counts)) == 4
    q = p[0]
    x = short.video(q)
    assert x.shape == (64, 16) and np.array_equal(x, short.video(q))
    # flash frames stand out along the pattern; the count is the answer
    along = (x - x.mean(0)) @ short.pattern / np.linalg.norm(short.pattern)
    assert set(np.argsort(along)[-q.target:]) == set(q.numbers)
    assert short.reward(q, q.answer, True) == 1.0
    assert short.reward(q, q.answer, False) == 0.0 and short.reward(q, "x", True) == 0.0
    wrong = str(q.target % 4 + 1)
    assert short.reward(q, wrong, True) == 0.0
    # same 1..4 flashes, 16x the frames: a 16x smaller share of the tokens
    share = lambda t: np.mean([len(r.numbers) / t.frames for r in t.problems("train", 200, 0)])  # noqa: E731
    assert share(short) / share(long) == pytest.approx(16, rel=0.15)


def test_embedding_cache_equals_reencoding_and_counts_flops(video_model):
    model, _ = video_model
    cache = EmbeddingCache(model)
    frames = torch.randn(5, 8)
    slot = cache.put("a", frames)
    assert cache.put("a", frames) == slot  # encoded once
    with torch.no_grad():
        fresh = model.encode_frames(frames[None])[0]
    for _ in range(4):
        assert torch.equal(cache.get(slot), fresh)
    f = model.frame_encoder.flops(5)
    assert cache.encoder_flops == f and cache.encoder_flops_saved == 3 * f
    assert torch.equal(cache.gather([slot, slot]), torch.stack([fresh, fresh]))


def _split_encode(rank, world, model, frames):
    cache = EmbeddingCache(model)
    return cache.get(cache.put(0, frames)).numpy()


def test_split_encoding_across_workers_equals_one_process(video_model):
    model, _ = video_model
    frames = torch.randn(11, 8)   # 11 frames over 3 workers: shares 4, 4, 3
    assert [split_range(11, 3, r) for r in range(3)] == [(0, 4), (4, 8), (8, 11)]
    with torch.no_grad():
        fresh = model.encode_frames(frames[None])[0].numpy()
    for out in launch(_split_encode, 3, model, frames):  # fp32 rounding: matmuls of 4 vs 11 rows
        np.testing.assert_allclose(out, fresh, atol=1e-6, rtol=1e-5)


def _sp_pass(rank, world, model, prefix, completion):
    whole = sp_completion_logprobs(model, prefix, completion).numpy()
    # pieces: frame tokens | question (views); only this worker's slice is built from them
    pieces = [prefix[:, :37], prefix[:, 37:]]
    return whole, sp_completion_logprobs(model, pieces, completion).numpy()


@pytest.mark.parametrize("world", [2, 3])
def test_sequence_parallel_logprobs_equal_single_process(video_model, sp_inputs, world):
    model, _ = video_model
    _, prefix, completion, ref = sp_inputs
    L = prefix.shape[1] + completion.shape[1] - 1
    assert L % world  # 43 tokens: the last slice is padded
    outs = launch(_sp_pass, world, model, prefix, completion)
    for whole, pieces in outs:
        np.testing.assert_allclose(whole, ref.numpy(), atol=2e-6, rtol=1e-5)
        np.testing.assert_array_equal(pieces, whole)
    # and the same function without a process group is the plain pass
    with torch.no_grad():
        emb = torch.cat([prefix, model.get_input_embeddings()(completion[:, :-1])], dim=1)
    labels = torch.full(emb.shape[:2], -1)
    labels[:, -1] = 3
    one = sp_logprobs(model, emb, labels)
    assert (one[:, :-1] == 0).all() and (one[:, -1] < 0).all()


FAST = dict(multimodal="video", frames=24, frame_dim=8, frame_encoder_hidden=16, hidden_size=32,
            sft_steps=4, sft_batch_size=8, steps=2, prompts_per_step=2, group_size=4,
            eval_problems=8, train_pool=32, checkpoint_every=1, eval_every=1, num_iterations=2,
            beta=0.05)


def test_grpo_cli_multimodal_video(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["grpo", "--out", str(out), "--quiet"] + [f"{k}={str(v).lower()}" for k, v in FAST.items()]
    assert main(argv) == 0
    assert "grpo: 2 steps" in capsys.readouterr().out
    df = pd.read_parquet(out / "metrics.parquet")
    assert list(df["step"]) == [0, 1, 2] and df["eval/accuracy"].notna().all()
    # per video and step: G rollouts + G rows in each of old, reference and 2 training passes = 5G
    # uses of one encoding (4 frames x ... flops each): 5G - 1 saved per encoding made
    rows = df[df.step > 0]
    ratio = rows["encoder_flops_saved"].iloc[-1] / rows["encoder_flops"].iloc[-1]
    assert ratio == 5 * FAST["group_size"] - 1
    base, _ = load_policy(str(out / "base_model"))
    final, _ = load_policy(str(out / "checkpoints" / "step_000002" / "model"))
    assert isinstance(final, VideoLM)
    enc_b, enc_f = base.frame_encoder.state_dict(), final.frame_encoder.state_dict()
    assert all(torch.equal(enc_b[k], enc_f[k]) for k in enc_b)   # frozen in GRPO
    assert not torch.equal(base.lm_head.weight, final.lm_head.weight)  # the LM learned
    # resume: extend to 3 steps from the checkpoint
    assert main(argv[:4] + [a for a in argv[4:] if not a.startswith("steps=")] + ["steps=3"]) == 0
    assert list(pd.read_parquet(out / "metrics.parquet")["step"]) == [0, 1, 2, 3]


@pytest.mark.parametrize("bad, msg", [
    (dict(multimodal="audio"), "multimodal: 'audio' is unknown"),
    (dict(rollout="async"), "rollout: 'async' must be sync"),
    (dict(frames=10, frames_per_token=4), "frames: 10 is not divisible"),
    (dict(model="tiny:llama"), "model: 'tiny:llama' must be tiny"),
])
def test_video_config_errors(bad, msg):
    with pytest.raises(ValueError, match=msg):
        GRPOConfig.from_dict({**FAST, **bad})


def test_plain_trainer_run_refuses_multimodal(tmp_path):
    from scaling_rl.llm import trainer
    with pytest.raises(ValueError, match="multimodal: 'video' needs its trainer"):
        trainer.run(FAST, tmp_path / "r")
    assert not (tmp_path / "r").exists()


def _sp_grads(rank, world, model, prefix, completion, weights):
    from scaling_rl.llm.seq_parallel import all_reduce_grads
    model.zero_grad(set_to_none=True)
    logp = sp_completion_logprobs(model, prefix, completion, grad=True)
    (logp * weights).sum().backward()
    all_reduce_grads(model)
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("world", [2, 3])
def test_sequence_parallel_training_forward_has_the_single_process_gradients(video_model, sp_inputs, world):
    """With grad=True the SP pass is a training forward: after backward and the gradient
    all-reduce, every worker holds the gradients of the one-process pass (the prefix, frame tokens
    + question embeddings, is given: the encoder is frozen in GRPO)."""
    import copy
    model, _ = video_model
    _, prefix, completion, _ = sp_inputs
    model = copy.deepcopy(model)
    model.frame_encoder.requires_grad_(False)
    weights = torch.randn(completion.shape, generator=torch.Generator().manual_seed(2))
    model.zero_grad(set_to_none=True)
    ref_logp, _ = video_logprobs(model, prefix, completion)
    (ref_logp * weights).sum().backward()
    ref = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    assert len(ref) > 10
    for grads in launch(_sp_grads, world, model, prefix, completion, weights):
        assert set(grads) == set(ref)
        for n in ref:
            np.testing.assert_allclose(grads[n], ref[n], atol=2e-5, rtol=1e-4, err_msg=n)


def _sp_grads_no_kv_reduce(rank, world, model, prefix, completion, weights):
    from scaling_rl.llm import seq_parallel
    seq_parallel._GatherKV.backward = staticmethod(
        lambda ctx, g: (g[..., ctx.rank * ctx.C:(ctx.rank + 1) * ctx.C, :], None))
    return _sp_grads(rank, world, model, prefix, completion, weights)


def test_the_gradient_check_fails_without_the_key_value_all_reduce(video_model, sp_inputs):
    import copy
    model, _ = video_model
    _, prefix, completion, _ = sp_inputs
    model = copy.deepcopy(model)
    model.frame_encoder.requires_grad_(False)
    weights = torch.ones(completion.shape)
    model.zero_grad(set_to_none=True)
    logp, _ = video_logprobs(model, prefix, completion)
    logp.sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    grads = launch(_sp_grads_no_kv_reduce, 2, model, prefix, completion, weights)[0]
    assert max(float(np.abs(grads[n] - ref[n].numpy()).max()) for n in ref) > 1e-3


def _one_update(sp_workers: int, serve=None, monkeypatch=None):
    """A video trainer's first GRPO update (2 minibatches x 2 iterations, KL to the reference) on
    a fixed rollout with mixed rewards: (its metrics, parameters before, after, the trainer)."""
    from scaling_rl.llm import video_grpo
    if serve is not None:
        monkeypatch.setattr(video_grpo, "_serve", serve)
    torch.manual_seed(0)
    tr = video_grpo.VideoGRPOTrainer(GRPOConfig.from_dict({**FAST, "sp_workers": sp_workers,
                                                           "num_minibatches": 2}))
    tr.setup()
    tr.measure_update_memory = True
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.cache.clear()
    tr._cache_before = (0, 0)
    batch, _ = tr._rollout(tr.pool[:2])
    rewards = np.array([[1, 0, .5, 0], [0, 1, 1, 0]], dtype=np.float32)
    try:
        out = tr._update(batch, rewards)
        return out, before, {k: v.clone() for k, v in tr.model.state_dict().items()}, tr
    finally:
        tr.close()


def test_the_sequence_parallel_update_equals_the_one_process_update():
    """sp_workers=2: the update's old / reference / training passes run on two ranks (this process
    and a forked worker), each over half of every sequence; the objective's gradient goes to the
    worker, both sum their gradients and step. The parameters end as the one-process update's (to
    float32 rounding, far below the update's size), and every rank reported its update memory."""
    one, before, p1, _ = _one_update(1)
    two, _, p2, tr = _one_update(2)
    assert tr.sp is None and not torch.distributed.is_initialized()   # closed
    for k in ("loss", "grad_norm", "entropy", "kl"):
        assert two[k] == pytest.approx(one[k], rel=1e-4, abs=1e-7), k
    step = max(float((p1[k] - before[k]).abs().max()) for k in before)
    diff = max(float((p1[k] - p2[k]).abs().max()) for k in before)
    assert step > 1e-4 and diff < 1e-2 * step, (diff, step)
    assert len(tr.update_peak_kib) == 2 and all(k > 0 for k in tr.update_peak_kib)


def _failing_serve(rank, world, *args):
    raise ValueError("boom in the worker")


def test_a_failing_sequence_parallel_worker_is_a_clear_error(monkeypatch):
    with pytest.raises(RuntimeError, match=r"(?s)sequence-parallel worker 1 failed.*boom in the worker"):
        _one_update(2, _failing_serve, monkeypatch)
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("bad, msg", [
    (dict(multimodal="", sp_workers=2), "sp_workers: 2 > 1 needs multimodal=video"),
    (dict(sp_workers=2, device="cuda"), "sp_workers: 2 > 1 runs forked gloo CPU workers"),
    (dict(sp_workers=0), "sp_workers: 0 must be >= 1"),
])
def test_sequence_parallel_config_errors(bad, msg):
    with pytest.raises(ValueError, match=msg):
        GRPOConfig.from_dict({**FAST, **bad})
