"""A worker of tests/test_elastic.py: trains a vector elastically (parallax.elastic), one
step a STEP_SECONDS, and prints one JSON line of results.

    elasticworker.py STEPS PROGRESS_FILE

Each step's gradient is (step + 1) x (rank + 1) in every element, summed over the workers:
the parameters after STEPS steps do not depend on when a reset happened, only on every
step being applied once. PROGRESS_FILE gets the last committed step (for the test to pick
its moment).
"""

import json
import os
import sys
import time

import numpy as np

import parallax.elastic as elastic

STEPS = int(sys.argv[1])
PROGRESS = sys.argv[2]
N = 64
STEP_SECONDS = 0.05

state = elastic.State(params=np.zeros(N), step=0)
seen_worlds = []


@elastic.run(reset_timeout=90.0)
def train(client, state):
    seen_worlds.append(client.world_size)
    grad = client.dense("grad", N, "float64")
    g = np.empty(N)
    while state.step < STEPS:
        g.fill(float((state.step + 1) * (client.rank + 1)))
        grad.allreduce(g).wait()
        state.params -= 0.001 * g
        state.step += 1
        state.commit()
        with open(PROGRESS + ".tmp", "w") as f:
            f.write(str(state.step))
        os.replace(PROGRESS + ".tmp", PROGRESS)
        time.sleep(STEP_SECONDS)
    return client.rank


rank = train(state)
print(json.dumps({"rank": rank, "step": state.step, "params": state.params.tolist(),
                  "resets": state.resets, "worlds": seen_worlds}), flush=True)
