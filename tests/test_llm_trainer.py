"""GRPO trainer on a tiny offline model: rollouts, save/load, resume, CLI, and learning."""
import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl.cli import main  # noqa: E402
from scaling_rl.llm import rollout  # noqa: E402
from scaling_rl.llm.models import load_policy, save_policy  # noqa: E402
from scaling_rl.llm.tasks import AdditionTask, CountdownTask, evaluate_expression  # noqa: E402
from scaling_rl.llm.trainer import GRPOConfig, policy_path, run  # noqa: E402

torch.set_num_threads(1)  # tiny models: threads only contend
FAST = dict(sft_steps=10, steps=2, prompts_per_step=4, group_size=4, eval_problems=16,
            train_pool=64, checkpoint_every=1, eval_every=1)


@pytest.mark.parametrize("kind", ["tiny:qwen2", "tiny:llama"])
def test_tiny_policy_save_load_round_trip(tmp_path, kind):
    model, tok = load_policy(kind, hidden_size=32, num_heads=2)
    save_policy(model, tok, tmp_path)
    model2, tok2 = load_policy(str(tmp_path))
    ids = torch.tensor([tok.encode("12+34=", add_special_tokens=False)])
    assert tok2.decode(ids[0]) == "12+34=" and tok2.eos_token_id == tok.eos_token_id
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model2(ids).logits)
    assert type(model2).__name__.lower().startswith(kind.split(":")[1])


def test_sampling_masks_and_left_padding_logprobs():
    model, tok = load_policy("tiny", hidden_size=32, num_heads=2)
    ids, mask = rollout.encode_prompts(tok, ["1+2=", "12,3:36="])
    assert mask[0, 0] == 0 and mask[1].all()  # left padding
    g = torch.Generator().manual_seed(0)
    b = rollout.sample(model, ids, mask, max_new_tokens=6, eos_id=tok.eos_token_id,
                       pad_id=tok.pad_token_id, generator=g)
    for row, m in zip(b.completion_ids, b.completion_mask):
        eos = (row == tok.eos_token_id).nonzero()
        if len(eos):
            assert m[: eos[0] + 1].all() and not m[eos[0] + 1:].any()
        else:
            assert m.all()
    # log-probs of the padded row equal those computed without any padding
    lp, _ = rollout.completion_logprobs(model, ids, mask, b.completion_ids, b.completion_mask)
    start = int(mask[0].argmax())
    lp0, _ = rollout.completion_logprobs(model, ids[:1, start:], mask[:1, start:],
                                         b.completion_ids[:1], b.completion_mask[:1])
    torch.testing.assert_close(lp[:1], lp0, rtol=1e-4, atol=1e-5)
    # greedy sampling picks the argmax of the same distribution
    gb = rollout.sample(model, ids, mask, max_new_tokens=4, eos_id=tok.eos_token_id,
                        pad_id=tok.pad_token_id, temperature=0.0)
    lp_g, _ = rollout.completion_logprobs(model, ids, mask, gb.completion_ids, gb.completion_mask)
    full = torch.cat([ids, gb.completion_ids], 1)
    fmask = torch.cat([mask, gb.completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=fmask,
                       position_ids=(fmask.cumsum(-1) - 1).clamp(min=0)).logits
    argmax = logits[:, ids.shape[1] - 1:-1].argmax(-1)
    assert bool(((argmax == gb.completion_ids) | (gb.completion_mask == 0)).all())


def test_task_rewards():
    add = AdditionTask(digits=2, format_reward=0.1)
    p = add.problem(7 * 100 + 45)
    assert p.prompt == "07+45=" and p.answer == "052" and p.target == 52
    assert add.reward(p, "052", True) == 1.0 and add.reward(p, "52", True) == 1.0
    assert add.reward(p, "52", False) == 0.0          # no EOS: not an answer
    assert add.reward(p, "53", True) == 0.1 and add.reward(p, "5x", True) == 0.0
    train = {q.id for q in add.problems("train", 5000, 0)}
    assert not train & {q.id for q in add.problems("test", 1000, 0)}
    cd = CountdownTask(numbers=3, pool_size=500)
    q = cd.problems("test", 1, 0)[0]
    assert cd.reward(q, q.answer, True) == 1.0
    assert cd.reward(q, q.answer + "+0", True) == 0.0
    assert evaluate_expression("(3+4)*2-10/5")[0] == 12 and evaluate_expression("3+") is None


def test_config_validation_messages():
    with pytest.raises(ValueError, match="^group_size: 1 "):
        GRPOConfig(group_size=1)
    with pytest.raises(ValueError, match="^bogus: unknown"):
        GRPOConfig.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="^dynamic_sampling: "):
        GRPOConfig.from_dict({"dynamic_sampling": "yes"})
    assert GRPOConfig.from_dict({"lr": "1e-3", "steps": 3}).lr == 1e-3


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    cfg = dict(FAST, steps=4, num_iterations=2, beta=0.05, loss_type="dapo", epsilon_high=0.28)
    full = run(cfg, tmp_path / "full")
    part_dir = tmp_path / "part"
    run(dict(cfg, steps=2), part_dir)            # "interrupted" after 2 steps (checkpointed)
    resumed = run(cfg, part_dir)                 # same directory, continues to step 4
    assert list(resumed["step"]) == [0, 1, 2, 3, 4]
    cols = ["reward", "loss", "kl", "entropy", "rollouts", "eval/accuracy"]
    pd.testing.assert_frame_equal(full[cols], resumed[cols])
    on_disk = pd.read_parquet(part_dir / "metrics.parquet")
    assert len(on_disk) == 5 and on_disk["kl"].iloc[1:].ge(0).all()
    assert sorted(p.name for p in (part_dir / "checkpoints").iterdir()) == ["step_000003",
                                                                           "step_000004"]
    with pytest.raises(ValueError, match="^out_dir: .* different config"):
        run(dict(cfg, lr=0.5), part_dir)


def test_selective_rollouts_and_dynamic_sampling_save_rollouts(tmp_path):
    # An untrained model gets every answer wrong: all groups have zero variance, so GRESO starts
    # skipping prompts from the second epoch and dynamic sampling has nothing to train on.
    cfg = dict(FAST, sft_steps=0, steps=6, train_pool=8, selective_rollouts=True,
               dynamic_sampling=True, max_sampling_rounds=2)
    df = run(cfg, tmp_path / "greso")
    steps = df[df.step > 0]
    assert (steps["groups_used"] == 0).all() and "loss" not in steps
    assert steps["rollouts_saved"].iloc[-1] > 0
    assert steps["frac_reward_zero_std"].dropna().eq(1.0).all()  # NaN: every prompt skipped
    # without GRESO every step would roll out 2 rounds x 4 prompts x 4 completions
    assert steps["rollouts"].iloc[-1] < 6 * 2 * 4 * 4


def test_cli_grpo_and_passk(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["grpo", "--out", str(out), "steps=2", "bogus=1"]) == 2
    assert main(["grpo", "--out", str(out), "loss_type=foo"]) == 2
    assert main(["grpo", "--out", str(out), "--config", str(tmp_path / "missing.yaml")]) == 2
    assert not out.exists()                       # nothing written on bad input
    args = [f"{k}={v}" for k, v in FAST.items()]
    assert main(["grpo", "--out", str(out), "--quiet", "loss_type=dr_grpo", *args]) == 0
    df = pd.read_parquet(out / "metrics.parquet")
    assert list(df["step"]) == [0, 1, 2]
    for col in ("reward", "reward_std", "frac_reward_zero_std", "kl", "entropy",
                "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
                "completions/mean_length", "completions/min_length", "completions/max_length",
                "completions/clipped_ratio", "tokens_per_s", "eval/accuracy"):
        assert col in df and np.isfinite(df[col].iloc[-1]), col
    assert json.loads((out / "grpo_config.json").read_text())["loss_type"] == "dr_grpo"
    table = tmp_path / "passk.csv"
    assert main(["passk", "--model", str(policy_path(out, "final")), "--n", "8", "--problems",
                 "4", "--out", str(table)]) == 0
    pk = pd.read_csv(table)
    assert list(pk["k"]) == [1, 2, 4, 8] and pk["pass_at_k"].is_monotonic_increasing
    assert main(["passk", "--model", str(tmp_path), "--out", str(table)]) == 2
    assert main(["passk", "--model", str(out / "base_model"), "--out", str(tmp_path / "x.txt")]) == 2


def test_train_eval_switch_does_not_rekernelise_every_step(tmp_path, monkeypatch):
    """A saved policy loads with hub kernels on (transformers' default); `model.train()` /
    `model.eval()` re-kernelise on every switch (two per GRPO step). The trainer's switch sets the
    dropout flags and keeps one training-mode kernel mapping: no re-kernelisation per step."""
    from transformers import PreTrainedModel
    model, tok = load_policy("tiny", hidden_size=32, num_heads=2)
    save_policy(model, tok, tmp_path / "init")
    from scaling_rl.llm.trainer import GRPOTrainer
    trainer = GRPOTrainer(GRPOConfig(init_from=str(tmp_path / "init"), steps=3, prompts_per_step=2,
                                     group_size=2, max_completion_length=4, eval_problems=1))
    trainer.setup()
    calls = []
    inner = PreTrainedModel.set_use_kernels
    monkeypatch.setattr(PreTrainedModel, "set_use_kernels",
                        lambda self, *a, **k: (calls.append(k.get("mode")), inner(self, *a, **k))[1])
    try:
        trainer.train_step()          # the first switch may kernelise once, for training
        first = len(calls)
        for _ in range(2):
            trainer.train_step()
        assert first <= 1 and len(calls) == first
        assert not any(m.training for m in trainer.model.modules())    # eval between steps
        rollout.set_training(trainer.model, True)
        assert all(m.training for m in trainer.model.modules())
        if getattr(trainer.model, "use_kernels", False):   # a transformers eval() is undone
            from kernels import Mode
            trainer.model.eval()
            rollout.set_training(trainer.model, True)
            assert trainer.model._kernels_mode == Mode.TRAINING
            trainer.model.eval()           # also inside a wrapper module (the video policy's case)
            rollout.set_training(torch.nn.ModuleList([trainer.model]), True)
            assert trainer.model._kernels_mode == Mode.TRAINING
    finally:
        trainer.close()


def test_group_prompts_tokenised_once_give_the_same_rows():
    model, tok = load_policy("tiny", hidden_size=32, num_heads=2)
    task = AdditionTask(2)
    problems = task.problems("train", 3, seed=0) + [task.problems("train", 1, seed=9)[0]]
    cfg = GRPOConfig(group_size=3, max_completion_length=4)
    batch, _ = rollout.sample_groups(model, tok, task, problems, cfg, eos_ids=(tok.eos_token_id,),
                                     max_len=4, generator=torch.Generator().manual_seed(0),
                                     version=2, device="cpu", record_logp=False)
    ids, mask = rollout.encode_prompts(tok, [p.prompt for p in problems for _ in range(3)])
    assert torch.equal(batch.prompt_ids, ids) and torch.equal(batch.prompt_mask, mask)
    assert batch.logp is None and (batch.versions == 2).all()
