/* Open MPI MPI_Allreduce peer for px-bench allreduce. Prints
 * "RESULT mpi <bytes> <median> <min> <max>" from rank 0 for each size: seconds over the
 * iterations of each iteration's slowest rank (an MPI_MAX reduce after the timed loop).
 * usage: px-mpi-allreduce SIZES(comma-separated bytes) ITERATIONS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int compare(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 3) {
    if (rank == 0) fprintf(stderr, "usage: px-mpi-allreduce SIZES ITERATIONS\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int iterations = atoi(argv[2]);
  if (iterations < 1) iterations = 1;
  double* times = malloc(sizeof(double) * (size_t)iterations);
  double* slowest = malloc(sizeof(double) * (size_t)iterations);
  char* list = strdup(argv[1]);
  for (char* item = strtok(list, ","); item; item = strtok(NULL, ",")) {
    long long bytes = atoll(item);
    int count = (int)(bytes / 4);
    float* buf = malloc((size_t)count * 4 + 4);
    for (int i = 0; i < count; ++i) buf[i] = 1.0f;
    MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
    for (int k = 0; k < iterations; ++k) {
      MPI_Barrier(MPI_COMM_WORLD);
      double start = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times[k] = MPI_Wtime() - start;
    }
    /* Outside the timed loop: each iteration's time is that of its slowest rank. */
    MPI_Reduce(times, slowest, iterations, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      qsort(slowest, (size_t)iterations, sizeof(double), compare);
      printf("RESULT mpi %lld %.9f %.9f %.9f\n", bytes, slowest[iterations / 2], slowest[0],
             slowest[iterations - 1]);
      fflush(stdout);
    }
    free(buf);
  }
  free(list);
  free(times);
  free(slowest);
  MPI_Finalize();
  return 0;
}
