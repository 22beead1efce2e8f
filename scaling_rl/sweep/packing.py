"""Packing: trials that differ only in their first `seed` and in shape-preserving
hyper-parameters run as ONE vmapped program.

Most Config fields are static (closed over by the agent's `make`: widths, UTD, batch...), but an
agent module's `PACKABLE` fields (SAC: lr, actor_lr, alpha_lr, weight_decay; DQN: lr,
weight_decay; CRL: lr) live in the optimiser states (`optax.inject_hyperparams`), so one program
can give every seed its own values. Trials are grouped by their config minus those fields (the
trial kind's `packable()`); a pack of k trials of n seeds each runs
`train.run(seeds=k*n, seed=<first member's seed>, seed_configs=<member j's config for seeds
j*n..j*n+n-1>)` in `<root>/packs/<pack id>/`, and member j receives pack seeds j*n .. j*n+n-1
(renumbered 0..n-1) as its metrics. A packed member is an equally valid, independent sample, but
its random stream is not bit-identical to the same trial run alone (train.run derives seed i as
fold_in(PRNGKey(seed), i)); its status records `packed_in`. (Seed i of a pack with member configs
equals seed i of `train.run` with that member's config and the same root seed: tests check it.)

On divergence the members owning the bad seeds become `diverged` and the rest run alone later;
on any other failure every member falls back to running alone (`no_pack`).

Early stopping (`RunOptions.early_stop`): the pack's run gets one stop callable
(`early_stop.PackWatcher`) that asks the rule about each member's own seeds and stops the pack only
when every member's rule fires (a member that reached J early waits for the others: its D_J cannot
change, the pack just saves less). Each member then records its own decision (reason, stop step,
savings) exactly as an unpacked trial would.
"""
from __future__ import annotations

import hashlib
import json
import traceback
from collections import defaultdict

from scaling_rl.errors import one_line
from scaling_rl.io import atomic_write_json, atomic_write_parquet
from scaling_rl.sweep import early_stop, registry
from scaling_rl.sweep.registry import trial_param_count
from scaling_rl.sweep.trial import canonical_json
from scaling_rl.sweep.store import FINISHED, Store, _now

MAX_PACK = 16


def pack_key(trial, packable: tuple = ()) -> str:
    """What members of one pack share: everything but the seed and the `packable` fields."""
    config = {k: v for k, v in trial.config.items() if k not in packable}
    return canonical_json({"agent": trial.agent, "config": config, "seeds": trial.seeds})


def groups(store: Store, tids) -> list[list[str]]:
    """Unfinished trials grouped by everything but the seed and the packable hyper-parameters
    (members sorted by config, then seed); trial kinds that cannot pack are left out."""
    by_key: dict[str, list] = defaultdict(list)
    for tid in tids:
        st = store.status(tid)
        if st.get("no_pack") or st.get("state") in (*FINISHED, "failed"):
            continue
        t = store.trial(tid)
        kind = registry.get(t.agent)
        if kind.packable is None:
            continue
        by_key[pack_key(t, tuple(kind.packable()))].append((canonical_json(t.config), t.seed, tid))
    out = []
    for members in by_key.values():
        members.sort()
        ids = [tid for *_, tid in members]
        out.extend(ids[i:i + MAX_PACK] for i in range(0, len(ids), MAX_PACK))
    return out


def run_pack(store: Store, group: list[str], opts, run_single) -> int:
    """Claim what we can of `group` and run it packed, or with `run_single(store, claim, opts)` (the
    runner's one-trial path, passed in so this module does not import the runner) if only one is ours."""

    claims = []
    try:
        for tid in group:
            c = store.try_claim(tid)
            if c is None:
                continue
            if store.status(tid).get("state") in (*FINISHED, "failed") or store.status(tid).get("no_pack"):
                c.release()
                continue
            claims.append(c)
        if not claims:
            return 0
        if len(claims) == 1:
            run_single(store, claims[0], opts)
            return 1
        trials = [store.trial(c.tid) for c in claims]
        first, n = trials[0], trials[0].seeds
        pack_id = hashlib.sha256(canonical_json([c.tid for c in claims]).encode()).hexdigest()[:12]
        pdir = store.root / "packs" / pack_id
        kind = registry.get(first.agent)
        for c in claims:
            st = store.status(c.tid)
            store.write_status(c, "running", started=st.get("started") or _now(), attempt_started=_now(),
                               attempts=int(st.get("attempts", 0)) + 1, error=None, packed_in=pack_id)
        error = None
        n_params = None
        watcher = None
        try:
            extra = {}
            if any(t.config != first.config for t in trials):  # per-seed hyper-parameters
                extra["seed_configs"] = [t.config for t in trials for _ in range(n)]
            if getattr(opts, "early_stop", None) is not None:
                if not kind.stoppable:   # refused at spec time; never ignore a rule silently
                    raise ValueError(f"early_stop: agent {first.agent!r} cannot stop a trial early")
                pdir.mkdir(parents=True, exist_ok=True)
                watcher = early_stop.PackWatcher(opts.early_stop, early_stop.budget_of(first.config, kind), pdir,
                                                 len(claims), n)
                extra["stop"] = watcher
            df = kind.run(first.config, str(pdir), n * len(claims), first.seed, wandb=False,
                          checkpoint_every=opts.checkpoint_every, **extra)
        except Exception as e:  # noqa: BLE001
            error = e
            (pdir / "error.txt").parent.mkdir(parents=True, exist_ok=True)
            (pdir / "error.txt").write_text(traceback.format_exc())
            df = None
        n_params = trial_param_count(kind, first.config, pdir)
        decisions = watcher.final(df) if (watcher is not None and error is None) else None
        if error is not None and type(error).__name__ == "Diverged" and (pdir / "metrics.parquet").exists():
            import pandas as pd
            df = pd.read_parquet(pdir / "metrics.parquet")
            bad = set(json.loads((pdir / "status.json").read_text()).get("seeds", [])) \
                if (pdir / "status.json").exists() else set(range(n * len(claims)))
        for j, (c, t) in enumerate(zip(claims, trials)):
            tdir = store.trial_dir(c.tid)
            if error is None or (type(error).__name__ == "Diverged" and df is not None
                                 and bad & set(range(j * n, j * n + n))):
                part = df[(df["seed"] >= j * n) & (df["seed"] < j * n + n)].copy()
                part["seed"] = part["seed"] - j * n
                atomic_write_parquet(tdir / "metrics.parquet", part.reset_index(drop=True))
                atomic_write_json(tdir / "config.json", {"agent": t.agent, "config": t.config,
                                                         "seeds": t.seeds, "seed": t.seed,
                                                         "packed_in": pack_id, "pack_seed_offset": j * n})
            if error is None:
                stop_fields = {}
                if watcher is not None:
                    stop_fields = early_stop.status_fields(decisions[j] if decisions else None, watcher.budget,
                                                           t.seeds, t.config, n_params)
                store.write_status(c, "done", finished=_now(), param_count=n_params, **stop_fields)
            elif type(error).__name__ == "Diverged" and df is not None and bad & set(range(j * n, j * n + n)):
                store.write_status(c, "diverged", finished=_now(), error=one_line(error),
                                   step=int(getattr(error, "step", 0)))
            else:
                store.write_status(c, "pending", no_pack=True, error=f"pack failed: {one_line(error)}")
        return len(claims)
    finally:
        for c in claims:
            c.release()
