"""Peak memory of the LLM log-prob passes on a real vocabulary size, before and after the selective
log-softmax, in units of the logits of one training micro-batch (mb x T x V float32).

    python benchmarks/llm_memory.py [--batch 16] [--micro 4] [--length 32] [--vocab 151936]

Each cell runs in a fresh process on the CPU: a Qwen2-architecture model with the real vocabulary
and a tiny body (so the logits dominate), the kernel's peak-RSS mark reset just before the pass
(/proc/self/clear_refs), peak RSS minus the RSS before it, with glibc's mmap threshold fixed at
128 KiB so freed buffers leave the RSS. Passes:
- `no-grad`: the old / reference log-probs of the whole generation batch (B rows);
- `grad`: one training micro-batch (mb rows) forward + backward, with the entropy, as the trainer.
`before` is the former code path (all B rows at once, the kept logits sliced, a float32 copy, a full
log-softmax, entropy from its exponential); `after` is `rollout.completion_logprobs` (micro-batches
of mb rows without grad, selective log-softmax in float32 chunks). Target: peak <= 2x.

A second table says what fits on one 141 GB GPU for Qwen2.5-0.5B/1.5B/7B (parameter counts from
their architecture configs, built on the meta device): AdamW in float32 needs 16 bytes per
parameter (weights, gradients, two moments) plus 4 for a reference copy when beta > 0; what is left
bounds the training micro-batch through its logits (2 x mb x T x V x 4 bytes: logits and their
gradient). Activations, the generation KV cache and allocator slack are NOT counted, so the rows
are an upper bound, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

GPU_BYTES = 141e9
QWEN25 = {  # hidden, intermediate, layers, heads, kv heads, vocab, tied embeddings
    "Qwen2.5-0.5B": (896, 4864, 24, 14, 2, 151936, True),
    "Qwen2.5-1.5B": (1536, 8960, 28, 12, 2, 151936, True),
    "Qwen2.5-7B": (3584, 18944, 28, 28, 4, 152064, False),
}


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(args) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, Qwen2Config

    from scaling_rl.llm import rollout
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=8, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=16,
                      max_position_embeddings=4 * args.length, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()
    B, mb, T = args.batch, args.micro, args.length
    rows = B if args.pass_ == "no-grad" else mb
    p_ids = torch.randint(args.vocab, (rows, 8))
    c_ids = torch.randint(args.vocab, (rows, T))
    p_mask, c_mask = torch.ones_like(p_ids), torch.ones_like(c_ids)

    def before():  # the former rollout.completion_logprobs
        ids = torch.cat([p_ids, c_ids], 1)
        mask = torch.cat([p_mask, c_mask], 1)
        out = model(input_ids=ids, attention_mask=mask, position_ids=rollout._positions(mask),
                    logits_to_keep=T + 1, use_cache=False)
        logsm = F.log_softmax(out.logits[:, :-1].float(), -1)
        logp = logsm.gather(-1, c_ids[..., None]).squeeze(-1)
        ent = None
        if args.pass_ == "grad":
            with torch.no_grad():
                ent = -(logsm.exp() * logsm).sum(-1)
        return logp, ent

    def after():
        return rollout.completion_logprobs(model, p_ids, p_mask, c_ids, c_mask,
                                           with_entropy=args.pass_ == "grad", micro_batch=mb)

    fn = before if args.variant == "before" else after
    if args.pass_ == "no-grad":
        with torch.no_grad():
            fn()  # warm-up (lazy allocations), then measure
            Path("/proc/self/clear_refs").write_text("5")
            base = _rss("VmRSS")
            fn()
    else:
        logp, _ = fn()
        logp.sum().backward()
        model.zero_grad(set_to_none=False)
        del logp
        Path("/proc/self/clear_refs").write_text("5")
        base = _rss("VmRSS")
        logp, _ = fn()
        logp.sum().backward()
    return {"peak_bytes": _rss("VmHWM") - base}


def param_count(hidden, inter, layers, heads, kv, vocab, tied) -> int:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                      tie_word_embeddings=tied)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--fit-length", type=int, default=512, help="completion tokens for the fit table")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="after", help=argparse.SUPPRESS)
    ap.add_argument("--pass", dest="pass_", default="grad", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if min(args.batch, args.micro, args.length, args.vocab) < 1 or args.batch % args.micro:
        sys.exit("llm_memory: --batch, --micro, --length, --vocab must be >= 1 and micro must divide batch")
    if args.child:
        print(json.dumps(child(args)))
        return
    unit = args.micro * args.length * args.vocab * 4
    print(f"B={args.batch} mb={args.micro} T={args.length} V={args.vocab}: "
          f"logits of one micro-batch = {unit / 2**20:.0f} MiB (the unit below)")
    print(f"{'pass':8s} {'before':>8s} {'after':>8s}   peak RSS / logits(mb), one fresh process each")
    # a fixed mmap threshold: every large buffer is its own mapping, returned to the OS when freed,
    # so peak RSS follows live memory (glibc's dynamic threshold would keep freed chunks resident)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
           "MALLOC_MMAP_THRESHOLD_": "131072"}
    for pass_ in ("no-grad", "grad"):
        ratios = []
        for variant in ("before", "after"):
            cmd = [sys.executable, __file__, "--child", "--variant", variant, "--pass", pass_,
                   "--batch", str(args.batch), "--micro", str(args.micro),
                   "--length", str(args.length), "--vocab", str(args.vocab)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                sys.exit(f"llm_memory: {variant}/{pass_} failed: {out.stderr.strip().splitlines()[-1]}")
            ratios.append(json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"] / unit)
        print(f"{pass_:8s} {ratios[0]:8.2f} {ratios[1]:8.2f}")
    print(f"\nOne {GPU_BYTES / 1e9:.0f} GB GPU, AdamW fp32 (16 B/param, +4 with a reference), "
          f"T={args.fit_length} completion tokens; rows = upper bound on the micro-batch from "
          "2 x logits (activations not counted)")
    print(f"{'model':14s} {'params':>8s} {'state GB':>9s} {'+ref GB':>8s} {'rows':>6s} {'rows +ref':>9s}")
    for name, arch in QWEN25.items():
        n = param_count(*arch)
        per_row = 2 * args.fit_length * arch[5] * 4
        state, with_ref = 16 * n, 20 * n
        rows = [int(max(0.0, GPU_BYTES - s) // per_row) for s in (state, with_ref)]
        print(f"{name:14s} {n / 1e9:7.2f}B {state / 1e9:9.1f} {with_ref / 1e9:8.1f} "
              f"{rows[0]:6d} {rows[1]:9d}" + ("   (does not fit)" if not rows[1] else ""))


if __name__ == "__main__":
    main()
