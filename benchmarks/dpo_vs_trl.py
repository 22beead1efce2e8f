"""Our DPO loss and step vs TRL's `DPOTrainer`, CPU only.

    python benchmarks/dpo_vs_trl.py [--reps 20] [--batch 32] [--out FILE.json]
    python benchmarks/dpo_vs_trl.py --write-fixture tests/data/dpo_trl_reference.json

1. Loss, per pair: policy = a randomly initialised tiny Qwen2 (seed 0), reference = another
   (seed 1), 8 addition preference pairs; TRL tokenises and collates each pair and runs
   `DPOTrainer.compute_loss` (its fused log-prob path), we run our trainer's encoding, log-probs and
   the JAX objective. Compared per pair: loss, chosen / rejected implicit reward and sequence
   log-prob, for sigmoid and IPO (β 0.1, 0.5), hinge, robust (ε 0.1, 0.2). `--write-fixture`
   stores TRL's numbers as JSON, so tests/test_dpo.py checks the match without TRL installed.
   (TRL >= 1.0 applies label smoothing only to robust / exo / aot; our sigmoid with ε > 0 is cDPO as
   in TRL 0.x and is checked against its formula in the tests.)
2. Step time: one DPO optimizer step (reference forward, policy forward + backward, clip, AdamW)
   on the same batch of an SFT-warmed tiny Qwen2, TRL (`compute_loss` + backward + step) vs ours
   (`DPOTrainer.update`), medians of process CPU time over --reps after 3 warm-ups, interleaved,
   single-threaded torch. speedup_vs_trl = TRL time / our time (> 1: ours is faster).

loss_max_rel_diff = max over pairs and settings of |ours - TRL| / max(1, |TRL|) of the loss.
Needs `trl` (benchmark-only dependency). Last line: `speedup_vs_trl=<x>`.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling_rl import io as sio  # noqa: E402
from scaling_rl.llm import dpo  # noqa: E402

SETTINGS = [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.0), ("ipo", 0.1, 0.0), ("ipo", 0.5, 0.0),
            ("hinge", 0.1, 0.0), ("robust", 0.1, 0.1), ("robust", 0.5, 0.2)]
FIXTURE_PAIRS = 8


def fixture_models():
    """Policy and reference for the fixture: two randomly initialised tiny Qwen2 (seeds 0 and 1)."""
    from scaling_rl.llm.models import char_tokenizer, tiny_model
    tok = char_tokenizer()
    return (tiny_model(tok, seed=0).eval(), tiny_model(tok, seed=1).eval().requires_grad_(False),
            tok)


def fixture_pairs():
    from scaling_rl.llm.tasks import AdditionTask
    return dpo.preference_pairs(AdditionTask(2), "train", FIXTURE_PAIRS, noise=0.25, seed=5)


def _trl_trainer(model, ref, tok, pairs, loss_type, beta, ls, batch, tmp):
    import datasets
    import trl
    ds = datasets.Dataset.from_dict({"prompt": [p.prompt for p in pairs],
                                     "chosen": [p.chosen for p in pairs],
                                     "rejected": [p.rejected for p in pairs]})
    args = trl.DPOConfig(output_dir=tmp, beta=beta, loss_type=[loss_type], label_smoothing=ls,
                         per_device_train_batch_size=batch, report_to=[], use_cpu=True,
                         learning_rate=1e-3, max_grad_norm=1.0, logging_steps=1000,
                         save_strategy="no", bf16=False)
    return trl.DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=ds,
                          processing_class=tok)


def trl_per_pair(model, ref, tok, pairs, loss_type, beta, ls, tmp) -> dict:
    """TRL's loss, chosen / rejected reward and chosen / rejected log-prob of each pair (each pair
    alone through `compute_loss`, so the logged means are that pair's values)."""
    tr = _trl_trainer(model, ref, tok, pairs, loss_type, beta, ls, 1, tmp)
    out = {k: [] for k in ("losses", "chosen_rewards", "rejected_rewards", "chosen_logps",
                           "rejected_logps")}
    model.eval()
    for i in range(len(pairs)):
        batch = tr._prepare_inputs(tr.data_collator([tr.train_dataset[i]]))
        tr._metrics["eval"].clear()
        with torch.no_grad():
            loss = tr.compute_loss(model, batch)
        m = tr._metrics["eval"]
        out["losses"].append(float(loss))
        out["chosen_rewards"].append(m["rewards/chosen"][-1])
        out["rejected_rewards"].append(m["rewards/rejected"][-1])
        out["chosen_logps"].append(m["logps/chosen"][-1])
        out["rejected_logps"].append(m["logps/rejected"][-1])
    return out


def ours_per_pair(model, ref, tok, pairs, loss_type, beta, ls) -> dict:
    """The same quantities from our trainer's log-probs and the JAX objective."""
    tr = _ours_trainer(model, ref, tok, loss_type, beta, ls)
    enc = tr._encode(pairs)
    with torch.no_grad():
        pc, pr = tr.token_logps(model, enc)
        qc, qr = tr.token_logps(ref, enc)
    _, aux = dpo.objective_fn(beta, loss_type, ls)(
        *(np.asarray(x.float().numpy()) for x in (pc, pr, qc, qr, enc[3], enc[5])))
    return {"losses": np.asarray(aux["losses"]), "chosen_rewards": np.asarray(aux["chosen_rewards"]),
            "rejected_rewards": np.asarray(aux["rejected_rewards"]),
            "chosen_logps": (pc * enc[3]).sum(-1).numpy(),
            "rejected_logps": (pr * enc[5]).sum(-1).numpy()}


def loss_check(write: str | None) -> float:
    model, ref, tok = fixture_models()
    pairs = fixture_pairs()
    cases, worst = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for lt, beta, ls in SETTINGS:
            ref_vals = trl_per_pair(model, ref, tok, pairs, lt, beta, ls, tmp)
            got = ours_per_pair(model, ref, tok, pairs, lt, beta, ls)
            diffs = {k: float(np.max(np.abs(np.asarray(ref_vals[k]) - got[k]))) for k in got}
            ref_loss = np.asarray(ref_vals["losses"])
            worst = max(worst, float(np.max(np.abs(ref_loss - got["losses"])
                                            / np.maximum(1.0, np.abs(ref_loss)))))
            print(f"per pair {lt:8s} beta={beta:<4} ls={ls:<4}  max|ours-TRL|: "
                  + "  ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
            cases.append({"loss_type": lt, "beta": beta, "label_smoothing": ls, **ref_vals})
    if write:
        import trl
        sio.atomic_write_json(write, {
            "made_by": "python benchmarks/dpo_vs_trl.py --loss-only --write-fixture " + write,
            "what": "TRL DPOTrainer.compute_loss per pair; policy tiny_model(seed=0), reference "
                    "tiny_model(seed=1), pairs preference_pairs(AdditionTask(2), 'train', 8, "
                    "noise=0.25, seed=5)",
            "trl_version": trl.__version__, "torch_version": torch.__version__,
            "pairs": [[p.prompt, p.chosen, p.rejected] for p in pairs], "cases": cases})
        print(f"wrote {write}")
    return worst


def _sft_models(seed: int = 0):
    from scaling_rl.llm.models import load_policy
    from scaling_rl.llm.tasks import AdditionTask
    from scaling_rl.llm.trainer import sft
    task = AdditionTask(2)
    model, tok = load_policy("tiny", seed=seed)
    sft(model, tok, task, steps=60, batch_size=32, lr=1e-2, seed=seed, max_len=4)
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    return task, model.eval(), ref, tok


def _ours_trainer(model, ref, tok, loss_type, beta, ls):
    cfg = dpo.DPOConfig(beta=beta, loss_type=loss_type, label_smoothing=ls, train_pairs=64,
                        eval_pairs=8, eval_problems=8, batch_size=8, lr=1e-3)
    tr = dpo.DPOTrainer(cfg)
    tr.policy, tr.reference, tr.tokenizer = model, ref, tok
    tr.opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    return tr


def speed_check(batch: int, reps: int) -> float:
    """TRL step time / our step time on one batch (sigmoid, β = 0.1), both from the same weights."""
    task, model, ref, tok = _sft_models()
    pairs = dpo.preference_pairs(task, "train", batch, noise=0.0, seed=3)
    with tempfile.TemporaryDirectory() as tmp:
        trl_model, ours_model = copy.deepcopy(model).train(), copy.deepcopy(model).train()
        trl_tr = _trl_trainer(trl_model, ref, tok, pairs, "sigmoid", 0.1, 0.0, batch, tmp)
        collated = trl_tr._prepare_inputs(
            trl_tr.data_collator([trl_tr.train_dataset[i] for i in range(batch)]))
        trl_opt = torch.optim.AdamW(trl_model.parameters(), lr=1e-3, weight_decay=0.0)
        ours_tr = _ours_trainer(ours_model, ref, tok, "sigmoid", 0.1, 0.0)

        def trl_step():
            trl_model.train()
            loss = trl_tr.compute_loss(trl_model, collated)
            trl_opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trl_model.parameters(), 1.0)
            trl_opt.step()

        times = {"trl": [], "ours": []}
        for i in range(reps + 3):
            for name, fn in (("trl", trl_step), ("ours", lambda: ours_tr.update(pairs))):
                t0 = time.process_time()
                fn()
                if i >= 3:
                    times[name].append(time.process_time() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"step CPU time (median of {reps}, interleaved): TRL {med['trl'] * 1e3:.1f} ms, ours "
          f"{med['ours'] * 1e3:.1f} ms  (batch {batch} pairs, reference forward included)")
    return med["trl"] / med["ours"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default="")
    ap.add_argument("--write-fixture", default="")
    ap.add_argument("--loss-only", action="store_true", help="part 1 only")
    args = ap.parse_args(argv)
    try:
        import trl  # noqa: F401
    except ModuleNotFoundError:
        print("dpo_vs_trl: needs trl (pip install trl); it is a benchmark-only dependency",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    result = {"loss_max_rel_diff": loss_check(args.write_fixture or None)}
    if not args.loss_only:
        result["speedup_vs_trl"] = speed_check(args.batch, args.reps)
    if args.out:
        sio.atomic_write_json(args.out, result)
    print(f"loss_max_rel_diff={result['loss_max_rel_diff']:.2e}")
    if "speedup_vs_trl" in result:
        print(f"speedup_vs_trl={result['speedup_vs_trl']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
