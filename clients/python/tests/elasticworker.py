"""A worker of tests/test_elastic.py: trains a vector elastically (parallax.elastic), one
step a STEP_SECONDS, and prints one JSON line of results.

    elasticworker.py STEPS PROGRESS_FILE

Each step's gradient is (step + 1) x (rank + 1) in every element, summed over the workers
(params) and averaged over them (PX_MEAN: mean_params): with the world unchanged the
parameters after STEPS steps do not depend on when a reset happened, only on every step
being applied once; a world that shrinks changes them from the step the job resumed at. PROGRESS_FILE gets the last committed step (for the test to pick
its moment). Each step also pushes the same gradient into row `step % ROWS` of a sparse
table (SGD, lr 1) the daemons hold and checkpoint: after a reset the table comes back
from the newest checkpoint, so the steps since it are lost there. Each run records the
step it starts from and the push steps the table was restored at; the rows are printed at
the end for the test to check against exactly those steps. ELASTIC_TABLE_REPLICAS and
ELASTIC_TABLE_ROUTE: the table's replicas and route (1 and "hybrid" unless set).
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
ROWS = 8
STEP_SECONDS = 0.05

state = elastic.State(params=np.zeros(N), mean_params=np.zeros(N), step=0)
seen_worlds = []
runs = []  # [the step a run starts from, the table's restored push steps]
table_rows = []


@elastic.run(reset_timeout=90.0)
def train(client, state):
    seen_worlds.append(client.world_size)
    grad = client.dense("grad", N, "float64")
    mean = client.dense("mean", N, "float64", op="mean")
    table = client.sparse("table", ROWS, 4, optimizer="sgd", lr=1.0,
                          replicas=int(os.environ.get("ELASTIC_TABLE_REPLICAS", "1")),
                          route=os.environ.get("ELASTIC_TABLE_ROUTE", "hybrid"))
    run = [state.step, None]
    runs.append(run)
    g = np.empty(N)
    m = np.empty(N)
    rows = np.empty((1, 4), dtype=np.float32)
    while state.step < STEPS:
        g.fill(float((state.step + 1) * (client.rank + 1)))
        rows.fill(float((state.step + 1) * (client.rank + 1)))
        table.push(np.array([state.step % ROWS]), rows).wait()
        if run[1] is None:  # known once the table started (a handover from the last run)
            run[1] = table.stats().restored_steps
        m.fill(float((state.step + 1) * (client.rank + 1)))
        grad.allreduce(g).wait()
        mean.allreduce(m).wait()
        state.params -= 0.001 * g
        state.mean_params -= 0.001 * m
        state.step += 1
        state.commit()
        with open(PROGRESS + ".tmp", "w") as f:
            f.write(str(state.step))
        os.replace(PROGRESS + ".tmp", PROGRESS)
        time.sleep(STEP_SECONDS)
    table_rows.extend(table.read(np.arange(ROWS)).wait().tolist())
    return client.rank


rank = train(state)
print(json.dumps({"rank": rank, "step": state.step, "params": state.params.tolist(),
                  "mean_params": state.mean_params.tolist(),
                  "resets": state.resets, "worlds": seen_worlds, "runs": runs,
                  "table": table_rows}), flush=True)
