"""Rollout layer and trainer fixes: sync = today's trainer bitwise, staleness bound, in-flight
weight updates, TBA replay, plug-in tasks, EOS ids, dapo normaliser, config errors."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl.llm import inflight, rollout, sources, tasks  # noqa: E402
from scaling_rl.llm.models import load_policy  # noqa: E402
from scaling_rl.llm.trainer import GRPOConfig, GRPOTrainer, run  # noqa: E402

torch.set_num_threads(1)
TINY = dict(sft_steps=40, format_reward=0.5, prompts_per_step=4, group_size=4, eval_problems=16,
            train_pool=64, checkpoint_every=10, eval_every=1, hidden_size=32, num_heads=2)

# Metrics of the trainer before the rollout layer (commit 2d11f18) for this config, as float.hex.
# The sync source samples the same completions (rewards bit for bit); since the selective
# log-softmax (issue 20: no full-vocabulary log-softmax) the log-probs differ in the last bits, so
# loss / grad_norm / entropy agree to 5e-6 relative and kl (~1e-4) to 1e-8 absolute.
GOLDEN_CFG = dict(TINY, steps=3, num_iterations=2, beta=0.05, loss_type="dapo", epsilon_high=0.28)
GOLDEN = {
    "reward": ["0x1.0000000000000p-2", "0x1.6000000000000p-2", "0x1.c000000000000p-3"],
    "loss": ["0x1.c1bb0e0000000p-4", "0x1.c6c5930000000p-4", "0x1.5936860000000p-4"],
    "grad_norm": ["0x1.3ec2e30000000p+0", "0x1.3ba5630000000p+0", "0x1.82a6e80000000p-1"],
    "kl": ["0x1.1c484c0000000p-14", "0x1.f02b8e0000000p-12", "0x1.09c97f8000000p-9"],
    "entropy": ["0x1.2148420000000p+1", "0x1.247a920000000p+1", "0x1.20458c0000000p+1"],
}


def test_sync_source_reproduces_the_pre_rollout_layer_trainer(tmp_path):
    df = run(GOLDEN_CFG, tmp_path / "sync")
    assert [float(x).hex() for x in df["reward"].iloc[1:]] == GOLDEN["reward"]
    for col, want in GOLDEN.items():
        np.testing.assert_allclose(df[col].iloc[1:].to_numpy(), [float.fromhex(x) for x in want],
                                   rtol=5e-6, atol=1e-8, err_msg=col)
    assert (df["staleness_max"].iloc[1:] == 0).all()   # sync: every token from the current version


def test_config_errors_are_one_line():
    for kw, msg in [(dict(temperature=0.0), "^temperature: 0.0 must be > 0 for training"),
                    (dict(rollout="vllm"), "^rollout: 'vllm' is unknown"),
                    (dict(objective="ppo"), "^objective: 'ppo' is unknown"),
                    (dict(rollout="async", dynamic_sampling=True), "^rollout: 'async' cannot use"),
                    (dict(task="jsonl"), "^dataset: '' is empty"),
                    (dict(reward="nope"), "^reward: 'nope' is not registered"),
                    (dict(device="gpu0"), "^device: 'gpu0' is not a torch device"),
                    (dict(max_staleness=0), "^max_staleness: 0 must be >= 1"),
                    (dict(is_cap=0.5), "^is_cap: 0.5 must be >= 1"),
                    (dict(rollout="ray", searchers=3), "^searchers: 3 must divide prompts_per_step=16"),
                    (dict(rollout="tba", replay_capacity=8), "^replay_capacity: 8 must hold")]:
        with pytest.raises(ValueError, match=msg) as e:
            GRPOConfig(**kw)
        assert "\n" not in str(e.value)


def test_dapo_divides_every_minibatch_by_the_generation_batch_token_count(monkeypatch):
    cfg = GRPOConfig(**dict(TINY, sft_steps=0, steps=1, num_minibatches=4, loss_type="dapo"))
    trainer = GRPOTrainer(cfg)
    seen = []
    trainer.setup()                 # builds the objective (its max_len needs the tokenizer)
    inner = trainer.objective
    trainer.objective = lambda *a: (seen.append((float(a[4].sum()), float(a[5]))), inner(*a))[1]
    try:
        data = trainer.collect()
        trainer._update(data["batch"], data["rewards"])
    finally:
        trainer.close()
    total = float(data["batch"].completion_mask.sum())
    assert len(seen) == 4 and all(n == total for _, n in seen)   # TRL's num_items_in_batch
    assert sum(tokens for tokens, _ in seen) == total


def test_every_eos_id_of_the_generation_config_stops_a_row():
    model, tok = load_policy("tiny", hidden_size=32, num_heads=2)
    ids, mask = rollout.encode_prompts(tok, ["12+34="] * 16)
    gen = torch.Generator().manual_seed(0)
    free = rollout.sample(model, ids, mask, max_new_tokens=8, eos_id=tok.eos_token_id,
                          pad_id=tok.pad_token_id, generator=gen)
    common = int(torch.mode(free.completion_ids[:, 0]).values)  # a token the model often emits
    model.generation_config.eos_token_id = [tok.eos_token_id, common]
    stops = rollout.stop_ids(model, tok)
    assert set(stops) == {tok.eos_token_id, common}
    b = rollout.sample(model, ids, mask, max_new_tokens=8, eos_id=stops, pad_id=tok.pad_token_id,
                       generator=torch.Generator().manual_seed(0), record_logp=True, version=3)
    for row, m, fin in zip(b.completion_ids, b.completion_mask, b.finished):
        hits = torch.isin(row, torch.tensor(stops)).nonzero()
        if len(hits):
            first = int(hits[0])
            assert fin and m[:first + 1].all() and not m[first + 1:].any()
            assert (row[first + 1:] == tok.pad_token_id).all()
    assert b.finished.sum() >= (free.completion_ids[:, 0] == common).sum()
    assert (b.versions == 3).all() and b.logp.shape == b.completion_ids.shape
    # behaviour log-probs equal a full forward's log-probs of the same tokens
    lp, _ = rollout.completion_logprobs(model, ids, mask, b.completion_ids, b.completion_mask)
    torch.testing.assert_close(b.logp * b.completion_mask, lp.detach() * b.completion_mask,
                               rtol=1e-4, atol=1e-5)


def test_jsonl_task_registered_reward_and_chat_template(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "level": a % 3} for a in range(40)]
    rows.append({"prompt": "9+9=", "answer": "18", "split": "test", "level": 0})
    path.write_text("\n".join(json.dumps(r) for r in rows))

    @tasks.register_reward("level_bonus", overwrite=True)
    def level_bonus(problem, completion, finished):
        return tasks.exact_match(problem, completion, finished) + 0.1 * problem.info["level"]

    task = tasks.make_task("jsonl", dataset=str(path), reward="level_bonus")
    p = next(q for q in task.problems("train", 100, 0) if q.info["level"] == 1)
    assert task.reward(p, p.answer, True) == pytest.approx(1.1)
    assert task.reward(p, p.answer, False) == pytest.approx(0.1)
    assert task.reward(p, p.answer + "0", True) == pytest.approx(0.1)
    assert any(q.prompt == "9+9=" for q in task.problems("test", 100, 0))
    add = tasks.make_task("addition", reward="exact_match")        # reward replaced by name
    q = add.problem(712)
    assert add.reward(q, "019", True) == 1.0 and add.reward(q, "19", True) == 0.0
    with pytest.raises(ValueError, match="^dataset: line 1 of"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"answer": 1}\n')
        tasks.JsonlTask(bad)
    _, tok = load_policy("tiny", hidden_size=32, num_heads=2)
    assert rollout.render_prompts(tok, ["1+1="], True) == ["1+1="]    # no template: unchanged
    tok.chat_template = "{% for m in messages %}u:{{ m['content'] }};{% endfor %}a:"
    assert rollout.render_prompts(tok, ["1+1="], True) == ["u:1+1=;a:"]
    assert rollout.render_prompts(tok, ["1+1="], False) == ["1+1="]
    # a GRPO run on the JSONL task with the plug-in reward, bf16 autocast on the CPU
    df = run(dict(TINY, sft_steps=5, steps=1, task="jsonl", dataset=str(path),
                  reward="level_bonus", bf16=True, eval_problems=4), tmp_path / "run")
    assert np.isfinite(df["loss"].iloc[-1]) and df["reward"].iloc[-1] >= 0


def _swap_weights(model, states):
    model.load_state_dict(states)


def _replay_logps(model, states, prompt, tokens, versions, temperature=1.0):
    """Log-probs of `tokens` decoded one at a time with a KV cache, switching to the weights
    of `versions[t]` before the forward pass that produces token t's logits."""
    kw, cache = rollout._new_cache(model)
    out = []
    with torch.no_grad():
        _swap_weights(model, states[versions[0]])
        logits = model(input_ids=torch.tensor([prompt]), use_cache=True, **{kw: cache}).logits[:, -1]
        out.append(float(rollout.token_logp(logits, torch.tensor([tokens[0]]), temperature)))
        for t in range(1, len(tokens)):
            _swap_weights(model, states[versions[t]])
            pos = torch.tensor([[len(prompt) + t - 1]])
            logits = model(input_ids=torch.tensor([[tokens[t - 1]]]), position_ids=pos,
                           use_cache=True, **{kw: cache}).logits[:, -1]
            out.append(float(rollout.token_logp(logits, torch.tensor([tokens[t]]), temperature)))
    return out


def test_inflight_updates_keep_the_cache_and_refill_slots():
    model, tok = load_policy("tiny", hidden_size=32, num_heads=2, seed=1)
    v0 = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    v1 = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in v0.items()}
    states = {0: v0, 1: v1}
    prompts = ["12+34=", "5+6=", "99+1=", "3,4,5:12=", "7+8=", "1+1="]
    requests = [(i, tok(p, add_special_tokens=False)["input_ids"]) for i, p in enumerate(prompts)]
    stops = tuple(tok.convert_tokens_to_ids(list("0123")))   # frequent stops: ragged lengths
    done, polls, started = {}, [0], []
    version = [0]

    def poll(idle):
        polls[0] += 1
        if polls[0] == 4:                     # new weights between decode steps 3 and 4
            _swap_weights(model, v1)
            version[0] = 1
        return version[0]

    def next_request():
        if not requests:
            return None
        started.append((requests[0][0], polls[0]))
        return requests.pop(0)

    inflight.decode_stream(model, slots=3, next_request=next_request, poll=poll,
                           emit=lambda k, *rest: done.__setitem__(k, rest),
                           should_stop=lambda: len(done) == len(prompts), max_new_tokens=10,
                           eos_id=stops, pad_id=tok.pad_token_id,
                           generator=torch.Generator().manual_seed(3))
    assert sorted(done) == list(range(len(prompts)))
    assert any(p > 1 for _, p in started)        # later requests started mid-stream (refills)
    spanning = [k for k, (_, _, _, vs, _) in done.items() if len(set(vs)) == 2]
    assert spanning, "no sequence spans the weight update"
    for k, (prompt, toks, lps, vs, finished) in done.items():
        assert vs == sorted(vs) and set(vs) <= {0, 1}
        assert finished == (toks[-1] in stops) and (finished or len(toks) == 10)
        np.testing.assert_allclose(lps, _replay_logps(model, states, prompt, toks, vs),
                                   rtol=1e-4, atol=1e-4)
    _swap_weights(model, v0)


def test_async_source_replaces_a_killed_worker_without_double_counting():
    import os
    import signal
    cfg = GRPOConfig(**dict(TINY, sft_steps=0, steps=3, rollout="async",
                            objective="decoupled_ppo", max_staleness=1))
    trainer = GRPOTrainer(cfg)
    try:
        trainer.setup()
        rows = [trainer.train_step()]
        victim = trainer.source.worker.proc
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=10)
        rows += [trainer.train_step(), trainer.train_step()]
        src = trainer.source
        assert src.restarts == 1 and src.worker.proc.pid != victim.pid
        assert src.consumed == list(range(3 * 4))        # each group once, none lost
        # groups the killed worker (id 0) had finished may be used; once its replacement (id 1)
        # delivers, nothing of the dead worker's reaches a batch again
        assert src.consumed_from == sorted(src.consumed_from) and src.consumed_from[-1] == 1
        assert trainer.counters["trained_on"] == 3 * 4 * 4
        assert trainer.counters["rollouts"] >= 3 * 4 * 4  # + groups received ahead of their step
        assert rows[-1]["source/restarts"] == 1 and max(r["staleness_max"] for r in rows) <= 1
        worker = src.worker.proc
    finally:
        trainer.close()
    assert not worker.is_alive()                         # close() stops the replacement too


def test_replay_buffer_mix_and_resumable_state():
    def group(i, r):
        b = rollout.Batch(*(torch.zeros(2, 3, dtype=torch.long) for _ in range(4)),
                          torch.ones(2, dtype=torch.bool))
        return sources.Group(i, i, b, np.array([r, r], np.float32))
    buf = sources.ReplayBuffer(capacity=8, reward_fraction=0.5, temperature=0.05, seed=0)
    for i in range(10):
        buf.add(group(i, 1.0 if i in (3, 4) else 0.0))
    assert len(buf) == 8 and buf.groups[0].index == 2            # oldest two dropped
    picked = [g.index for g in buf.sample(4)]
    assert {8, 9} <= set(picked)                                 # recency half: the newest two
    assert set(picked) - {8, 9} == {3, 4}                        # reward half: the rewarded ones
    state = buf.state_dict()
    twin = sources.ReplayBuffer(capacity=8, reward_fraction=0.5, temperature=0.05, seed=99)
    twin.load_state_dict(state)
    assert [[g.index for g in buf.sample(4)] for _ in range(5)] == \
        [[g.index for g in twin.sample(4)] for _ in range(5)]
    with pytest.raises(ValueError, match="replay"):
        sources.ReplayBuffer(8, 0.5, 1.0, 0).sample(2)
