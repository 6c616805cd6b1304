"""bench/dcp_load.py: torch.distributed.checkpoint.load from a ptcfs mount's dcp/
against the same state from a DCP directory on local disk that dcp.save wrote.

  dcp_load.py save MOUNT_DCP LOCAL_DIR
      loads the whole state from the mount (one process) and dcp.save's it into
      LOCAL_DIR: the baseline, written by torch itself.
  dcp_load.py time DIR PROCS
      PROCS gloo processes load the state from DIR; 1 process into plain
      tensors, more into DTensors sharded on dim 0 (each rank its share).
      Prints "SECONDS BYTES" (wall time of the load, from a barrier before it
      to one after it; the bytes the processes asked for).
"""

import os
import pickle
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def template(dcp_dir):
    """The nested state dict of empty tensors shaped as .metadata says (planner_data's paths)."""
    with open(os.path.join(dcp_dir, ".metadata"), "rb") as f:
        meta = pickle.load(f)
    sd = {}
    for key, m in meta.state_dict_metadata.items():
        if not hasattr(m, "properties"):  # a pickled object (the param groups' settings): not timed
            continue
        t = torch.empty(tuple(m.size), dtype=m.properties.dtype)
        path = meta.planner_data[key]
        node = sd
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = t
    return sd


def map_tensors(sd, fn):
    return {k: map_tensors(v, fn) if isinstance(v, dict) else fn(v) for k, v in sd.items()}


def nbytes(sd):
    return sum(nbytes(v) if isinstance(v, dict) else
               (v.to_local() if hasattr(v, "to_local") else v).numel() * v.element_size() for v in sd.values())


def worker(rank, world, port, dcp_dir, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sd = template(dcp_dir)
    if world > 1:
        mesh = init_device_mesh("cpu", (world,))
        sd = map_tensors(sd, lambda t: distribute_tensor(t, mesh, [Shard(0)]) if t.dim() > 0 else t)
    total = torch.tensor([nbytes(sd)], dtype=torch.int64)
    dist.barrier()
    start = time.perf_counter()
    dcp.load(sd, checkpoint_id=dcp_dir)
    dist.barrier()
    seconds = time.perf_counter() - start
    dist.all_reduce(total)
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{seconds:.4f} {int(total.item())}\n")
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    cmd = sys.argv[1]
    if cmd == "save":
        src, dst = sys.argv[2], sys.argv[3]
        sd = template(src)
        dcp.load(sd, checkpoint_id=src, no_dist=True)
        dcp.save(sd, checkpoint_id=dst, no_dist=True)
        return 0
    dcp_dir, procs = sys.argv[2], int(sys.argv[3])
    out = f"/tmp/dcp_load_{os.getpid()}.txt"
    mp.start_processes(worker, args=(procs, free_port(), dcp_dir, out), nprocs=procs, start_method="spawn")
    with open(out) as f:
        print(f.read().strip())
    os.remove(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
