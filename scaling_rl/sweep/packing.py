"""Packing: trials that differ only in their first `seed` and in shape-preserving
hyper-parameters run as ONE vmapped program.

Most Config fields are static (closed over by the agent's `make`: widths, UTD, batch, gamma...), but
an agent module's `PACKABLE` fields (SAC: lr, actor_lr, alpha_lr, weight_decay, tau; DQN: lr,
weight_decay, tau; CRL: lr) live in the train state (the optimiser states' `optax.inject_hyperparams`
values; τ in the learner's `tau` entry), so one program can give every seed its own values. Trials are grouped by their config minus those fields (the
trial kind's `packable()`); a pack of k trials of n seeds each runs
`train.run(seeds=k*n, seed_configs=<member j's config for seeds j*n..j*n+n-1>,
seed_ids=<(member j's seed, i) for seed j*n+i>)` in `<root>/packs/<pack id>/`, and member j
receives pack seeds j*n .. j*n+n-1 (renumbered 0..n-1) as its metrics. With `seed_ids` seed i of
member j is keyed fold_in(PRNGKey(trial j's seed), i), exactly as when trial j runs alone, so a
packed member's metrics equal its one-by-one metrics to float tolerance (tests/test_packed_trials.py);
trial kinds whose `run` takes no `seed_ids` (the toy) get pack seeds from the first member's seed.
Its status records `packed_in`; its trial directory gets config.json and metrics.parquet.

How many trials one program holds is chosen per group from the machine's memory
(`memory.pack_capacity`: the agent's peak estimate × seeds against 80% of the local budget, a
worker's `gpu_mem_fraction` of a shared GPU), at most MAX_PACK; bigger groups are split evenly.

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
import inspect
import json
import traceback
from collections import defaultdict

from scaling_rl.errors import one_line
from scaling_rl.io import atomic_write_json, atomic_write_parquet
from scaling_rl.sweep import early_stop, registry
from scaling_rl.sweep.registry import trial_param_count
from scaling_rl.sweep.trial import canonical_json
from scaling_rl.sweep.store import FINISHED, Store, _now

MAX_PACK = 256   # trials per program at most, whatever the memory allows


def pack_key(trial, packable: tuple = ()) -> str:
    """What members of one pack share: everything but the seed and the `packable` fields."""
    config = {k: v for k, v in trial.config.items() if k not in packable}
    return canonical_json({"agent": trial.agent, "config": config, "seeds": trial.seeds})


def groups(store: Store, tids, capacity=None) -> list[list[str]]:
    """Unfinished trials grouped by everything but the seed and the packable hyper-parameters
    (members sorted by config, then seed), each group cut into near-equal packs of at most
    `capacity(trial)` members (default MAX_PACK); trial kinds that cannot pack are left out."""
    by_key: dict[str, list] = defaultdict(list)
    first: dict[str, object] = {}
    for tid in tids:
        st = store.status(tid)
        if st.get("no_pack") or st.get("state") in (*FINISHED, "failed"):
            continue
        t = store.trial(tid)
        kind = registry.get(t.agent)
        if kind.packable is None:
            continue
        key = pack_key(t, tuple(kind.packable()))
        by_key[key].append((canonical_json(t.config), t.seed, tid))
        first.setdefault(key, t)
    out = []
    for key, members in by_key.items():
        members.sort()
        ids = [tid for *_, tid in members]
        cap = max(1, min(MAX_PACK, int(capacity(first[key]) if capacity else MAX_PACK)))
        parts = -(-len(ids) // cap)
        size = -(-len(ids) // parts)
        out.extend(ids[i:i + size] for i in range(0, len(ids), size))
    return out


def memory_capacity(opts):
    """`groups`' capacity from this machine's memory (`memory.pack_capacity`), cached per group key."""
    from scaling_rl.sweep import memory

    cache: dict[str, int] = {}

    def capacity(trial) -> int:
        key = canonical_json([trial.agent, trial.config, trial.seeds])
        if key not in cache:
            try:
                cache[key] = memory.pack_capacity(trial.agent, trial.config, trial.seeds,
                                                  mem_fraction=getattr(opts, "gpu_mem_fraction", None),
                                                  limit=MAX_PACK)
            except (ValueError, TypeError):   # no estimate for this config: train.run judges it
                cache[key] = MAX_PACK
        return cache[key]

    return capacity


def _takes_seed_ids(run) -> bool:
    try:
        return "seed_ids" in inspect.signature(run).parameters
    except (TypeError, ValueError):
        return False


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
            if _takes_seed_ids(kind.run):   # each member's seeds keep the keys they have alone
                extra["seed_ids"] = [(t.seed, i) for t in trials for i in range(n)]
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
