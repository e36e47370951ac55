#!/usr/bin/env python3
"""A minimal real PyTorch training loop instrumented with trainmeter.

A tiny causal transformer LM trained on random tokens. trainmeter.TimedLoader
times, per step, how long it waited for the DataLoader and how long compute took
(the loop synchronises CUDA so the compute time is honest); the loop reports
tokens per step to the agent and applies the agent's dataloader advice between
epochs with trainmeter.rebuild_dataloader.

    pip install torch        # or Debian's python3-torch, with /usr/bin/python3
    python3 clients/python/examples/train_torch.py --socket /tmp/tm.sock --steps 200

Distributed (DDP): under torchrun, or any launcher that sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT, each rank joins the process group
(nccl on CUDA, gloo on CPU), shards the data with a DistributedSampler and
reports into the run id every rank derives alike (trainmeter.dist).

--item-delay-ms makes every item take that long to load (a stand-in for a
heavy decode/augmentation; a sleep, so it costs wall time, not CPU): the
loader then cannot keep up with num_workers=0 and the agent's advice to add
workers pays (docs/recommendations.md).
"""

import argparse
import inspect
import os
import sys
import time
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset, DistributedSampler
except ImportError:
    sys.stderr.write(
        "train_torch.py needs PyTorch, which is not installed.\n"
        "Install it (pip install torch) or use examples/train_sim.py, which needs nothing.\n"
    )
    sys.exit(2)

try:
    import trainmeter
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import trainmeter


class RandomTokens(Dataset):
    def __init__(self, n, seq_len, vocab, seed, item_delay_s=0.0):
        self.n, self.seq_len, self.vocab, self.seed = n, seq_len, vocab, seed
        self.item_delay_s = item_delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.item_delay_s > 0:
            time.sleep(self.item_delay_s)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)


class TinyLM(nn.Module):
    def __init__(self, vocab, d_model, n_layers, n_heads, seq_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)
        # is_causal (PyTorch >= 2.0) lets the encoder take the fast causal path;
        # 1.13 has no such argument and rejects it, and the mask alone is exact on both.
        self._causal_kw = {"is_causal": True} if "is_causal" in inspect.signature(nn.TransformerEncoder.forward).parameters else {}

    def forward(self, x):
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        h = self.blocks(h, mask=self.mask[:t, :t], **self._causal_kw)
        return self.head(self.norm(h))


def main(argv=None):
    p = argparse.ArgumentParser(description="Tiny PyTorch LM on random tokens, reporting to trainmeter.")
    p.add_argument("--socket", default=None)
    p.add_argument("--run-id", default=None)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--warmup-s", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--item-delay-ms", type=float, default=0.0,
                   help="extra time each item takes to load (a deliberately heavy transform)")
    p.add_argument("--adjustment-interval", type=int, default=None,
                   help="steps between two dataloader advice evaluations (agent default: 50)")
    p.add_argument("--dist-timeout-s", type=float, default=300.0,
                   help="DDP: how long a rank waits for the others in a collective")
    args = p.parse_args(argv)

    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    distributed = world_size > 1
    rank = int(os.environ.get("RANK", "0") or 0) if distributed else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0) if distributed else 0
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                timeout=timedelta(seconds=args.dist_timeout_s))
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    use_bf16 = args.precision == "bf16" and (device.type == "cpu" or torch.cuda.is_bf16_supported())
    core = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq_len).to(device)
    model = DistributedDataParallel(core, device_ids=[local_rank] if device.type == "cuda" else None) if distributed else core
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # --steps is per rank: each rank trains on its own shard of the data.
    steps_per_epoch = max(1, args.steps // max(1, args.epochs))
    ds = RandomTokens(steps_per_epoch * args.batch_size * world_size, args.seq_len, args.vocab, args.seed,
                      item_delay_s=args.item_delay_ms / 1000.0)
    val = RandomTokens(4 * args.batch_size, args.seq_len, args.vocab, args.seed + 1)
    sampler = DistributedSampler(ds, shuffle=True, seed=args.seed, drop_last=True) if distributed else None

    def loader(num_workers, prefetch_factor):
        kw = dict(batch_size=args.batch_size, num_workers=num_workers, pin_memory=device.type == "cuda", drop_last=True)
        if sampler is not None:
            kw.update(sampler=sampler)  # kept by rebuild_dataloader: the shards stay disjoint
        else:
            kw.update(shuffle=True)
        if num_workers > 0:
            kw.update(prefetch_factor=prefetch_factor, persistent_workers=False)
        return DataLoader(ds, **kw)

    num_workers, prefetch = args.num_workers, args.prefetch_factor
    gpus = [torch.cuda.current_device()] if device.type == "cuda" else None

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    with trainmeter.start(
        run_id=args.run_id,
        socket_path=args.socket,
        model="tinylm-d%d-l%d" % (args.d_model, args.layers),
        dataset="random-tokens",
        backend="pytorch",
        optimizer="adamw_torch",
        batch_size=args.batch_size,
        grad_accum=1,
        seq_len=args.seq_len,
        precision=args.precision if use_bf16 or args.precision == "fp32" else "fp32",
        seed=args.seed,
        warmup_s=args.warmup_s,
        gpus=gpus,
        num_workers=num_workers,
        prefetch_factor=prefetch,
        planned_steps=args.steps,
        # Announcing epochs tells the advisor this loop applies advice only at
        # epoch boundaries: it holds a change until one (docs/recommendations.md).
        planned_epochs=args.epochs,
        adjustment_interval=args.adjustment_interval,
        labels={"torch_version": torch.__version__},
    ) as run:
        step = tokens_total = 0
        data_wait_total = compute_total = 0.0
        train_loader = trainmeter.TimedLoader(loader(num_workers, prefetch), run=run)
        for epoch in range(1, args.epochs + 1):
            model.train()
            if sampler is not None:
                sampler.set_epoch(epoch)
            for batch in train_loader:
                if run.should_stop():
                    print("stopping: %s" % run.stop_reason)
                    return 0
                batch = batch.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    logits = model(batch[:, :-1])
                    loss = nn.functional.cross_entropy(logits.float().reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sync()
                step += 1
                tokens = batch.shape[0] * (batch.shape[1] - 1)
                # The loader's timings of this step, kept for the summary line.
                data_wait_s, compute_s = train_loader.take_timings()
                tokens_total += tokens
                data_wait_total += data_wait_s or 0.0
                compute_total += compute_s or 0.0
                run.step(
                    step=step,
                    tokens=tokens,
                    samples=batch.shape[0],
                    loss=loss.item(),
                    data_wait_s=data_wait_s,
                    compute_s=compute_s,
                )
            core.eval()
            with torch.no_grad():  # on the unwrapped model: no collective, each rank alone
                vb = torch.stack([val[i] for i in range(len(val))]).to(device)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    vl = core(vb[:, :-1])
                val_loss = nn.functional.cross_entropy(vl.float().reshape(-1, args.vocab), vb[:, 1:].reshape(-1))
                acc = (vl.argmax(-1) == vb[:, 1:]).float().mean()
            if rank == 0:  # one eval per epoch for the run (every rank still applies advice)
                run.eval(epoch=epoch, val_loss=val_loss.item(), accuracy=acc.item())
            rebuilt = trainmeter.rebuild_dataloader(train_loader, run.advice())
            if rebuilt is not train_loader:
                train_loader = rebuilt
                print("applied dataloader advice after step %d (epoch %d): num_workers=%d prefetch_factor=%s"
                      % (step, epoch, train_loader.num_workers, train_loader.prefetch_factor), flush=True)
    st = run.stats()  # after run_end was flushed
    if distributed:
        dist.destroy_process_group()
    # Whole run, this rank: what it reported (tokens; the loader's data wait and compute, s).
    print("train_torch: rank=%d steps=%d tokens=%d data_wait_s=%.6f compute_s=%.6f run=%s sent=%d dropped=%d"
          % (rank, step, tokens_total, data_wait_total, compute_total, run.run_id, st.sent, st.dropped),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
