/*
 * px-demo: a local Parallax "cluster" of one node. Starts parallaxd and N worker processes
 * that train, data-parallel, a regression model with a dense part and a sparse embedding:
 * y = x . w + sum(emb[token]). The dense gradient is averaged with px_allreduce and
 * applied by every worker; the embedding lives in the daemons: each worker pulls the rows
 * of its batch's tokens (Zipf-skewed, so hot tokens repeat) and pushes their gradients,
 * which the daemons coalesce and apply. Written in plain C99 against parallax_c.h only.
 *
 * usage: px-demo --daemon PATH [--workers N] [--steps N]
 *        px-demo --worker [--steps N]   (one worker; PARALLAX_* from the environment,
 *                                         as tools/px-cluster sets it)
 */
#define _DEFAULT_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "parallax_c.h"

enum { kFeatures = 512, kBatch = 512, kVocabulary = 10000, kEmbeddingDim = 8 };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A small deterministic generator, so every run prints the same losses. */
static uint64_t next_random(uint64_t* state) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return *state >> 11;
}
static float uniform(uint64_t* state) {
  return (float)(next_random(state) % 2000001) / 1000000.0f - 1.0f;
}

/* The token's true offset in the data, in [-1, 1]. */
static float token_offset(int64_t token) {
  uint64_t state = 7 + (uint64_t)token * 2654435761ull;
  next_random(&state);
  return uniform(&state);
}

static void check(px_status s, const char* what) {
  if (s != PX_OK) {
    fprintf(stderr, "px-demo worker: %s: %s: %s\n", what, px_strerror(s), px_last_error());
    exit(1);
  }
}

/* socket_path NULL: socket, job, rank and size come from the PARALLAX_* environment
 * (as px-cluster sets it). */
static int run_worker(const char* socket_path, int local_rank, int local_size, int steps) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  px_connect_options options;
  px_connect_options_init(&options);
  options.socket_path = socket_path;
  if (socket_path) {
    options.job_name = "demo";
    options.local_rank = local_rank;
    options.local_size = local_size;
  }
  px_client* client = NULL;
  check(px_connect(&options, &client), "px_connect");
  px_world_info world;
  world.struct_size = sizeof world;
  check(px_world(client, &world), "px_world");
  int rank = world.rank, workers = world.world_size;

  px_var *weight_grad = NULL, *loss_sum = NULL, *samples = NULL;
  check(px_register_dense(client, "linear.weight.grad", PX_F32, kFeatures, PX_MEAN, &weight_grad),
        "register");
  check(px_register_dense(client, "loss", PX_F64, 1, PX_SUM, &loss_sum), "register");
  check(px_register_dense(client, "samples_seen", PX_I64, 1, PX_SUM, &samples), "register");
  px_sparse_options emb_options;
  px_sparse_options_init(&emb_options);
  emb_options.learning_rate = 0.5;
  emb_options.aggregation = PX_MEAN;
  px_var* embedding = NULL;
  check(px_register_sparse(client, "token.embedding", PX_F32, kVocabulary, kEmbeddingDim,
                           &emb_options, &embedding),
        "px_register_sparse");
  static int64_t tokens[kBatch];
  static float emb_rows[kBatch][kEmbeddingDim], emb_grads[kBatch][kEmbeddingDim];

  /* Gradients live in the shared arena: the daemon reduces them in place, no copies. */
  float* grad = NULL;
  check(px_alloc(client, sizeof(float) * kFeatures, (void**)&grad), "px_alloc");
  static float x[kBatch][kFeatures], y[kBatch], w_true[kFeatures];
  float w[kFeatures];
  uint64_t truth = 42, data = 1000 + (uint64_t)rank; /* every worker its own data */
  for (int j = 0; j < kFeatures; ++j) w_true[j] = uniform(&truth), w[j] = 0.0f;

  double comm_seconds = 0;
  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < kBatch; ++i) { /* this worker's fresh batch */
      float dot = 0, u = 0.5f + 0.5f * uniform(&data);
      tokens[i] = (int64_t)((float)kVocabulary * u * u * u) % kVocabulary;
      for (int j = 0; j < kFeatures; ++j) x[i][j] = uniform(&data), dot += x[i][j] * w_true[j];
      y[i] = dot + token_offset(tokens[i]) + 0.01f * uniform(&data);
    }
    double t0 = now_s();
    px_request* pull = NULL;
    check(px_pull_rows(embedding, tokens, kBatch, emb_rows, &pull), "px_pull_rows");
    check(px_wait(pull, 30000), "pull");
    px_request_free(pull);
    comm_seconds += now_s() - t0;
    double loss = 0;
    memset(grad, 0, sizeof(float) * kFeatures);
    for (int i = 0; i < kBatch; ++i) {
      float err = -y[i];
      for (int j = 0; j < kFeatures; ++j) err += x[i][j] * w[j];
      for (int k = 0; k < kEmbeddingDim; ++k) err += emb_rows[i][k];
      loss += (double)err * err / (kBatch * workers);
      for (int j = 0; j < kFeatures; ++j) grad[j] += 2.0f * err * x[i][j] / kBatch;
      for (int k = 0; k < kEmbeddingDim; ++k) emb_grads[i][k] = 2.0f * err / kBatch;
    }
    int64_t seen = kBatch;
    t0 = now_s();
    px_request* requests[4];
    check(px_allreduce(weight_grad, grad, grad, &requests[0]), "px_allreduce");
    check(px_allreduce(loss_sum, &loss, &loss, &requests[1]), "px_allreduce");
    check(px_allreduce(samples, &seen, &seen, &requests[2]), "px_allreduce");
    check(px_push_rows(embedding, tokens, kBatch, emb_grads, &requests[3]), "px_push_rows");
    check(px_wait_all(requests, 4, 30000), "px_wait_all");
    for (int k = 0; k < 4; ++k) px_request_free(requests[k]);
    comm_seconds += now_s() - t0;
    for (int j = 0; j < kFeatures; ++j) w[j] -= 0.5f * grad[j];
    if (rank == 0 && (step % 5 == 0 || step == steps - 1))
      printf("step %3d  loss %.6f  samples/step %lld\n", step, loss, (long long)seen);
  }
  double checksum = 0;
  for (int j = 0; j < kFeatures; ++j) checksum += w[j] * (double)(j + 1);
  /* One more pull step sees every push: the hot head of the table. */
  for (int i = 0; i < 100; ++i) tokens[i] = i;
  px_request* pull = NULL;
  check(px_pull_rows(embedding, tokens, 100, emb_rows, &pull), "px_pull_rows");
  check(px_wait(pull, 30000), "pull");
  px_request_free(pull);
  for (int i = 0; i < 100; ++i)
    for (int k = 0; k < kEmbeddingDim; ++k) checksum += emb_rows[i][k] * (double)(i + k + 1);
  px_barrier(client, 30000);
  printf("worker %d (node %d of %d): weight checksum %.9f, communication %.3f ms/step\n", rank,
         world.node_index, world.node_count, checksum, 1e3 * comm_seconds / steps);
  fflush(stdout);
  px_free(client, grad);
  px_disconnect(client);
  return 0;
}

static int can_connect(const char* path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
  int ok = connect(fd, (struct sockaddr*)&addr, sizeof addr) == 0;
  close(fd);
  return ok;
}

int main(int argc, char** argv) {
  const char* daemon_path = NULL;
  int workers = 4, steps = 30, worker_only = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--worker"))
      worker_only = 1;
    else if (!strcmp(argv[i], "--daemon") && i + 1 < argc)
      daemon_path = argv[++i];
    else if (!strcmp(argv[i], "--workers") && i + 1 < argc)
      workers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: px-demo --daemon PATH [--workers N] [--steps N]\n");
      return 2;
    }
  }
  if (worker_only) return run_worker(NULL, -1, 0, steps < 1 ? 30 : steps);
  if (!daemon_path || workers < 1 || workers > 64 || steps < 1) {
    fprintf(stderr, "usage: px-demo --daemon PATH [--workers 1..64] [--steps N]\n");
    return 2;
  }
  char socket_path[108];
  snprintf(socket_path, sizeof socket_path, "/tmp/px-demo-%d.sock", (int)getpid());
  printf("px-demo: parallaxd on %s, %d workers, %d steps of data-parallel SGD\n", socket_path,
         workers, steps);
  fflush(stdout);
  pid_t daemon = fork();
  if (daemon == 0) {
    execl(daemon_path, daemon_path, "--foreground", "--socket", socket_path, "--log-level", "warn",
          (char*)NULL);
    perror("px-demo: exec parallaxd");
    _exit(127);
  }
  double start = now_s();
  while (!can_connect(socket_path)) {
    if (now_s() - start > 10 || waitpid(daemon, NULL, WNOHANG) == daemon) {
      fprintf(stderr, "px-demo: parallaxd did not start\n");
      return 1;
    }
    usleep(10000);
  }
  pid_t pids[64];
  for (int r = 0; r < workers; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(run_worker(socket_path, r, workers, steps));
  }
  int failed = 0;
  for (int r = 0; r < workers; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  kill(daemon, SIGTERM);
  waitpid(daemon, NULL, 0);
  printf("px-demo: %s in %.2f s (every worker printed the same checksum: identical weights)\n",
         failed ? "FAILED" : "done", now_s() - start);
  return failed ? 1 : 0;
}
