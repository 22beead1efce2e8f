"""ACCO (scaling_rl/acco.py) on 2 forced CPU devices with a ZeRO-1 sharded optimiser, and the tiny decoder
LM it is checked on (scaling_rl/tiny_lm.py). Runs tests/acco_check.py in a subprocess (the device count
is fixed when jax is first imported)."""
import numpy as np
import pytest
from forced_devices import run_check


@pytest.fixture(scope="module")
def two_devices():
    return run_check("acco_check.py")


def test_zero_delay_equals_data_parallel_step(two_devices):
    r = two_devices
    assert r["devices"] == 2
    assert r["ddp_change"] > 1e-3
    assert r["ddp_vs_optax"] <= 1e-6 * max(1.0, r["ddp_change"] * 1e3), r
    assert r["ddp_loss_vs_direct"] <= 1e-5


def test_heterogeneous_workers_average_the_micro_batches_they_computed(two_devices):
    r = two_devices
    # 2 + 1 micro-batches per round: the update is that of the mean over those 6, not of 8 ...
    assert r["hetero_vs_optax"] <= 1e-6, r
    # ... and differs from the equal-count update
    assert r["hetero_vs_equal"] > 1e-4, r


def test_state_is_sharded_as_claimed(two_devices):
    shapes = two_devices["shapes"]
    moments = [(g, d) for g, d in shapes["opt"] if g]
    assert moments and all(d[0] * 2 == g[0] and d[1:] == g[1:] for g, d in moments), moments
    # one pending gradient per device, each the full parameter shape
    assert [g[1:] for g, _ in shapes["pending"]] == shapes["params"]
    assert all(g[0] == 2 and d[0] == 1 and d[1:] == g[1:] for g, d in shapes["pending"])


@pytest.mark.slow   # a learning comparison of 3 modes × 60 steps (`make test-slow`); the exact updates above stay fast
def test_delay_hurts_the_transformer_and_acco_closes_most_of_the_gap():
    c = run_check("acco_check.py", ACCO_CHECK_CURVES="1")["curves"]
    last = {m: float(np.mean(v["train"][-10:])) for m, v in c.items()}
    ev = {m: v["eval"] for m, v in c.items()}
    first = c["ddp"]["train"][0]
    assert last["ddp"] < first - 1.0, last            # DDP learns the task (from ~log 16 + init)
    gap = ev["dpu"] - ev["ddp"]
    assert gap > 0.5, ev                              # the one-step delay degrades it measurably
    assert ev["acco"] - ev["ddp"] < 0.3 * gap, ev     # ACCO closes >= 70% of that gap


def test_unknown_mode_is_a_one_line_error():
    import optax

    from scaling_rl import acco, zero
    with pytest.raises(ValueError, match="^mode: unknown 'zero'"):
        acco.Acco(lambda p, b: 0.0, zero.ShardedOptimizer(optax.sgd(0.1), 2), "zero")


# ---- the overlapped learner (scaling_rl/acco.py OverlappedAcco; tests/acco_overlap_check.py) -----------------

@pytest.fixture(scope="module")
def overlapped():
    return run_check("acco_overlap_check.py")


def test_overlapped_acco_uneven_counts_give_the_hand_computed_updates(overlapped):
    r = overlapped
    assert r["devices"] == 2
    # three updates, per-device counts (2,1)/(1,2), (1,3)/(2,1), (3,1)/(1,1): Σ sums / Σ counts, the
    # second round at the estimate θ̃ and carried to the next update, as computed by hand with optax
    assert min(r["change"]) > 1e-2, r
    assert max(r["vs_hand"]) <= 1e-6, r
    assert r["counts_seen"] == [[3, 1], [1, 1]]
    assert max(r["loss_vs_hand"]) <= 1e-5 and max(r["aux_vs_loss"]) <= 1e-5, r
    # equal counts instead: a different trajectory, so the comparison above can fail
    assert r["equal_counts_vs_hand"] > 1e-3, r
    # without overlap (zero1, ddp), uneven counts average the micro-batches actually computed
    assert r["zero1_vs_hand"] <= 1e-6 and r["ddp_vs_hand"] <= 1e-6, r


def test_overlapped_acco_compute_and_communication_are_separate_programs(overlapped):
    r = overlapped
    assert r["programs"] == ["accumulate", "communicate"]
    assert r["accumulate_collectives"] == []           # per device, no collective: can run beside one
    assert {"reduce_scatter", "all_gather"} <= set(r["communicate_collectives"])   # ZeRO-1's step
    assert r["ddp_communicate_collectives"] == ["all_reduce"]


def test_overlapped_acco_computes_while_communicating_and_the_slow_device_does_less(overlapped):
    # a 0.4 s simulated link per round, device 1 slowed 10x: the counts come from the round's
    # communication finishing, so device 0 computes many micro-batches meanwhile and device 1 fewer
    rounds = overlapped["overlap_counts"]
    assert len(rounds) == 4
    for fast, slow in rounds:
        assert fast >= 5 and 1 <= slow < fast, rounds
    assert sum(f for f, _ in rounds) >= 3 * sum(s for _, s in rounds), rounds


def test_overlapped_acco_bad_input_is_a_one_line_error():
    import optax

    from scaling_rl import acco, parallel, zero
    mesh = parallel.make_mesh(1)
    opt = zero.ShardedOptimizer(optax.sgd(0.1), 1)
    with pytest.raises(ValueError, match="^mode: unknown 'dpu'"):
        acco.OverlappedAcco(lambda p, b, e: (0.0, {}), opt, mesh, "dpu")
    with pytest.raises(ValueError, match="^opts: sharded 2 ways, but the mesh has 1"):
        acco.OverlappedAcco(lambda p, b, e: (0.0, {}), zero.ShardedOptimizer(optax.sgd(0.1), 2), mesh)
    with pytest.raises(ValueError, match="^slowdown: one factor >= 1 per device"):
        acco.OverlappedAcco(lambda p, b, e: (0.0, {}), opt, mesh, slowdown=(0.5,))


def test_crl_training_path_runs_on_the_overlapped_learner(overlapped):
    r = overlapped["crl"]
    # ZeRO-1 from the host, one micro-batch per device, is the jitted ZeRO-1 chunk (same batches, same keys)
    assert r["params_change"] > 1e-3, r
    assert r["host_vs_jitted_params"] <= 1e-6 and r["host_vs_jitted_loss"] <= 1e-5, r
    assert r["grad_steps"] == [16, 16]
    assert r["same_layout"]                      # what a checkpoint restores into
    assert r["chunk_error"].startswith("overlap: the overlapped learner runs its chunks from the host")
    # ACCO through train.run, two chunks (pending sums carried across the boundary), device 1 10x slower:
    # the fast device accumulates up to the cap while the slow one does about one micro-batch a round
    assert r["status"] == "done" and r["program_status"] == "host" and r["finite"], r
    assert r["acco_grad_steps"] == [8, 16]
    fast, slow = r["micro_batches"]
    for f, s in zip(fast, slow):
        assert 2 <= s < f <= 12 and f >= 2 * s, r


def test_crl_overlap_bad_input_is_a_one_line_error():
    from scaling_rl.agents import crl
    with pytest.raises(ValueError, match="^overlap: acco='dpu' runs only inside the jitted chunk"):
        crl.Config(overlap=True, acco="dpu", zero_optimizer=True)
    with pytest.raises(ValueError, match="^overlap: each device's micro-batches"):
        crl.Config(overlap=True, global_negatives=True)
    with pytest.raises(ValueError, match="^overlap_slowdown: must be a finite number >= 1"):
        crl.Config(overlap_slowdown=0.5)
    with pytest.raises(ValueError, match="^overlap_micro: must be an integer >= 1"):
        crl.Config(overlap_micro=0)
    with pytest.raises(ValueError, match="^overlap: needs a data mesh"):
        crl.make(crl.Config(env="point_maze/open", num_envs=4, env_steps=128, learning_starts=64, chunk_env_steps=64,
                            batch_size=16, width=16, depth=4, actor_width=8, actor_depth=4, repr_dim=8,
                            buffer_size=256, eval_episodes=1, overlap=True))
