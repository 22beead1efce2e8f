"""Running a spec: `prepare` the store, then `run_sweep` its trials on a backend.

Re-exported by `scaling_rl.sweep`; `adaptive` imports it from here (not from the package). The spec
parses its `adaptive:` block with `sweep.design` (not `sweep.adaptive`), so adaptive -> run -> spec
never loops back, type-only imports included.
"""
from __future__ import annotations

import contextlib
import typing

from scaling_rl.sweep.collect import status_summary
from scaling_rl.sweep.store import Store
from scaling_rl.sweep.trial import SpecError

if typing.TYPE_CHECKING:
    from scaling_rl.sweep.spec import Spec


def prepare(spec: Spec, *, retry_diverged: bool = False, trials=None) -> Store:
    """Create the store's trial directories (existing ones are kept) and make failed trials
    (and diverged ones when asked) pending again, so a rerun retries them. `trials`: a subset of
    the spec's (an adaptive study's proposals so far); default all."""
    trials = spec.trials if trials is None else tuple(trials)
    store = Store(spec.out_dir)
    store.add(trials)
    store.write_sweep_record(spec.raw, [t.id for t in trials])
    retry = ("failed", "diverged") if retry_diverged else ("failed",)
    for t in trials:
        st = store.status(t.id)
        if st.get("state") not in retry:
            continue
        claim = store.try_claim(t.id)
        if claim is None:
            continue
        with claim:
            if store.status(t.id).get("state") in retry:
                if st.get("state") == "diverged":  # train.run refuses to resume a diverged run
                    with contextlib.suppress(FileNotFoundError):
                        (store.trial_dir(t.id) / "status.json").unlink()
                store.write_status(claim, "pending", error=None, retried_from=st.get("state"))
    return store


def run_sweep(spec: Spec, *, backend: str | None = None, workers: int | None = None,
              progress: bool = True, retry_diverged: bool = False, ray_address: str | None = None,
              wait: bool = True, trials=None) -> dict:
    """Run every unfinished trial of `spec` (or of `trials`, a subset) on a backend; returns
    `status_summary` of the store. A spec with `adaptive:` is run round by round by
    `sweep.adaptive.run_adaptive` instead (`scaling-rl sweep run` does that)."""
    from scaling_rl.sweep import backends
    from scaling_rl.sweep.runner import RunOptions

    backend = backend or spec.backend.get("name", "local")
    asked_workers = workers
    workers = spec.backend.get("workers", 1) if workers is None else workers
    frac = spec.backend.get("gpu_mem_fraction")
    if frac is None and backend == "local" and workers > 1:
        frac = round(0.95 / workers, 3)   # several trials share a GPU: split its memory
    from scaling_rl.sweep import memory
    memory.check_spec(spec, backend)   # a trial that cannot fit: refuse before anything is written
    trials = spec.trials if trials is None else tuple(trials)
    prepare(spec, retry_diverged=retry_diverged, trials=trials)
    opts = RunOptions(root=str(spec.out_dir), trial_ids=tuple(t.id for t in trials),
                      sweep_name=spec.name, wandb=spec.wandb, checkpoint_every=spec.checkpoint_every,
                      compile_cache=spec.compile_cache, gpu_mem_fraction=frac,
                      pack=spec.pack, early_stop=spec.early_stop)
    if backend == "local":
        backends.run_local(opts, workers, progress=progress)
    elif backend == "slurm":
        # array parallelism: --workers when given, else slurm.array_parallelism, else all trials
        backends.run_slurm(opts, spec.backend.get("slurm", {}), workers=asked_workers or None,
                           progress=progress, wait=wait)
    elif backend == "ray":
        ray_opts = dict(spec.backend.get("ray", {}))
        if ray_address:
            ray_opts["address"] = ray_address
        backends.run_ray(opts, ray_opts, progress=progress)
    else:
        raise SpecError(f"backend: unknown backend {backend!r}; allowed: local, slurm, ray")
    return status_summary(spec.out_dir)
