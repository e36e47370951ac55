#!/usr/bin/env python3
"""A simulated trainer (no torch) that reports to the trainmeter agent.

It sleeps per step to hit the requested timing and reports what a real training
loop would: tokens per step, data-wait vs compute time, a decaying loss, and an
eval per epoch. It honours a ``stop`` from the agent and prints dataloader
advice when it arrives. Used by ``make demo``.

    python3 clients/python/examples/train_sim.py --socket /tmp/tm.sock --run-id demo-1 \\
        --model llama-3-8b --gpus 0,1 --duration-s 8 --step-time 0.1 --tokens-per-s 200000
"""

import argparse
import math
import os
import random
import sys
import time

try:
    import trainmeter
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import trainmeter

from trainmeter.metadata import METADATA_KEYS, PROTOCOL_KEYS  # noqa: E402


def parse_gpus(s):
    out = []
    for part in (s or "").split(","):
        part = part.strip()
        if not part:
            continue
        out.append(int(part) if part.isdigit() else part)  # NVML index or UUID
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="Simulated training loop instrumented with trainmeter.")
    p.add_argument("--socket", default=None, help="agent socket (default: $TRAINMETER_SOCKET or /run/trainmeter/agent.sock)")
    p.add_argument("--run-id", default=None, help="run id (default: $TRAINMETER_RUN_ID or generated)")
    p.add_argument("--model", default="sim-model")
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--backend", default="sim")
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--notes", default=None)
    p.add_argument("--gpus", default="0", help="comma-separated NVML indices or UUIDs, e.g. 0,1")
    p.add_argument("--warmup-s", type=float, default=None, help="warmup to exclude (agent default if unset)")
    p.add_argument("--duration-s", type=float, default=8.0, help="wall time to train")
    p.add_argument("--tokens-per-s", type=float, default=200000.0, help="target throughput")
    p.add_argument("--step-time", type=float, default=0.1, help="seconds per step")
    p.add_argument("--data-wait-frac", type=float, default=0.1, help="share of each step spent waiting for data")
    p.add_argument("--epochs", type=int, default=2, help="evals spread evenly over the run")
    p.add_argument("--gpu-price-per-hour", type=float, default=None)
    p.add_argument("--num-workers", type=int, default=None, help="simulated dataloader workers (reported)")
    p.add_argument("--prefetch-factor", type=int, default=None)
    p.add_argument("--budget-scope", default=None, help="the budget this run counts against (see docs/budgets.md)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label of the run, e.g. team=nlp (budgets can match labels); repeatable")
    args = p.parse_args(argv)
    labels = {}
    for kv in args.label:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            p.error("--label %r: want KEY=VALUE" % kv)
        if k in METADATA_KEYS or k in PROTOCOL_KEYS:
            p.error("--label %s: %s is a run_start field, not a label" % (kv, k))
        labels[k] = v

    step_time = max(1e-4, args.step_time)
    planned_steps = max(1, int(round(args.duration_s / step_time)))
    tokens_per_step = int(round(args.tokens_per_s * step_time))
    samples_per_step = args.batch_size * args.grad_accum
    wait_frac = min(1.0, max(0.0, args.data_wait_frac))
    epochs = max(1, args.epochs)
    steps_per_epoch = max(1, planned_steps // epochs)
    rng = random.Random(args.seed)
    gpus = parse_gpus(args.gpus)

    # Keys left as None are not sent.
    run = trainmeter.start(
        run_id=args.run_id,
        socket_path=args.socket,
        model=args.model,
        dataset=args.dataset,
        backend=args.backend,
        optimizer=args.optimizer,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        seq_len=args.seq_len,
        precision=args.precision,
        seed=args.seed,
        notes=args.notes,
        warmup_s=args.warmup_s,
        gpus=gpus or None,
        num_workers=args.num_workers,
        prefetch_factor=args.prefetch_factor,
        planned_steps=planned_steps,
        gpu_price_per_hour=args.gpu_price_per_hour,
        budget_scope=args.budget_scope,
        labels=labels,
    )

    steps = 0
    tokens = 0
    epoch = 0
    stopped = None
    last_advice = None
    t0 = time.monotonic()
    next_t = t0
    try:
        for i in range(1, planned_steps + 1):
            if run.should_stop():
                stopped = run.stop_reason
                break
            next_t += step_time
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            data_wait = step_time * wait_frac
            compute = step_time - data_wait
            progress = i / planned_steps
            loss = 0.9 + 2.1 * math.exp(-4.0 * progress) + rng.gauss(0, 0.02)
            run.step(
                step=i,
                tokens=tokens_per_step,
                samples=samples_per_step,
                data_wait_s=round(data_wait, 6),
                compute_s=round(compute, 6),
                loss=round(loss, 4),
            )
            steps += 1
            tokens += tokens_per_step
            if i % steps_per_epoch == 0 and epoch < epochs:
                epoch += 1
                val_loss = 1.0 + 2.0 * math.exp(-3.5 * progress) + rng.gauss(0, 0.02)
                acc = min(0.99, 0.3 + 0.6 * (1 - math.exp(-3.0 * progress)))
                run.eval(epoch=epoch, val_loss=round(val_loss, 4), accuracy=round(acc, 4))
                adv = run.advice()
                if adv is not None and adv != last_advice:
                    last_advice = adv
                    print(
                        "train_sim: advice: num_workers=%s prefetch_factor=%s (%s)"
                        % (adv.num_workers, adv.prefetch_factor, adv.reason),
                        flush=True,
                    )
        else:
            if run.should_stop():
                stopped = run.stop_reason
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        run.end()

    st = run.stats()
    print(
        "train_sim: run_id=%s steps=%d tokens=%d wall_s=%.2f sent=%d dropped=%d agent_errors=%d%s"
        % (
            run.run_id,
            steps,
            tokens,
            time.monotonic() - t0,
            st.sent,
            st.dropped,
            st.errors_from_agent,
            (" stopped=%r" % stopped) if stopped else "",
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
