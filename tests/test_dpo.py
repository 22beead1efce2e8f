"""DPO: loss vs TRL (pinned fixture), hand formulas, gradients through the bridge, preference data,
config errors, a tiny run end to end (files, rerun, CLI) and the `dpo` sweep trial kind."""
import dataclasses
import json
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl.llm import dpo  # noqa: E402
from scaling_rl.llm.tasks import AdditionTask  # noqa: E402

FIXTURE = Path(__file__).parent / "data" / "dpo_trl_reference.json"


def _logsig(z):
    return -np.logaddexp(0.0, -z)


# ---- the loss -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trl_reference():
    """Our per-pair values on the fixture's models and pairs (benchmarks/dpo_vs_trl.py made it)."""
    from scaling_rl.llm.models import char_tokenizer, tiny_model
    ref = json.loads(FIXTURE.read_text())
    tok = char_tokenizer()
    policy, reference = tiny_model(tok, seed=0).eval(), tiny_model(tok, seed=1).eval()
    pairs = dpo.preference_pairs(AdditionTask(2), "train", 8, noise=0.25, seed=5)
    tr = dpo.DPOTrainer(dpo.DPOConfig(train_pairs=16, eval_pairs=4, eval_problems=4, batch_size=8))
    tr.policy, tr.reference, tr.tokenizer = policy, reference, tok
    enc = tr._encode(pairs)
    with torch.no_grad():
        logps = [*tr.token_logps(policy, enc), *tr.token_logps(reference, enc)]
    return ref, pairs, [jnp.asarray(x.numpy()) for x in logps], enc


def test_loss_matches_trl_fixture(trl_reference):
    ref, pairs, (pc, pr, qc, qr), enc = trl_reference
    assert [[p.prompt, p.chosen, p.rejected] for p in pairs] == ref["pairs"]  # same data
    cm, rm = jnp.asarray(enc[3].numpy()), jnp.asarray(enc[5].numpy())
    np.testing.assert_allclose(np.asarray((pc * cm).sum(-1)), ref["cases"][0]["chosen_logps"],
                               atol=1e-5)
    assert {c["loss_type"] for c in ref["cases"]} == set(dpo.LOSS_TYPES)
    for case in ref["cases"]:
        loss, aux = dpo.objective_fn(case["beta"], case["loss_type"], case["label_smoothing"])(
            pc, pr, qc, qr, cm, rm)
        what = f"{case['loss_type']} beta={case['beta']} ls={case['label_smoothing']}"
        np.testing.assert_allclose(np.asarray(aux["losses"]), case["losses"], rtol=1e-6, atol=1e-6,
                                   err_msg=what)
        np.testing.assert_allclose(np.asarray(aux["chosen_rewards"]), case["chosen_rewards"],
                                   atol=2e-6, err_msg=what)
        np.testing.assert_allclose(np.asarray(aux["rejected_rewards"]), case["rejected_rewards"],
                                   atol=2e-6, err_msg=what)
        assert float(loss) == pytest.approx(np.mean(case["losses"]), rel=1e-6)


def test_hand_formulas_and_label_smoothing():
    c, r = jnp.array([-3.0, -5.0, -2.0]), jnp.array([-4.0, -4.5, -6.0])
    qc, qr = jnp.array([-3.5, -4.0, -2.5]), jnp.array([-3.0, -5.0, -5.0])
    logits = np.asarray((c - r) - (qc - qr))
    beta, eps = 0.5, 0.2
    z = beta * logits
    want = {
        ("sigmoid", 0.0): -_logsig(z),
        ("sigmoid", eps): -(1 - eps) * _logsig(z) - eps * _logsig(-z),       # cDPO
        ("robust", eps): (-(1 - eps) * _logsig(z) + eps * _logsig(-z)) / (1 - 2 * eps),
        ("hinge", 0.0): np.maximum(0.0, 1 - z),
        ("ipo", 0.0): (logits - 1 / (2 * beta)) ** 2,
    }
    for (lt, ls), expected in want.items():
        losses, rc, rr = dpo.dpo_losses(c, r, qc, qr, beta=beta, loss_type=lt, label_smoothing=ls)
        np.testing.assert_allclose(np.asarray(losses), expected, rtol=1e-6, err_msg=lt)
        np.testing.assert_allclose(np.asarray(rc - rr), z, rtol=1e-6)
    with pytest.raises(ValueError, match="loss_type"):
        dpo.dpo_losses(c, r, qc, qr, beta=beta, loss_type="nope")


def test_gradient_through_bridge_is_the_dpo_gradient():
    """d loss / d token log-prob of the chosen completion = -β σ(-β logits) / B on its mask."""
    rng = np.random.default_rng(0)
    B, T, beta = 4, 3, 0.3
    toks = [torch.tensor(-rng.gamma(2.0, 0.5, (B, T)), dtype=torch.float32) for _ in range(4)]
    pc, pr, qc, qr = toks
    pc.requires_grad_(True)
    pr.requires_grad_(True)
    cm = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    rm = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    loss, aux = dpo.torch_objective(beta, "sigmoid", 0.0)(pc, pr, qc, qr, cm, rm)
    loss.backward()
    logits = ((pc * cm).sum(-1) - (pr * rm).sum(-1) - (qc * cm).sum(-1) + (qr * rm).sum(-1)).detach()
    g = (-beta * torch.sigmoid(-beta * logits) / B)[:, None]
    torch.testing.assert_close(pc.grad, g * cm, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(pr.grad, -g * rm, rtol=1e-5, atol=1e-7)
    assert aux["margins"].shape == (B,)


# ---- data and config ----------------------------------------------------------------------------

def test_preference_pairs_have_the_asked_noise():
    task = AdditionTask(2)
    pairs = dpo.preference_pairs(task, "train", 200, noise=0.2, seed=0)
    assert sum(p.flipped for p in pairs) == 40
    by_prompt = {p.prompt: task.problem(int(p.prompt[:2]) * 100 + int(p.prompt[3:5])) for p in pairs}
    for p in pairs:
        good = by_prompt[p.prompt].answer
        assert len(p.chosen) == len(p.rejected) == 3 and p.chosen != p.rejected
        assert (p.rejected == good) == p.flipped and (p.chosen == good) != p.flipped
    assert not any(p.flipped for p in dpo.preference_pairs(task, "test", 50, noise=0.0, seed=1))
    assert pairs == dpo.preference_pairs(task, "train", 200, noise=0.2, seed=0)   # deterministic
    with pytest.raises(ValueError, match="noise"):
        dpo.preference_pairs(task, "train", 10, noise=0.5, seed=0)


@pytest.mark.parametrize("bad, match", [
    ({"nope": 1}, "nope: unknown DPO config key"), ({"scheduler": "x"}, "scheduler"),
    ({"noise": 0.6}, "noise"), ({"beta": 0}, "beta"), ({"loss_type": "kto"}, "loss_type"),
    ({"steps": 1.5}, "not an integer"), ({"batch_size": 64, "train_pairs": 100}, "candidates")])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        dpo.DPOConfig.from_dict(bad)


# ---- a tiny run -----------------------------------------------------------------------------------

TINY = dict(hidden_size=16, num_layers=1, num_heads=2, sft_steps=3, sft_batch_size=16,
            train_pairs=64, eval_pairs=16, eval_problems=4, batch_size=8, steps=3, eval_every=2,
            lr=3e-3, noise=0.25)


def test_updates_raise_the_margin_of_clean_pairs():
    tr = dpo.DPOTrainer(dpo.DPOConfig(**{**TINY, "noise": 0.0}))
    tr.setup()
    batch = tr.train[:8]
    losses = [tr.update(batch)["loss"] for _ in range(6)]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-6)      # policy == reference at start
    assert losses[-1] < losses[0] - 0.01
    assert (tr.pair_stats(batch)["margins"] > 0).mean() >= 0.75


def test_pair_stats_hidden_states_and_reused_reference_logps():
    """hidden=True: the same log-probs as the plain forward, plus the per-layer hidden states
    averaged over each row's tokens and over chosen / rejected; `update` with the scoring's
    reference log-probs trains on exactly the loss the scoring saw."""
    from scaling_rl.llm import rollout
    cfg = dpo.DPOConfig(**{**TINY, "num_layers": 2, "sft_steps": 0})
    tr = dpo.DPOTrainer(cfg)
    tr.setup()
    pairs = tr.train[:6]
    enc = tr._encode(pairs)
    plain, st = tr.pair_stats(enc=enc), tr.pair_stats(enc=enc, hidden=True)
    np.testing.assert_allclose(st["losses"], plain["losses"], rtol=1e-6)
    np.testing.assert_allclose(st["chosen_seq_logp"], plain["chosen_seq_logp"], rtol=1e-6)
    assert st["hidden"].shape == (6, 2, 16) and "hidden" not in plain
    p_ids, p_mask, c_ids, c_mask, r_ids, r_mask = enc
    with torch.no_grad():      # by hand: the chosen rows' hidden states of layer 2, token mean
        ids = torch.cat([p_ids, c_ids[:, :-1]], 1)
        mask = torch.cat([p_mask, c_mask[:, :-1].to(p_mask.dtype)], 1)
        out = tr.policy(input_ids=ids, attention_mask=mask, position_ids=rollout._positions(mask),
                        output_hidden_states=True)
        ids_r = torch.cat([p_ids, r_ids[:, :-1]], 1)
        mask_r = torch.cat([p_mask, r_mask[:, :-1].to(p_mask.dtype)], 1)
        out_r = tr.policy(input_ids=ids_r, attention_mask=mask_r,
                          position_ids=rollout._positions(mask_r), output_hidden_states=True)
    mean = lambda h, m: ((h * m[..., None]).sum(1) / m.sum(1, keepdim=True)).numpy()  # noqa: E731
    want = 0.5 * (mean(out.hidden_states[2], mask.float()) + mean(out_r.hidden_states[2],
                                                                   mask_r.float()))
    np.testing.assert_allclose(st["hidden"][:, 1], want, rtol=1e-4, atol=1e-5)
    out = tr.update(enc=enc, ref_logps=st["ref_logps"])
    assert out["loss"] == pytest.approx(float(np.mean(st["losses"])), rel=1e-5)


@pytest.mark.parametrize("sched, per_step", [("uniform", 8.0), ("small_loss", 14.0), ("sams", 14.0)])
def test_step_cost_charges_candidate_forwards(sched, per_step):
    """A uniform step of B pairs costs B; a scoring scheduler also pays every candidate's policy +
    reference forward (2 of a trained pair's 4 forward-equivalents) and saves the trained pairs'
    reference forward: (2·B·c + 3·B) / 4 = 14 for B = 8, c = 2."""
    cfg = dpo.DPOConfig(**{**TINY, "scheduler": sched})
    assert dpo.step_cost(cfg) == per_step
    assert dpo.steps_for_compute(cfg, 8 * 35) == round(8 * 35 / per_step)
    assert dpo.step_cost(dataclasses.replace(cfg, candidates=4)) == (8.0 if sched == "uniform"
                                                                     else (2 * 32 + 24) / 4)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dpo") / "run"
    df = dpo.run({**TINY, "scheduler": "sams"}, out)
    return out, df


def test_run_writes_rows_and_files(tiny_run):
    out, df = tiny_run
    assert list(df["step"]) == [0, 1, 2, 3]
    assert list(df["pairs"]) == [0, 8, 16, 24]
    assert list(df["compute_pairs"].fillna(0)) == [0, 14, 28, 42]    # candidates charged
    assert (df["score_s"].dropna() > 0).all()
    ev = df.dropna(subset=["eval/pref_accuracy"])
    assert list(ev["step"]) == [0, 2, 3]
    assert ev["eval/pref_accuracy"].iloc[0] == 0.5           # policy == reference: all ties
    assert df["selected_flipped"].dropna().between(0, 1).all()
    assert (df["sched_s"].dropna() >= 0).all() and (df["step_s"].dropna() > 0).all()
    assert (out / "final_model" / "config.json").is_file() and (out / "base_model").is_dir()
    again = dpo.run({**TINY, "scheduler": "sams"}, out)    # finished: returned, not retrained
    assert again.equals(df)
    with pytest.raises(ValueError, match="different config"):
        dpo.run({**TINY, "scheduler": "uniform"}, out)


def test_cli_dpo_errors_are_one_line(tmp_path, capsys):
    from scaling_rl.cli import main
    assert main(["dpo", "--out", str(tmp_path / "r"), "scheduler=nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "scheduler" in err


def test_sweep_trial_kind(tmp_path):
    from scaling_rl.sweep import registry
    kind = registry.get("dpo")
    assert kind.budget({"steps": 5, "batch_size": 4}) == 20                      # uniform
    assert kind.budget({"steps": 5, "batch_size": 4, "scheduler": "sams"}) == 35  # + candidates
    with pytest.raises(ValueError, match="seed"):
        kind.check({"seed": 3})
    cfg = {**TINY, "steps": 2, "eval_every": 2, "scheduler": "small_loss"}
    df = kind.run(cfg, str(tmp_path / "t"), 1, 0)
    # env_steps = compute in trained-pair equivalents: 8 trained + 16 scored candidates = 14
    assert list(df["chunk"]) == [0, 1, 2] and list(df["env_steps"]) == [0, 14, 28]
    assert list(df["pairs"]) == [0, 8, 16]
    assert list(df["seed"]) == [0, 0, 0]
    rec = json.loads((tmp_path / "t" / "config.json").read_text())
    assert rec["agent"] == "dpo" and rec["param_count"] == kind.param_count(cfg) > 0


def test_sweep_spec_with_dpo_axes():
    from scaling_rl.sweep.spec import SpecError, load_spec, parse_spec
    spec = load_spec(Path(__file__).parents[1] / "sweeps" / "dpo_tiny.yaml")
    assert len(spec.trials) == 4
    with pytest.raises(SpecError, match="scheduler"):
        parse_spec({"agent": "dpo", "grid": {"scheduler": ["bogus"]}})
