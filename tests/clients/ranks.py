"""How the client scripts start their gloo ranks: forked from the script's process.

A forked rank inherits the torch, megatron-core and torchtitan the script has
imported; a spawned one imports them again. Three ranks start in 0.15 s forked
against 7.7 s spawned (each spawn re-imports torch and megatron-core, ~5 s of
CPU on this 2-core machine), and the client cases start a few hundred ranks.
Safe here: the ranks run on the CPU (no CUDA context to inherit) and every
process group is made in the rank, after the fork.
"""

import importlib
import os
import socket

import torch.multiprocessing as mp

START = "fork"

# What the Megatron-Core clients' ranks import (lazily, in the rank): imported
# once before the fork instead (preload=MEGATRON), ~6 s of CPU per rank saved.
MEGATRON = (
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.optimizer",
    "megatron.core.distributed",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
)


def _preload(modules):
    for m in modules:
        importlib.import_module(m)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(fn, args, nprocs, preload=()):
    """torch.multiprocessing.start_processes(fn, args, nprocs), forked: fn(rank, *args).
    PRELOAD: modules the ranks import, imported here first."""
    _preload(preload)
    return mp.start_processes(fn, args=args, nprocs=nprocs, start_method=START)


def queue():
    """A queue the ranks can put into (errors, results)."""
    return mp.get_context(START).SimpleQueue()


def run(target, world, *args, preload=()):
    """target(rank, world, *args) in WORLD forked processes, MASTER_ADDR/PORT in the
    environment; raises when a rank fails (start's ProcessExitedException)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    start(target, (world,) + args, world, preload)
