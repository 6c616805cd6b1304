#!/usr/bin/env python3
"""Writes tests/data/moe_grid_golden.json: Megatron-Core's own rank groups for a
set of (tp, cp, ep, etp, dp, pp) grids, against which moe_layout_test checks
ParallelConfig::CoordsOf.

The groups come from megatron.core.parallel_state.RankGenerator, built the way
initialize_model_parallel builds its two generators (order "tp-cp-ep-dp-pp"):
the dense one with ep=1 and the expert one with tp=etp, dp=edp, cp=1, where
edp = tp*cp*dp*pp / (etp*ep*pp). No torch.distributed initialisation is needed.

  /work/main/.venv/bin/python tests/moe_grid_golden.py > tests/data/moe_grid_golden.json
"""
import json
import sys

from megatron.core.parallel_state import RankGenerator

# (tp, cp, ep, etp, dp, pp)
GRIDS = [
    (1, 1, 1, 1, 1, 1),
    (2, 1, 1, 2, 3, 2),
    (1, 1, 2, 1, 2, 1),
    (2, 1, 2, 2, 2, 2),
    (2, 1, 4, 1, 2, 1),
    (2, 2, 2, 2, 2, 1),
    (2, 2, 4, 1, 1, 2),
    (4, 1, 2, 1, 2, 2),
    (1, 2, 4, 1, 2, 3),
    (2, 1, 1, 1, 4, 1),
    (1, 1, 8, 1, 8, 2),
    (4, 2, 8, 1, 1, 1),
    (2, 3, 3, 2, 1, 2),
    (1, 4, 2, 2, 1, 1),
]

ORDER = "tp-cp-ep-dp-pp"


def groups(tp, cp, ep, etp, dp, pp):
    world = tp * cp * dp * pp
    assert world % (etp * ep * pp) == 0
    edp = world // (etp * ep * pp)
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=ORDER)
    expert = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=ORDER)
    assert dense.get_ranks("pp") == expert.get_ranks("pp")
    return {
        "tp": tp, "cp": cp, "ep": ep, "etp": etp, "dp": dp, "pp": pp, "edp": edp,
        "groups": {
            "tp": dense.get_ranks("tp"),
            "cp": dense.get_ranks("cp"),
            "dp": dense.get_ranks("dp"),
            "pp": dense.get_ranks("pp"),
            # The distributed optimizer's group for dense parameters.
            "dp-cp": dense.get_ranks("dp-cp"),
            "etp": expert.get_ranks("tp"),
            "ep": expert.get_ranks("ep"),
            # The distributed optimizer's group for expert parameters.
            "edp": expert.get_ranks("dp"),
        },
    }


def main():
    out = {"generator": "tests/moe_grid_golden.py", "order": ORDER,
           "grids": [groups(*g) for g in GRIDS]}
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
