#!/usr/bin/env python3
"""A minimal real PyTorch training loop instrumented with trainmeter.

A tiny causal transformer LM trained on random tokens. trainmeter.TimedLoader
times, per step, how long it waited for the DataLoader and how long compute took
(the loop synchronises CUDA so the compute time is honest); the loop reports
tokens per step to the agent and applies the agent's dataloader advice between
epochs with trainmeter.rebuild_dataloader.

    pip install torch
    python3 clients/python/examples/train_torch.py --socket /tmp/tm.sock --steps 200
"""

import argparse
import inspect
import os
import sys

try:
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, Dataset
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
    def __init__(self, n, seq_len, vocab, seed):
        self.n, self.seq_len, self.vocab, self.seed = n, seq_len, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
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
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_bf16 = args.precision == "bf16" and (device.type == "cpu" or torch.cuda.is_bf16_supported())
    model = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq_len).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps_per_epoch = max(1, args.steps // max(1, args.epochs))
    ds = RandomTokens(steps_per_epoch * args.batch_size, args.seq_len, args.vocab, args.seed)
    val = RandomTokens(4 * args.batch_size, args.seq_len, args.vocab, args.seed + 1)

    def loader(num_workers, prefetch_factor):
        kw = dict(batch_size=args.batch_size, shuffle=True, num_workers=num_workers, pin_memory=device.type == "cuda", drop_last=True)
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
        torch_version=torch.__version__,
    ) as run:
        step = 0
        # run.step() takes data_wait_s / compute_s from the attached TimedLoader.
        train_loader = trainmeter.TimedLoader(loader(num_workers, prefetch), run=run)
        for epoch in range(1, args.epochs + 1):
            model.train()
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
                run.step(
                    step=step,
                    tokens=batch.shape[0] * (batch.shape[1] - 1),
                    samples=batch.shape[0],
                    loss=loss.item(),
                )
            model.eval()
            with torch.no_grad():
                vb = torch.stack([val[i] for i in range(len(val))]).to(device)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    vl = model(vb[:, :-1])
                val_loss = nn.functional.cross_entropy(vl.float().reshape(-1, args.vocab), vb[:, 1:].reshape(-1))
                acc = (vl.argmax(-1) == vb[:, 1:]).float().mean()
            run.eval(epoch=epoch, val_loss=val_loss.item(), accuracy=acc.item())
            rebuilt = trainmeter.rebuild_dataloader(train_loader, run.advice())
            if rebuilt is not train_loader:
                train_loader = rebuilt
                print("applied dataloader advice: num_workers=%d prefetch_factor=%s"
                      % (train_loader.num_workers, train_loader.prefetch_factor))
    st = run.stats()  # after run_end was flushed
    print("train_torch: steps=%d sent=%d dropped=%d" % (step, st["sent"], st["dropped"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
