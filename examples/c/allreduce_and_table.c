/* One worker of a Parallax job, in C99 over parallax_c.h alone: a dense allreduce and a
 * step on a sparse table that lives in the daemons. Start it once per worker under a
 * launcher that sets PARALLAX_SOCKET, PARALLAX_JOB, PARALLAX_LOCAL_RANK and
 * PARALLAX_LOCAL_SIZE, e.g. on 2 nodes x 2 workers:
 *
 *   tools/px-cluster --nodes 2 --workers-per-node 2 -- build/tests/examples/px_example_c
 *
 * Every value is a small integer, so the printed results are exact on any number of
 * workers: each worker checks them and exits 1 if one is wrong. */
#include <parallax_c.h>
#include <stdio.h>
#include <stdlib.h>

enum { kCount = 4, kRows = 10, kDim = 3, kSharedRow = 8 };
static const int64_t kTimeoutMs = 30000;

static void check(px_status s, const char* what) {
  if (s != PX_OK) {
    fprintf(stderr, "%s: %s: %s\n", what, px_status_name(s), px_last_error());
    exit(1);
  }
}

/* Waits for the request and frees it; an operation's own error message if it failed. */
static void finish(px_request* request, const char* what) {
  px_status s = px_wait(request, kTimeoutMs);
  if (s != PX_OK) {
    fprintf(stderr, "%s: %s: %s\n", what, px_status_name(s), px_request_error(request));
    exit(1);
  }
  px_request_free(request);
}

int main(void) {
  px_client* client = NULL;
  check(px_connect(NULL, &client), "px_connect"); /* everything from PARALLAX_* */
  px_world_info world = {.struct_size = sizeof world};
  check(px_world(client, &world), "px_world");
  const int rank = world.rank, workers = world.world_size;
  const float triangle = (float)(workers * (workers + 1) / 2); /* 1 + 2 + ... + workers */
  int wrong = 0;

  /* Dense: worker r contributes (r + 1) * (i + 1); the sum is triangle * (i + 1). */
  px_var* dense = NULL;
  check(px_register_dense(client, "example.dense", PX_F32, kCount, PX_SUM, &dense), "register");
  float in[kCount], out[kCount];
  for (int i = 0; i < kCount; ++i) in[i] = (float)((rank + 1) * (i + 1));
  px_request* request = NULL;
  check(px_allreduce(dense, in, out, &request), "px_allreduce");
  finish(request, "allreduce");
  for (int i = 0; i < kCount; ++i) wrong += out[i] != triangle * (float)(i + 1);

  /* Sparse: a kRows x kDim table, zeros at first, plain SGD with learning rate 1 applied to
   * the sum of the workers' gradients. Worker r pulls rows r and kSharedRow and pushes
   * -(r + 1) to both: row r becomes r + 1, the shared row triangle. */
  px_sparse_options options;
  px_sparse_options_init(&options);
  options.optimizer = PX_OPT_SGD;
  options.learning_rate = 1.0;
  options.initializer = PX_INIT_ZEROS;
  options.aggregation = PX_SUM;
  px_var* table = NULL;
  check(px_register_sparse(client, "example.table", PX_F32, kRows, kDim, &options, &table),
        "px_register_sparse");
  int64_t mine[2] = {rank % kSharedRow, kSharedRow};
  float rows[2][kDim], grads[2][kDim];
  check(px_pull_rows(table, mine, 2, rows, &request), "px_pull_rows"); /* pull step 0 */
  finish(request, "pull");
  for (int k = 0; k < 2; ++k) {
    for (int j = 0; j < kDim; ++j) {
      wrong += rows[k][j] != 0.0f; /* the initializer's zeros */
      grads[k][j] = -(float)(rank + 1);
    }
  }
  check(px_push_rows(table, mine, 2, grads, &request), "px_push_rows"); /* push step 0 */
  finish(request, "push");

  /* Pull step 1 sees every worker's push of step 0. */
  int64_t all[kRows];
  float table_rows[kRows][kDim];
  for (int i = 0; i < kRows; ++i) all[i] = i;
  check(px_pull_rows(table, all, kRows, table_rows, &request), "px_pull_rows");
  finish(request, "pull");
  for (int i = 0; i < kRows; ++i) {
    float expected = i == kSharedRow ? triangle : 0.0f;
    for (int r = 0; r < workers; ++r) expected += r % kSharedRow == i ? (float)(r + 1) : 0.0f;
    for (int j = 0; j < kDim; ++j) wrong += table_rows[i][j] != expected;
  }

  check(px_barrier(client, kTimeoutMs), "px_barrier");
  if (rank == 0) {
    printf("%d workers on %d nodes\nallreduce sum:", workers, world.node_count);
    for (int i = 0; i < kCount; ++i) printf(" %g", out[i]);
    printf("\ntable after one step (column 0 of each row):");
    for (int i = 0; i < kRows; ++i) printf(" %g", table_rows[i][0]);
    printf("\n");
    fflush(stdout);
  }
  check(px_barrier(client, kTimeoutMs), "px_barrier");
  printf("worker %d: %s\n", rank, wrong ? "WRONG" : "OK");
  px_disconnect(client);
  return wrong ? 1 : 0;
}
