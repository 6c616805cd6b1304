"""torch.load(mmap=True) of each file given, every tensor copied out of its
mapping into one reused buffer; prints the GB/s of the tensor bytes (open,
unpickling and CRC-bound first opens included). Used by bench/passthrough.sh
(FORMAT=megatron) and bench/megatron_open.sh."""
import sys, time, torch
def tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values(): yield from tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x: yield from tensors(v)
buf = torch.empty(0, dtype=torch.uint8)
start = time.perf_counter(); n = 0
for path in sys.argv[1:]:
    sd = torch.load(path, mmap=True, weights_only=False, map_location="cpu")  # maps the file; bytes read on touch
    for t in tensors(sd):
        b = t.contiguous().reshape(-1).view(torch.uint8)
        if b.numel() > buf.numel(): buf = torch.empty(b.numel(), dtype=torch.uint8)
        buf[: b.numel()].copy_(b)
        n += b.numel()
print(f"{n / (time.perf_counter() - start) / 1e9:.3f}")
