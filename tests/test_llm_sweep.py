"""The `grpo` trial kind: sweeps/grpo_tiny.yaml through the sweep CLI (local backend), collect,
resume from a checkpoint, and bad GRPO specs refused with exit 2 before anything is written."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl import cli  # noqa: E402
from scaling_rl.llm.models import load_policy, param_count  # noqa: E402
from scaling_rl.llm.trainer import TIMING_COLUMNS  # noqa: E402
from scaling_rl.sweep import Store, load_spec, registry  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "sweeps" / "grpo_tiny.yaml"
TIMING = list(TIMING_COLUMNS)


def test_grpo_tiny_sweep_runs_collects_and_resumes(tmp_path, capsys):
    out = tmp_path / "store"
    raw = yaml.safe_load(SPEC.read_text())
    spec = load_spec(SPEC, out_dir=out)        # every trial through GRPOConfig
    assert spec.agent == "grpo" and len(spec.trials) == 2 and spec.trials[0].seeds == 2
    # the local backend with the spec's worker process (a fresh interpreter finds `grpo` by name)
    assert cli.main(["sweep", "run", str(SPEC), "--out", str(out), "--no-progress"]) == 0
    store = Store(out)
    tids = store.trial_ids()
    assert len(tids) == 2
    kind = registry.get("grpo")
    for tid in tids:
        st = store.status(tid)
        assert st["state"] == "done", st
        c = store.trial(tid).config
        assert st["param_count"] == kind.param_count(c) > 0
        model, _ = load_policy(c["model"], hidden_size=c["hidden_size"], num_layers=c["num_layers"],
                               num_heads=c["num_heads"])
        assert st["param_count"] == param_count(model)     # the meta-device count is the real one
    assert cli.main(["sweep", "collect", str(out), "--no-progress"]) == 0
    df = pd.read_parquet(out / "results.parquet")
    steps, seeds = raw["base"]["steps"], raw["seeds"]
    assert len(df) == 2 * seeds * (steps + 1)          # row 0 = the base policy, then one per step
    for col in ("trial_id", "agent", "status", "param_count", "seed", "seed_index", "chunk", "env_steps",
                "grad_steps", "reward", "loss", "eval/accuracy", "group_size", "hidden_size",
                "loss_type", "lr"):
        assert col in df.columns, col
    assert not df.duplicated(["trial_id", "seed", "chunk"]).any()
    assert set(df["seed"]) == set(range(seeds)) and (df["agent"] == "grpo").all()
    assert set(df["status"]) == {"done"} and df["param_count"].nunique() == 2
    for _, g in df.groupby(["trial_id", "seed"]):
        assert list(g["chunk"]) == list(range(steps + 1))
        # env_steps = completions sampled so far: prompts_per_step * group_size per step
        per_step = raw["base"]["prompts_per_step"] * g["group_size"].iloc[0]
        assert list(g["env_steps"]) == [per_step * c for c in range(steps + 1)]
        assert list(g["grad_steps"]) == list(range(steps + 1))
    last = df[df["chunk"] == steps]
    assert last["eval/accuracy"].notna().all() and last["loss"].notna().all()

    # resume: drop seed 1's last checkpoint of one trial; the kind reruns steps after the one left
    tid = tids[0]
    tdir = store.trial_dir(tid)
    before = pd.read_parquet(tdir / "metrics.parquet")
    ckpts = sorted((tdir / "seed_1" / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == ["step_000002", "step_000003"]
    shutil.rmtree(ckpts[-1])
    t = store.trial(tid)
    after = kind.run(t.config, str(tdir), t.seeds, t.seed)
    assert (tdir / "seed_1" / "checkpoints" / "step_000003").is_dir()
    pd.testing.assert_frame_equal(before.drop(columns=TIMING), after.drop(columns=TIMING))

    # a rerun of the sweep finds nothing to do
    assert cli.main(["sweep", "run", str(SPEC), "--out", str(out), "--workers", "0", "--no-progress"]) == 0
    assert all(store.status(t)["attempts"] == 1 for t in tids)


@pytest.mark.parametrize("extra, message", [
    ("base: {group_sise: 4}\n", "base.group_sise: unknown field of grpo Config"),
    ("grid: {loss_type: [grpo, nope]}\n", "loss_type: 'nope' is unknown"),
    ("grid: {group_size: [1]}\n", "group_size: 1 must be >= 2"),
    ("base: {seed: 3}\ngrid: {lr: [0.001]}\n", "seed: 3 in the GRPO config"),
    ("base: {hidden_size: 30, num_heads: 4}\ngrid: {lr: [0.001]}\n", "hidden_size: 30 is not divisible"),
])
def test_bad_grpo_spec_exits_2_and_writes_nothing(tmp_path, capsys, extra, message):
    out = tmp_path / "store"
    spec = tmp_path / "bad.yaml"
    text = f"name: bad\nagent: grpo\nout_dir: {out}\n" + extra
    if "grid" not in extra:
        text += "grid: {lr: [0.001, 0.01]}\n"
    spec.write_text(text)
    assert cli.main(["sweep", "run", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scaling-rl: error:") and message in err and "\n" not in err, err
    assert not out.exists()


def test_non_finite_loss_marks_the_trial_diverged(tmp_path, monkeypatch):
    from scaling_rl.llm import trainer

    def nan_update(self, batch, rewards):
        return {"loss": float("nan"), "grad_norm": 1.0, "_step_tokens": 0}

    monkeypatch.setattr(trainer.GRPOTrainer, "_update", nan_update)
    raw = yaml.safe_load(SPEC.read_text())
    out = tmp_path / "store"
    spec = tmp_path / "div.yaml"
    spec.write_text(yaml.safe_dump({"name": "div", "agent": "grpo", "out_dir": str(out), "seeds": 1,
                                    "base": {**raw["base"], "dynamic_sampling": False},
                                    "grid": {"group_size": [2]}}))
    assert cli.main(["sweep", "run", str(spec), "--workers", "0", "--no-progress"]) == 0  # inline
    store = Store(out)
    (tid,) = store.trial_ids()
    st = store.status(tid)
    prompts = raw["base"]["prompts_per_step"]
    assert st["state"] == "diverged" and st["step"] == prompts * 2, st   # after GRPO step 1
    assert "loss non-finite" in st["error"]
    df = pd.read_parquet(store.trial_dir(tid) / "metrics.parquet")
    assert list(df["chunk"]) == [0, 1] and df["loss"].isna().tolist() == [True, True]


VIDEO = dict(multimodal="video", frames=24, frame_dim=8, frame_encoder_hidden=16, hidden_size=32,
             sft_steps=2, sft_batch_size=8, steps=1, prompts_per_step=2, group_size=4,
             eval_problems=4, train_pool=16, checkpoint_every=1, eval_every=1)


def test_a_video_trial_trains_the_video_policy(tmp_path):
    """The trial kind dispatches as `scaling-rl grpo` does: multimodal=video runs VideoGRPOTrainer
    (video base model, encoder-FLOP columns, the encoder counted in N), with the divergence check."""
    from scaling_rl.llm import grpo_run, sweep
    from scaling_rl.llm.multimodal import VideoLM
    from scaling_rl.llm.trainer import GRPOConfig, GRPOTrainer
    from scaling_rl.llm.video_grpo import VideoGRPOTrainer

    df = sweep.run(VIDEO, str(tmp_path), seeds=1, seed=0)
    base, _ = load_policy(str(tmp_path / "seed_0" / "base_model"))
    assert isinstance(base, VideoLM) and base.config.frame_dim == 8
    rows = df[df.chunk == 1]
    per_step = VIDEO["prompts_per_step"] * VIDEO["group_size"]
    assert list(df["env_steps"]) == [0, per_step]
    # one encoding of each of the 2 videos (24 frames) per step
    assert int(rows["encoder_flops"].iloc[0]) == 2 * base.frame_encoder.flops(24)
    assert int(rows["encoder_flops_saved"].iloc[0]) > 0
    n = sweep.param_count(dataclasses.asdict(GRPOConfig.from_dict(VIDEO)))
    assert n == param_count(base) > param_count(load_policy("tiny", hidden_size=32)[0])
    # the checked trainer subclasses the class the config needs; a wrong one is refused
    cfg = GRPOConfig.from_dict(VIDEO)
    assert grpo_run.trainer_class(cfg) is VideoGRPOTrainer
    assert issubclass(sweep._checked_trainer(VideoGRPOTrainer, lambda: None), VideoGRPOTrainer)
    with pytest.raises(ValueError, match="trainer_cls: GRPOTrainer is not a VideoGRPOTrainer"):
        grpo_run.run(cfg, tmp_path / "wrong", trainer_cls=GRPOTrainer)
