"""GRPO measurably raises the reward of an SFT-warm-started tiny model on 2-digit addition."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl.llm import rollout  # noqa: E402
from scaling_rl.llm.models import load_policy  # noqa: E402
from scaling_rl.llm.tasks import AdditionTask  # noqa: E402
from scaling_rl.llm.trainer import policy_path, run  # noqa: E402


def _sampled_accuracy(path, problems) -> float:
    model, tok = load_policy(str(path))
    counts = rollout.correct_counts(model, tok, AdditionTask(2), problems, n=8, max_new_tokens=4,
                                    temperature=1.0, seed=123)
    return float(counts.mean() / 8)


@pytest.mark.slow
def test_grpo_improves_addition_reward(tmp_path):
    torch.set_num_threads(1)
    # SFT stops at 30% greedy train accuracy (room for RL to sharpen), then 40 GRPO steps. Measured
    # (torch 2.13 CPU, transformers 5.24): 0.2975 -> 0.3353 sampled held-out accuracy. With the old
    # 60% SFT target the same library versions gave 0.372 -> 0.378 (an SFT base too strong for 40
    # steps to move; it passed with the libraries of its day: 0.488 -> 0.560).
    cfg = dict(task="addition", digits=2, seed=0, sft_steps=600, sft_target_accuracy=0.3,
               steps=40, prompts_per_step=16, group_size=8, lr=2e-4, loss_type="grpo",
               eval_every=40, checkpoint_every=40, eval_problems=100)
    df = run(cfg, tmp_path / "run")
    assert df.loc[0, "sft/probe_accuracy"] >= 0.1            # the base model can already solve some
    problems = AdditionTask(2).problems("test", 400, seed=7)  # held out, 3200 samples per model
    base = _sampled_accuracy(policy_path(tmp_path / "run", "base"), problems)
    tuned = _sampled_accuracy(policy_path(tmp_path / "run", "final"), problems)
    assert base > 0.03
    assert tuned >= base + 0.03, (base, tuned)
    late, early = df["reward"].iloc[-10:].mean(), df["reward"].iloc[1:11].mean()
    assert late > early - 0.05  # no collapse of the training reward
