/*
 * parallax_c.h - the stable C ABI of libparallax, the client library of parallaxd.
 *
 * Conventions (after LevelDB's c.h and NCCL's nccl.h):
 *  - every object is an opaque handle, freed by exactly one function;
 *  - every call returns a px_status. A failed operation's message, naming what failed (node,
 *    worker, variable, step), belongs to its request (px_request_error); a failed call's
 *    message is also kept per client (px_client_last_error) and per thread (px_last_error);
 *  - handles are never reused: a handle used after it was freed (or after its client was
 *    disconnected) fails cleanly with PX_ERR_NOT_FOUND, in any thread, in any order;
 *  - option structs start with struct_size so they can grow without breaking callers:
 *    fill them with the matching *_init function, then override fields;
 *  - enums are 32-bit ints (each has a 0x7fffffff member to pin its size); sizes and counts
 *    are 64-bit; no varargs, no callbacks, no structs passed by value.
 *
 * Thread safety: every function may be called from any thread. A request may be waited on,
 * tested, cancelled and freed from different threads; a wait in progress when its request
 * is freed (or its client disconnected) returns PX_ERR_CANCELLED. The client never holds its
 * lock across a blocking call: a px_checkpoint on one thread does not delay px_wait on
 * another.
 *
 * Bindings wrap this header and nothing else: Python (clients/python/parallax/_lib.py,
 * ctypes), Rust (clients/rust/src/sys.rs) and Julia (clients/julia/Parallax). A change here
 * changes them in the same commit; clients/check_bindings.py (the ctest tests named
 * clients/LANGUAGE-bindings-match-header) compares every function, struct and enum value
 * with their declarations.
 */
#ifndef PARALLAX_C_H
#define PARALLAX_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PX_API __attribute__((visibility("default")))
#else
#define PX_API
#endif

/* ABI version: major changes break binary compatibility (it is in the SONAME); minor
 * changes only add. A client is accepted by a daemon of the same major and an equal or
 * higher minor. */
#define PX_ABI_VERSION_MAJOR 1
/* 1.1: sparse variables; 1.2: partition search stats; 1.3: request errors, cancel, abort,
 * completion fd, per-operation options, broadcast and allgather(v), fixed-width enums,
 * connect without waiting; 1.4: px_var_stats.restored_steps; 1.5: PX_ROUTE_ALLTOALL,
 * px_sparse_options.alltoall_split and wire_dtype; 1.6: px_sparse_options.prefetch,
 * px_prefetch_rows; 1.7: PX_ROUTE_AUTO; 1.8: px_alloc_ex (device memory); 1.9: PX_PROD,
 * px_reduce_scatter, px_alltoall, px_alltoallv; 1.10: launchers' variables (torchrun, Open
 * MPI, Slurm) read by px_connect, px_launch_info_from_env; 1.11: px_set_sparse_lr; 1.12:
 * table groups (px_register_sparse_group, px_pull_rows_group, px_prefetch_rows_group,
 * px_push_rows_group); 1.13: px_dense_options, px_register_dense_ex (a 16-bit wire for
 * dense allreduce); 1.14: px_sparse_options.cache_rows and cache_staleness (a hot-row cache
 * for PX_BOUNDED tables), px_var_stats' cache counters; 1.15: PX_ERR_MEMBERSHIP,
 * px_connect_options_init_abi (px_connect_options_init is a macro over it); 1.16:
 * px_sparse_options.replicas (a copy of each node's partitions on the next node) */
#define PX_ABI_VERSION_MINOR 16
/* The header's ABI version as one number: (major << 16) | minor (px_abi_version: the
 * library's). */
#define PX_ABI_VERSION ((uint32_t)((PX_ABI_VERSION_MAJOR << 16) | PX_ABI_VERSION_MINOR))

/* What every call returns: PX_OK, or why it failed (px_status_name, px_strerror). */
typedef enum px_status {
  PX_OK = 0,
  PX_ERR_INVALID = 1,          /* a bad argument: null pointer, wrong size, overlapping buffers */
  PX_ERR_VERSION = 2,          /* client and daemon ABI versions are incompatible */
  PX_ERR_CONNECT = 3,          /* the daemon could not be reached or refused the connection */
  PX_ERR_TIMEOUT = 4,          /* a deadline passed; the request stays valid and can be freed */
  PX_ERR_PEER_LOST = 5,        /* another worker (or node) of the job died or disconnected */
  PX_ERR_MISMATCH = 6,         /* the same variable was registered with another shape/type/op */
  PX_ERR_NOT_FOUND = 7,        /* unknown variable or handle */
  PX_ERR_NO_MEMORY = 8,        /* the shared-memory arena (or the daemon) is out of memory */
  PX_ERR_BUSY = 9,             /* too many requests outstanding on this client; wait some first */
  PX_ERR_PROTOCOL = 10,        /* malformed message between client and daemon */
  PX_ERR_INDEX = 11,           /* a row index out of range (sparse variables) */
  PX_ERR_NOT_IMPLEMENTED = 12, /* listed in the docs' limits (docs/limits.md) */
  PX_ERR_INTERNAL = 13,        /* a bug: please report it with the daemon's log */
  PX_ERR_PERMISSION = 14,      /* the daemon refused this process's credentials */
  PX_ERR_CANCELLED = 15,       /* (1.3) px_request_cancel, or freed/disconnected during a wait */
  /* (1.15) membership on etcd: nodes joined the cluster, which re-formed under a new epoch,
   * so this run of the job ended on every node (nothing was lost). Connect again as a new
   * run of the job and re-read px_world. A node lost is PX_ERR_PEER_LOST, as in a static
   * cluster. A client older than 1.15 is told PX_ERR_PEER_LOST instead. */
  PX_ERR_MEMBERSHIP = 16,
  PX_STATUS_FORCE_32BIT = 0x7fffffff
} px_status;

/* Element types of variables. */
typedef enum px_dtype {
  PX_F32 = 0,
  PX_F64 = 1,
  PX_F16 = 2,  /* IEEE binary16; reduced in f32, rounded to nearest even once */
  PX_BF16 = 3, /* bfloat16; reduced in f32, rounded to nearest even once */
  PX_I32 = 4,
  PX_I64 = 5,
  PX_DTYPE_FORCE_32BIT = 0x7fffffff
} px_dtype;

/* How a dense variable's workers' buffers are combined. */
typedef enum px_reduce_op {
  PX_SUM = 0,
  PX_MEAN = 1, /* sum divided by the number of workers; integers truncate toward zero */
  PX_MIN = 2,  /* NaN in any input gives NaN */
  PX_MAX = 3,  /* NaN in any input gives NaN */
  PX_PROD = 4, /* (1.9) the product; integers wrap, f16/bf16 multiply in f32 */
  PX_REDUCE_OP_FORCE_32BIT = 0x7fffffff
} px_reduce_op;

/* Where an operation's buffers live (px_op_options.memory_kind). */
typedef enum px_memory_kind {
  PX_MEMORY_HOST = 0, /* ordinary or px_alloc'd host memory */
  PX_MEMORY_CUDA = 1, /* CUDA device memory: px_alloc_ex allocates it (1.8); the operations
                         that take it are in px_op_options (docs/gpu.md) */
  PX_MEMORY_KIND_FORCE_32BIT = 0x7fffffff
} px_memory_kind;

/* Arena sizes a daemon accepts (px_connect_options.arena_bytes); the daemon's
 * --max-arena-bytes may lower the maximum. */
#define PX_ARENA_MIN_BYTES ((uint64_t)1 << 20)  /* the smallest arena */
#define PX_ARENA_MAX_BYTES ((uint64_t)16 << 30) /* the largest arena (see above) */

typedef struct px_client px_client;   /* a connection to the node's parallaxd */
typedef struct px_var px_var;         /* a registered variable; owned by its client */
typedef struct px_request px_request; /* one submitted operation; free with px_request_free */

/* How px_connect connects. Fill with px_connect_options_init, then override fields. */
typedef struct px_connect_options {
  uint32_t struct_size; /* sizeof(px_connect_options) */
  uint32_t abi_version; /* PX_ABI_VERSION of the caller's header */
  /* Fields left unset (NULL, -1, 0) come from the environment: PARALLAX_SOCKET /
   * PARALLAX_JOB / PARALLAX_LOCAL_RANK / PARALLAX_LOCAL_SIZE, else (1.10) what the
   * launcher that started the process set (torchrun, Open MPI's mpirun, Slurm's srun: see
   * px_launch_info), else the defaults below. */
  const char* socket_path; /* NULL: the environment, else /run/parallax/parallaxd.sock */
  const char* job_name;    /* NULL: the environment, else "default" */
  int32_t local_rank;      /* -1: the environment, else the first free rank */
  int32_t local_size;      /* 0: the environment, else 1 */
  int64_t timeout_ms;      /* deadline for connect (it waits for all local workers) and for
                              control calls; 0: 30000 */
  uint64_t arena_bytes;    /* shared-memory arena size; 0: $PARALLAX_ARENA_BYTES, else 256 MiB;
                              in [PX_ARENA_MIN_BYTES, PX_ARENA_MAX_BYTES] */
  /* 1.3: 1 waits (up to timeout_ms) for a daemon whose socket does not exist yet, as when
   * workers start with their daemon; 0 fails at once with PX_ERR_CONNECT; -1 (the value
   * px_connect_options_init sets): $PARALLAX_WAIT_FOR_DAEMON (0 or 1) if set, else 0. A
   * variable set to anything else (or $PARALLAX_ARENA_BYTES to anything but a number in
   * that range) fails px_connect with PX_ERR_INVALID naming it. */
  int32_t wait_for_daemon;
  uint32_t reserved; /* zero */
} px_connect_options;

/* Options of one operation (1.3), taken by the _ex variants; NULL means the defaults. Fill
 * with px_op_options_init, then override fields. */
typedef struct px_op_options {
  uint32_t struct_size; /* sizeof(px_op_options) */
  int32_t memory_kind;  /* px_memory_kind of every buffer of the operation; default host */
  int32_t device;       /* CUDA device ordinal with PX_MEMORY_CUDA; -1 (default) otherwise */
  int32_t priority;     /* 0..255, larger first where transfers queue; default 0. A step's
                           sends to each other node wait in a window of bytes per link and
                           leave highest priority first (equal ones in order), so a small
                           urgent operation overtakes a large one's queued chunks. Steps of
                           one variable stay in order whatever their priority. Results never
                           depend on it (docs/c-api.md, "Priorities") */
  void* stream;         /* cudaStream_t the operation is ordered on (PX_MEMORY_CUDA); NULL:
                           the legacy default stream */
  int32_t root;         /* for collectives with a root (broadcast): its global rank; 0 */
  uint32_t reserved;    /* zero */
} px_op_options;

/* Where px_alloc_ex allocates (1.8). Fill with px_alloc_options_init. */
typedef struct px_alloc_options {
  uint32_t struct_size; /* sizeof(px_alloc_options) */
  int32_t memory_kind;  /* PX_MEMORY_HOST (default): px_alloc's shared arena;
                           PX_MEMORY_CUDA: device memory the daemon maps once (CUDA IPC) */
  int32_t device;       /* PX_MEMORY_CUDA: the device ordinal as this process numbers it;
                           -1 (default): the calling thread's current device */
  uint32_t reserved;    /* zero */
} px_alloc_options;

/* (1.10) What px_connect takes from the environment for the px_connect_options fields a
 * caller leaves unset (px_launch_info_from_env): PARALLAX_SOCKET, PARALLAX_JOB,
 * PARALLAX_LOCAL_RANK and PARALLAX_LOCAL_SIZE, each over what the launcher that started the
 * process set: torchrun, Open MPI's mpirun or Slurm's srun, the first found. Each one's
 * variables and job name: docs/launchers.md. px_connect writes a warning to stderr when the
 * launcher's global rank differs from the rank the daemons gave the worker. */
typedef struct px_launch_info {
  uint32_t struct_size; /* sizeof(px_launch_info), set by the caller */
  int32_t local_rank;   /* -1: not set */
  int32_t local_size;   /* 0: not set */
  int32_t rank;         /* the launcher's global rank; -1: none */
  /* The strings are the library's, valid until the calling thread's next
   * px_launch_info_from_env; never NULL. */
  const char* launcher;    /* "torchrun", "openmpi", "slurm", or "" (none found) */
  const char* job_name;    /* "": not set */
  const char* socket_path; /* "": not set */
} px_launch_info;

/* Where this worker sits in its job (px_world). */
typedef struct px_world_info {
  uint32_t struct_size; /* sizeof(px_world_info), set by the caller */
  int32_t node_index;   /* this daemon's node, 0 .. node_count - 1 */
  int32_t node_count;   /* nodes in the cluster */
  int32_t rank;         /* global rank, node-major */
  int32_t world_size;   /* workers in the job across all nodes */
  int32_t local_rank;   /* rank among the job's workers on this node */
  int32_t local_size;   /* the job's workers on this node */
} px_world_info;

/* The daemon's counters for one variable on this node (px_var_stats_get). */
typedef struct px_var_stats {
  uint32_t struct_size; /* sizeof(px_var_stats), set by the caller */
  uint32_t reserved;    /* zero */
  uint64_t ops;         /* completed operations on this node (all workers' steps counted once) */
  uint64_t bytes;       /* bytes reduced on this node (input bytes of all local workers) */
  uint64_t wait_ns;     /* total time from first to last local submission of each step */
  uint64_t reduce_ns;   /* total time spent reducing and fanning out */
  /* Sparse variables (ABI 1.1; zero for dense ones). Per pull step a worker's density is
   * alpha = rows_pulled / (pull_steps * local workers * rows). */
  uint64_t pull_steps;
  uint64_t push_steps;     /* push steps this node completed */
  uint64_t rows_pulled;    /* rows the local workers pulled, duplicates included */
  uint64_t rows_unique;    /* rows this node asked for: the union of its workers' rows */
  uint64_t rows_applied;   /* rows this node's shards updated; summed over the nodes this is
                              the per-step union across nodes (ps; each replica counts all) */
  uint64_t bytes_sent;     /* payload bytes this node sent to other nodes for the variable */
  uint64_t bytes_received; /* payload bytes it received from them */
  /* ps/hybrid sparse variables (ABI 1.2): the requests this node's pull or push step makes
   * (P in t(P); it changes while the automatic partition search times its candidates), and
   * the push steps until that search has chosen (0: chosen, or the count was given). */
  uint64_t request_partitions;
  uint64_t search_steps_left; /* push steps until the partition search has chosen */
  /* Sparse variables (ABI 1.4): the push steps of the checkpoint this node's daemon restored
   * the table from when the job registered it (a checkpoint's count includes the steps of
   * the run it was restored from); 0 if it was not restored. A trainer resumes at that
   * push step. With membership on etcd, a table handed over from the job's last run
   * (docs/elastic.md) counts the push steps it holds from there, known once the table has
   * started: after its first pull, push or read completes. */
  uint64_t restored_steps;
  /* Sparse variables with prefetch (ABI 1.6): rows this node's shards served to other
   * nodes' pulls ahead of the previous push step (no node had pulled them in that step). */
  uint64_t rows_served_ahead;
  /* Sparse variables with a hot-row cache (ABI 1.14; px_sparse_options.cache_rows); rows
   * are counted once per step, like rows_unique. */
  uint64_t cache_hits;         /* rows of this node's pull steps served from its cache */
  uint64_t cache_misses;       /* rows it asked owners for while the cache looked */
  uint64_t cache_rows;         /* rows cached now */
  uint64_t cache_bytes_saved;  /* payload bytes kept off the wire: rows not pulled plus
                                  gradient rows not pushed, less the held sums sent later */
  uint64_t cache_rows_flushed; /* held gradient rows sent (in a push or a flush) */
} px_var_stats;

/* --- sparse variables (ABI 1.1) ----------------------------------------------------
 * A sparse variable is a table of `rows` x `dim` values held by the daemons, partitioned
 * across the nodes; workers pull the rows their batch needs and push those rows' gradients.
 *
 * Steps: pulls and pushes are numbered separately per worker and variable. The n-th
 * px_pull_rows is pull step n and the n-th px_push_rows is push step n (both from 0); every
 * local worker of the job must issue each step (n = 0 rows is fine). Pull step n sees:
 *   PX_SYNC        every update of push steps 0..n-1 of every worker (a pull waits for
 *                  them), and none of a push step the pulling worker has not issued yet;
 *   PX_BOUNDED     at least the updates of push steps 0..n-1-staleness from every worker;
 *   PX_ASYNC       whatever has been applied when the request reaches each shard.
 * The usual loop pull(n) -> forward/backward -> push(n) is therefore exact in PX_SYNC mode.
 * px_load_rows and px_read_rows are not steps: they act on each shard when they reach it
 * (load: before/after training, or behind a px_barrier). */
/* The optimizer the owning shards apply to pushed gradients. */
typedef enum px_optimizer {
  PX_OPT_SGD = 0,     /* w -= lr * g */
  PX_OPT_ADAGRAD = 1, /* a += g*g; w -= lr * g / (sqrt(a) + epsilon) */
  PX_OPT_ADAM = 2,    /* lazy Adam: moments of touched rows only; bias correction uses the
                         number of applied push steps of the variable, as TF's LazyAdam */
  PX_OPTIMIZER_FORCE_32BIT = 0x7fffffff
} px_optimizer;

/* A sparse table's initial values. */
typedef enum px_initializer {
  PX_INIT_ZEROS = 0,
  PX_INIT_UNIFORM = 1, /* uniform in [init_low, init_high) from init_seed */
  PX_INIT_NORMAL = 2,  /* normal(0, init_std) from init_seed */
  PX_INITIALIZER_FORCE_32BIT = 0x7fffffff
} px_initializer; /* values depend only on (seed, row, column), not on the partitioning */

/* What a pull step sees of earlier push steps (see "Steps" above). */
typedef enum px_consistency {
  PX_SYNC = 0,    /* every update of the earlier push steps */
  PX_ASYNC = 1,   /* whatever has been applied when the request reaches each shard */
  PX_BOUNDED = 2, /* at most px_sparse_options.staleness push steps behind */
  PX_CONSISTENCY_FORCE_32BIT = 0x7fffffff
} px_consistency;

/* How a sparse variable's rows and gradients move between nodes. */
typedef enum px_route {
  PX_ROUTE_HYBRID = 0,     /* the default: PX_ROUTE_AUTO for PX_SYNC sparse tables (since
                              1.7's daemons), PX_ROUTE_PS for PX_ASYNC and PX_BOUNDED ones */
  PX_ROUTE_PS = 1,         /* sharded parameter server */
  PX_ROUTE_ALLGATHERV = 2, /* a replica per node, coalesced gradients all-gathered */
  PX_ROUTE_ALLREDUCE = 3,  /* densified gradients allreduced (the sparse_as_dense baseline) */
  PX_ROUTE_ALLTOALL = 4,   /* (1.5) a per-step exchange with every node: each holds a slice of
                              the table, by rows or columns (px_sparse_options.alltoall_split) */
  PX_ROUTE_AUTO = 5,       /* (1.7) starts on ps; on a cluster the daemons measure the pulls and
                              move the table, between steps, to the route that moves the fewest
                              bytes (ps, alltoall by rows or columns, allgatherv, allreduce) */
  PX_ROUTE_FORCE_32BIT = 0x7fffffff
} px_route;

/* (1.5) How PX_ROUTE_ALLTOALL divides a table between the nodes. */
typedef enum px_split {
  PX_SPLIT_ROWS = 0,    /* node i holds the rows r with r % nodes == i */
  PX_SPLIT_COLUMNS = 1, /* node i holds every row's i-th slice of columns (dim / nodes of them,
                           one more on the first dim % nodes nodes): hot rows load every node
                           alike */
  PX_SPLIT_FORCE_32BIT = 0x7fffffff
} px_split;

/* What a push does with NaN/Inf gradients. */
typedef enum px_nonfinite {
  PX_NONFINITE_REJECT = 0, /* a push with a NaN/Inf gradient fails with PX_ERR_INVALID */
  PX_NONFINITE_SKIP = 1,   /* rows with a NaN/Inf gradient are dropped from the push */
  PX_NONFINITE_FORCE_32BIT = 0x7fffffff
} px_nonfinite;

/* A dense variable's options (1.13). Fill with px_dense_options_init, then override fields. */
typedef struct px_dense_options {
  uint32_t struct_size; /* sizeof(px_dense_options) */
  /* px_dtype an f32 variable's allreduce carries its sums in between nodes: PX_F32 (default),
   * PX_BF16 or PX_F16 (Horovod's fp16 compression, DDP's bf16_compress_hook). Half the bytes
   * on the links; lossy: every partial sum a node sends on is rounded to the wire type (to
   * nearest even; f16 saturates at +-65504) and nodes add in f32, so the result is a wire
   * value widened to f32, bitwise the same on every worker. Within one node nothing is
   * rounded. Allreduce only (the variable's other collectives stay f32); every node of the
   * job must name the same (PX_ERR_MISMATCH). Exact rule: docs/c-api.md, "A 16-bit wire". */
  int32_t wire_dtype;
} px_dense_options;

/* A sparse variable's options. Fill with px_sparse_options_init, then override fields. */
typedef struct px_sparse_options {
  uint32_t struct_size;       /* sizeof(px_sparse_options) */
  int32_t optimizer;          /* px_optimizer; default PX_OPT_SGD */
  double learning_rate;       /* default 0.01; finite and >= 0 */
  double beta1;               /* Adam; default 0.9 */
  double beta2;               /* Adam; default 0.999 */
  double epsilon;             /* Adagrad and Adam; default 1e-8 */
  double initial_accumulator; /* Adagrad; default 0.1 */
  int32_t initializer;        /* px_initializer; default PX_INIT_ZEROS */
  uint32_t reserved0;         /* zero */
  uint64_t init_seed;         /* the initializer's seed; default 0 */
  /* PX_INIT_UNIFORM: where the range [init_low, init_high) starts; default -0.05 */
  double init_low, init_high; /* PX_INIT_UNIFORM: where it ends; default 0.05 */
  double init_std;            /* PX_INIT_NORMAL; default 0.05 */
  int32_t aggregation;        /* PX_SUM (default) or PX_MEAN (divides by the world size) */
  int32_t consistency;        /* px_consistency; default PX_SYNC */
  uint32_t staleness;         /* PX_BOUNDED: how many push steps a pull may run ahead */
  uint32_t partitions;        /* 0: automatic (chosen from timed push steps, see stats) */
  int32_t route;              /* px_route; default PX_ROUTE_HYBRID */
  int32_t nonfinite;          /* px_nonfinite; default PX_NONFINITE_REJECT */
  int32_t alltoall_split;     /* (1.5) PX_SPLIT_ROWS (0, default) or PX_SPLIT_COLUMNS (1): how
                                 PX_ROUTE_ALLTOALL divides the table */
  /* (1.5) px_dtype of pulled rows and pushed gradients between nodes: PX_F32 (default),
   * PX_BF16 or PX_F16 (ps, hybrid and alltoall routes). Lossy: a pull's rows and a node's summed
   * push gradients are rounded once (to nearest even; f16 saturates at +-65504), on every node
   * alike, and the shards keep f32. Loads and reads stay f32. Half the bytes of the rows. */
  int32_t wire_dtype;
  /* (1.6) 1: the next pull step may be issued before this push step, and its rows that no
   * node pulled in this step are served at once, without waiting for this step's push
   * (EmbRace's relaxed dependency; see px_prefetch_rows). The promise it rests on: a
   * worker's push step n has only rows its own pull step n had (the usual loop pushes
   * exactly the pulled rows); a push with another row fails with PX_ERR_INVALID naming it.
   * ps, hybrid and alltoall routes; PX_SYNC stays exact. Default 0. */
  uint32_t prefetch;
  uint32_t reserved1; /* never read (older callers' padding) */
  /* (1.14) A hot-row cache on every node, PX_BOUNDED tables of the ps or hybrid route only:
   * up to cache_rows rows owned by other nodes are kept with the pull step that fetched
   * them. A pull step n serves a kept copy fetched by pull step c >= n - cache_staleness
   * instead of asking its owner; a row asked for in two pull steps at most cache_staleness
   * apart is kept (least recently pulled out first). This node's gradients of a kept row
   * are summed here and sent with the push step before the copy would be refreshed (so at
   * most cache_staleness steps late), with an eviction, or when a read or checkpoint needs
   * them: each gradient is applied once. What a pull may then see: docs/sparse.md, "The
   * hot-row cache". 0 rows: no cache (default); cache_staleness >= 1 with a cache. */
  uint32_t cache_rows;
  uint32_t cache_staleness; /* (1.14) pull steps a kept copy serves; >= 1 with a cache */
  /* (1.16) Copies of each row kept: 1 (default) or 2. With 2, each node keeps a copy of the
   * partitions of the node before it in the cluster's epoch, updated after every push step,
   * so that when a node is lost the job's next run is handed its partitions from the copy
   * instead of going back to the periodic checkpoint (docs/elastic.md, "Sparse tables
   * across a reset"). Needs membership on etcd (parallaxd --membership) and PX_SYNC, on the
   * ps, hybrid, auto or alltoall (rows) route, without a hot-row cache. Each push step then
   * also sends the rows it changed, values and optimizer state, to the next node. */
  uint32_t replicas;
  uint32_t reserved2; /* zero */
} px_sparse_options;

/* --- versions and errors ----------------------------------------------------------- */
/* The library's ABI version, as PX_ABI_VERSION. */
PX_API uint32_t px_abi_version(void);
/* A phrase for the status ("deadline exceeded"); never NULL. */
PX_API const char* px_strerror(px_status status);
/* The enum's name ("PX_ERR_TIMEOUT"); "PX_STATUS_UNKNOWN" for other values. (1.3) */
PX_API const char* px_status_name(px_status status);
/* The message of the calling thread's last failed call; "" if none. Every px_ call that
 * returns a px_status sets it: a failure to its message, a success to "". So read it right
 * after the failed call (px_request_error keeps an operation's message as long as its
 * request lives, and does not depend on the thread). Valid until the next px_ call on this
 * thread. */
PX_API const char* px_last_error(void);

/* --- connection ------------------------------------------------------------------- */
/* (1.15) Fills options with the defaults (every field from the environment, see
 * px_connect_options) and abi_version with caller_abi, the PX_ABI_VERSION of the caller's
 * header (bindings pass their own). The daemon tells a caller only the statuses its ABI
 * version has (an older one gets PX_ERR_PEER_LOST for PX_ERR_MEMBERSHIP). */
PX_API void px_connect_options_init_abi(px_connect_options* options, uint32_t caller_abi);
/* Fills options with the defaults, for this header's ABI version: a macro over
 * px_connect_options_init_abi, as zlib's deflateInit is, because the library cannot know
 * which header its caller was built with. (libparallax still exports a function of this
 * name, which callers built before 1.15 call: it takes them for ABI 1.14 callers.) */
#define px_connect_options_init(options) px_connect_options_init_abi((options), PX_ABI_VERSION)
/* (1.10) Reads the environment as px_connect would (px_launch_info). PX_ERR_INVALID, naming
 * the variable, for a value that is not a count, a Slurm tasks-per-node list without this
 * node, or a torchrun run id of "none" without MASTER_ADDR and MASTER_PORT. */
PX_API px_status px_launch_info_from_env(px_launch_info* out_info);
/* Connects to parallaxd and waits until all local_size workers of the job have connected.
 * options may be NULL (all defaults, as a caller of ABI 1.14: pass options filled by
 * px_connect_options_init to be told statuses added since, PX_ERR_MEMBERSHIP). */
PX_API px_status px_connect(const px_connect_options* options, px_client** out_client);
/* Frees the client, its variables, requests and arena memory. Outstanding operations of
 * this worker fail with PX_ERR_PEER_LOST on the other workers. NULL is allowed. */
PX_API px_status px_disconnect(px_client* client);
/* This worker's place in its job: node, ranks and sizes. */
PX_API px_status px_world(px_client* client, px_world_info* out_info);
/* (1.3) Copies the message of the last failed call made with this client (from any thread;
 * a failed px_wait/px_test of one of its requests counts) into buffer, NUL-terminated and
 * cut to size - 1 bytes; *out_length (may be NULL) gets its whole length, so a caller can
 * retry with a larger buffer. "" if no call failed. buffer may be NULL when size is 0. */
PX_API px_status px_client_last_error(px_client* client, char* buffer, uint64_t size,
                                      uint64_t* out_length);
/* (1.3) Fails the job on every node at once: every outstanding and later operation of every
 * worker of the job, on every node, fails with PX_ERR_PEER_LOST and a message naming this
 * worker and reason (unlike px_disconnect, which other nodes only see at their deadlines).
 * The client stays valid for px_request_error, px_request_free and px_disconnect. */
PX_API px_status px_abort(px_client* client, const char* reason);
/* (1.3) A file descriptor that becomes readable when a request of this client may have
 * completed, or the daemon's connection broke: for event loops (asyncio add_reader, libuv
 * uv_poll, Julia's FDWatcher) to wait without a thread of their own. When it is readable,
 * call px_progress, then px_test the requests of interest. Owned by the client (do not
 * close it); level-triggered. */
PX_API px_status px_client_fd(px_client* client, int* out_fd);
/* (1.3) Takes the completions the daemon has posted, without blocking, and clears the
 * readiness of px_client_fd. Returns PX_ERR_PEER_LOST once the daemon is gone. */
PX_API px_status px_progress(px_client* client);

/* --- variables -------------------------------------------------------------------- */
/* Registers a dense variable of count elements. Every worker of the job must register the
 * same name with the same dtype, count and op: otherwise every registrant gets
 * PX_ERR_MISMATCH (now, or from its next operation on the variable). */
PX_API px_status px_register_dense(px_client* client, const char* name, px_dtype dtype,
                                   uint64_t count, px_reduce_op op, px_var** out_var);
/* (1.13) Fills options with the defaults (and struct_size). */
PX_API void px_dense_options_init(px_dense_options* options);
/* (1.13) px_register_dense with options (NULL: the defaults, as px_register_dense); the
 * options are part of what every worker and node must register alike. */
PX_API px_status px_register_dense_ex(px_client* client, const char* name, px_dtype dtype,
                                      uint64_t count, px_reduce_op op,
                                      const px_dense_options* options, px_var** out_var);
/* Counters the daemon keeps for this variable on this node. */
PX_API px_status px_var_stats_get(px_var* var, px_var_stats* out_stats);

/* Fills options with the defaults (each is named in px_sparse_options). */
PX_API void px_sparse_options_init(px_sparse_options* options);
/* Registers a sparse variable of rows x dim values of dtype (PX_F32 today). Every worker of
 * the job must register it with the same dtype, shape and options, otherwise
 * PX_ERR_MISMATCH. options may be NULL (defaults, see px_sparse_options_init). */
PX_API px_status px_register_sparse(px_client* client, const char* name, px_dtype dtype,
                                    uint64_t rows, uint64_t dim, const px_sparse_options* options,
                                    px_var** out_var);
/* (1.11) Sets the learning rate the sparse variable's optimizer applies from this worker's
 * next push step on (a schedule: warm-up, decay). Every worker of the job must set the same
 * rate before the same push step: a local worker that pushes that step without having set
 * it fails the step for every local worker (PX_ERR_INVALID, naming both workers); another
 * rate for a step another local worker set, or a step it already pushed at the old rate,
 * is refused here (PX_ERR_MISMATCH).
 * Each node's shards apply the rate its own workers set, at that push step, so a PX_SYNC
 * table changes at the same step on every node; nodes are not compared with each other.
 * Under PX_ASYNC and PX_BOUNDED a push another node sends ahead of this node's workers is
 * applied with the rate this node's workers have set so far. Checkpoints do not keep it:
 * set it again after a restore. PX_ERR_INVALID: not a sparse variable, or a rate that is
 * not finite and >= 0 (0 is a rate torch takes: a warm-up's first step). */
PX_API px_status px_set_sparse_lr(px_var* var, double learning_rate);

/* (1.12) Registers a group of sparse tables that take their steps together, as TorchRec's
 * EmbeddingBagCollection and FBGEMM's table-batched embeddings do: n_tables tables of
 * table_rows[t] rows, named table_names[t] (unique in the group), all dim wide with one dtype
 * and one set of options. The daemons hold the group as the one sparse variable name, whose
 * rows are the tables' one after another (table t's row r is the variable's row r plus the
 * rows of tables 0..t-1), so a grouped step is one pull or push step of that variable: every
 * route, prefetch, wire dtype and consistency as for any sparse variable. out_group (may be
 * NULL) receives that variable's handle (its indices are the variable's rows); out_tables
 * (may be NULL) receives n_tables handles, one per table, whose indices are the table's own
 * rows in every sparse operation: px_pull_rows on one of them is a step of the whole group
 * with that table's rows only, px_set_sparse_lr and px_var_stats_get act on the group. A
 * table's bad index fails its request with PX_ERR_INDEX naming the table. Every worker must
 * register the group with the same tables (names and rows, in order), dtype, dim and options,
 * otherwise PX_ERR_MISMATCH. Tables of different widths or options are separate groups. */
PX_API px_status px_register_sparse_group(px_client* client, const char* name, px_dtype dtype,
                                          uint64_t n_tables, const char* const* table_names,
                                          const uint64_t* table_rows, uint64_t dim,
                                          const px_sparse_options* options, px_var** out_group,
                                          px_var** out_tables);

/* --- shared memory ---------------------------------------------------------------- */
/* Memory in the arena shared with the daemon: buffers there are reduced in place, without
 * the copy ordinary memory costs. 64-byte aligned. */
PX_API px_status px_alloc(px_client* client, uint64_t bytes, void** out_ptr);
/* Frees memory from px_alloc or px_alloc_ex. */
PX_API px_status px_free(px_client* client, void* ptr);
/* (1.8) Fills options with the defaults (host memory, device -1). */
PX_API void px_alloc_options_init(px_alloc_options* options);
/* (1.8) px_alloc, or with PX_MEMORY_CUDA device memory (cudaMalloc, in whole 2 MiB units)
 * handed to the daemon once with CUDA IPC, 256-byte aligned. Needs a CUDA runtime (the
 * process's own, or else libcudart.so.13 or .12, loaded then) and the device on the daemon
 * ([GPUs] in the README): otherwise PX_ERR_NOT_IMPLEMENTED naming why. options may be NULL
 * (host memory). */
PX_API px_status px_alloc_ex(px_client* client, uint64_t bytes, const px_alloc_options* options,
                             void** out_ptr);

/* --- operations ------------------------------------------------------------------- */
/* Fills options with the defaults (host memory, device -1, priority 0, root 0). */
PX_API void px_op_options_init(px_op_options* options);
/* Allreduces in (count elements of the variable) across every worker into out. in and out
 * may be arena or ordinary memory and may be equal; otherwise they must not overlap.
 * The n-th px_allreduce of a variable on every worker is step n of that variable; steps
 * of different variables may be submitted in any order. Do not touch in or out until the
 * request completes. */
PX_API px_status px_allreduce(px_var* var, const void* in, void* out, px_request** out_request);
/* px_allreduce with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_allreduce_ex(px_var* var, const void* in, void* out,
                                 const px_op_options* options, px_request** out_request);
/* (1.3) Broadcast: the root worker's in buffer (count elements of the dense variable) into
 * every worker's out, on every node. The root is px_op_options.root, a global rank (default
 * 0); every worker must name the same root, else the step fails with PX_ERR_INVALID. in is
 * read on the root only (NULL allowed elsewhere); in and out may be equal. Broadcast steps of
 * a variable are numbered apart from its allreduce steps. (Horovod's broadcast_parameters:
 * register each tensor once, broadcast it from rank 0 at start.) */
PX_API px_status px_broadcast(px_var* var, const void* in, void* out, px_request** out_request);
/* px_broadcast with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_broadcast_ex(px_var* var, const void* in, void* out,
                                 const px_op_options* options, px_request** out_request);
/* (1.3) Allgather: every worker's in (count elements of the dense variable) concatenated in
 * global rank order into out, which holds world_size * count elements on every worker. */
PX_API px_status px_allgather(px_var* var, const void* in, void* out, px_request** out_request);
/* px_allgather with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_allgather_ex(px_var* var, const void* in, void* out,
                                 const px_op_options* options, px_request** out_request);
/* (1.3) Allgather of blocks of given sizes (MPI_Allgatherv): counts holds world_size element
 * counts, the same on every worker (else PX_ERR_INVALID); in holds counts[rank] elements of
 * the variable's dtype and out their sum, concatenated in rank order. The variable's count
 * is the most any worker may contribute. in is copied (with counts) into the arena, so in
 * may be reused once the call returns. */
PX_API px_status px_allgatherv(px_var* var, const void* in, const uint64_t* counts, void* out,
                               px_request** out_request);
/* px_allgatherv with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_allgatherv_ex(px_var* var, const void* in, const uint64_t* counts, void* out,
                                  const px_op_options* options, px_request** out_request);
/* (1.9) Reduce-scatter (MPI_Reduce_scatter_block): every worker's in holds world_size * count
 * elements of the dense variable, block r for global rank r; each block is reduced across
 * every worker with the variable's op (PX_MEAN divides by the world size), and block r lands
 * in rank r's out (count elements). On a cluster each node sends the others only the blocks
 * of their workers: a ring reduce-scatter between the nodes, after the node's workers are
 * reduced locally. in and out must not overlap. */
PX_API px_status px_reduce_scatter(px_var* var, const void* in, void* out,
                                   px_request** out_request);
/* px_reduce_scatter with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_reduce_scatter_ex(px_var* var, const void* in, void* out,
                                      const px_op_options* options, px_request** out_request);
/* (1.9) Alltoall (MPI_Alltoall): every worker's in holds world_size * count elements, block r
 * for global rank r; every worker's out gets world_size * count elements, block s from rank
 * s. A node sends each other node one stream: its workers' blocks for that node's workers.
 * in and out must not overlap. */
PX_API px_status px_alltoall(px_var* var, const void* in, void* out, px_request** out_request);
/* px_alltoall with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_alltoall_ex(px_var* var, const void* in, void* out,
                                const px_op_options* options, px_request** out_request);
/* (1.9) Alltoall of blocks of given sizes (MPI_Alltoallv): send_counts[r] elements of in go
 * to rank r and recv_counts[s] elements of out come from rank s, both world_size counts and
 * the blocks one after another in rank order. Every worker's recv_counts[s] must be rank s's
 * send_counts for it: otherwise the step fails with PX_ERR_INVALID naming both ranks (on
 * the receiving node; the others may complete it). The variable's count is the most any one
 * block may hold, as for px_allgatherv; px_alltoall is px_alltoallv with every count the
 * variable's, and the two are one sequence of steps on a variable. in is copied (with the
 * counts) into the arena, so in may be reused once the call returns. */
PX_API px_status px_alltoallv(px_var* var, const void* in, const uint64_t* send_counts, void* out,
                              const uint64_t* recv_counts, px_request** out_request);
/* px_alltoallv with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_alltoallv_ex(px_var* var, const void* in, const uint64_t* send_counts,
                                 void* out, const uint64_t* recv_counts,
                                 const px_op_options* options, px_request** out_request);
/* Writes every sparse variable of the job this worker registered to the directory path
 * (created if missing; on a cluster every node writes its own shards there, so use a path
 * every node shares, or the same local path on each and gather the files before a
 * restore): once every push this worker has issued is applied on every shard, each node
 * writes <path>/<job>.<variable>.node<i>.shard, then this worker's daemon writes the Cap'n
 * Proto manifest <path>/<job>.<variable>.manifest. Files are written atomically
 * (temporary file, fsync, rename); a checkpoint exists once its manifest does. Call it
 * between steps, when every worker has pushed the same number of steps (e.g. after a
 * px_barrier). parallaxd --restore DIR loads a variable from its manifest when the
 * variable is registered, on any number of nodes. timeout_ms <= 0 means the connection's
 * timeout; past it the call returns PX_ERR_TIMEOUT (shard writes already under way still
 * finish, and their manifest then still appears). A lost node is PX_ERR_PEER_LOST naming
 * it. */
PX_API px_status px_checkpoint(px_client* client, const char* path, int64_t timeout_ms);

/* Sparse operations. indices are n row numbers in [0, rows), duplicates allowed; row
 * buffers hold n * dim values, row i of the buffer for indices[i]. A bad index fails the
 * request with PX_ERR_INDEX naming it and none of that request is applied. Buffers may be
 * arena or ordinary memory; do not touch them until the request completes. */
/* Pull step: fills out_rows with the rows' current values (see "Steps" above). */
PX_API px_status px_pull_rows(px_var* var, const int64_t* indices, uint64_t n, void* out_rows,
                              px_request** out_request);
/* px_pull_rows with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_pull_rows_ex(px_var* var, const int64_t* indices, uint64_t n, void* out_rows,
                                 const px_op_options* options, px_request** out_request);
/* (1.6) The next pull step, issued ahead: exactly px_pull_rows, on a variable registered
 * with px_sparse_options.prefetch = 1 (else PX_ERR_INVALID), typically before the push of
 * the step in progress. In PX_SYNC the rows no node pulled in that step (so none can push
 * them) come from their owners at once, the others once that step's push is applied: the
 * result is the same as a pull issued after the push, never a stale row. */
PX_API px_status px_prefetch_rows(px_var* var, const int64_t* indices, uint64_t n, void* out_rows,
                                  px_request** out_request);
/* px_prefetch_rows with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_prefetch_rows_ex(px_var* var, const int64_t* indices, uint64_t n,
                                     void* out_rows, const px_op_options* options,
                                     px_request** out_request);
/* Push step: gradients for the rows; duplicates are summed. Completes once the daemon has
 * taken the gradients (they are applied by the owning shards, see "Steps"). */
PX_API px_status px_push_rows(px_var* var, const int64_t* indices, uint64_t n, const void* grads,
                              px_request** out_request);
/* px_push_rows with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_push_rows_ex(px_var* var, const int64_t* indices, uint64_t n, const void* grads,
                                 const px_op_options* options, px_request** out_request);
/* Overwrites the rows' values (initial or pretrained values); completes once every owning
 * shard wrote them. With duplicate indices the last one wins. Optimizer state is kept. */
PX_API px_status px_load_rows(px_var* var, const int64_t* indices, uint64_t n, const void* rows,
                              px_request** out_request);
/* px_load_rows with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_load_rows_ex(px_var* var, const int64_t* indices, uint64_t n, const void* rows,
                                 const px_op_options* options, px_request** out_request);
/* Reads the rows' current values without a step (export, evaluation). */
PX_API px_status px_read_rows(px_var* var, const int64_t* indices, uint64_t n, void* out_rows,
                              px_request** out_request);
/* px_read_rows with per-operation options (NULL: the defaults; px_op_options). */
PX_API px_status px_read_rows_ex(px_var* var, const int64_t* indices, uint64_t n, void* out_rows,
                                 const px_op_options* options, px_request** out_request);

/* (1.12) One pull step of a group over several of its tables (px_register_sparse_group):
 * tables holds n handles of tables of one group (in any order, repeats allowed), and
 * counts[i] of indices, one after another, are rows of tables[i] (the table's own row
 * numbers); out_rows receives sum(counts) rows in the same order. tables, counts and indices
 * are read during the call (the indices translated to the group's rows), so they may be
 * reused once it returns; out_rows as px_pull_rows's. Host memory only (device memory:
 * PX_ERR_NOT_IMPLEMENTED; a group's own variable takes it, with its rows). options may be
 * NULL (the defaults; px_op_options). */
PX_API px_status px_pull_rows_group(px_var* const* tables, uint64_t n, const uint64_t* counts,
                                    const int64_t* indices, void* out_rows,
                                    const px_op_options* options, px_request** out_request);
/* (1.12) px_pull_rows_group issued ahead, as px_prefetch_rows (the group registered with
 * px_sparse_options.prefetch = 1). */
PX_API px_status px_prefetch_rows_group(px_var* const* tables, uint64_t n, const uint64_t* counts,
                                        const int64_t* indices, void* out_rows,
                                        const px_op_options* options, px_request** out_request);
/* (1.12) One push step of a group over several of its tables: gradients for the rows, laid
 * out as px_pull_rows_group's. */
PX_API px_status px_push_rows_group(px_var* const* tables, uint64_t n, const uint64_t* counts,
                                    const int64_t* indices, const void* grads,
                                    const px_op_options* options, px_request** out_request);

/* Waits for the request. Returns the operation's status (PX_OK when it succeeded), or
 * PX_ERR_TIMEOUT after timeout_ms (the request is still valid). timeout_ms < 0 waits
 * without a deadline of its own; operations still fail when a peer is lost, and the daemon
 * fails a step that a local worker has not submitted within its step_stall_ms. */
PX_API px_status px_wait(px_request* request, int64_t timeout_ms);
/* *out_done = 1 and the operation's status when complete; *out_done = 0 and PX_OK if not. */
PX_API px_status px_test(px_request* request, int32_t* out_done);
/* Waits for all n requests (sharing one deadline); returns the first failure, if any. */
PX_API px_status px_wait_all(px_request* const* requests, uint64_t n, int64_t timeout_ms);
/* Frees a request, complete or not. An incomplete one may still write into an arena out
 * buffer until the daemon completes it (px_request_cancel first to rule that out); ordinary
 * out memory is never written after this. A wait on it in another thread returns
 * PX_ERR_CANCELLED. */
PX_API px_status px_request_free(px_request* request);
/* (1.3) The failed operation's message (node, worker, variable, step), whole; "" while the
 * request is incomplete or if it succeeded. Owned by the request: valid until
 * px_request_free, whichever thread waited. NULL request or a freed one: a static message. */
PX_API const char* px_request_error(px_request* request);
/* (1.3) Cancels the request: once this returns PX_OK, nothing writes its out buffer any
 * more, and px_wait on it returns PX_ERR_CANCELLED (unless it already returned its result
 * before). A step still waiting for other local workers is withdrawn: those workers' same
 * step fails with PX_ERR_CANCELLED naming this worker (on a cluster the job fails on every
 * node, since the other nodes cannot complete that step without it). An operation already
 * running is let finish first (the call waits for it, up to the connection's timeout, then
 * returns PX_ERR_TIMEOUT); the contents of an arena out buffer are then unspecified. */
PX_API px_status px_request_cancel(px_request* request);
/* Returns once every worker of the job, on every node, has entered the barrier. A barrier
 * that times out is withdrawn (as px_request_cancel), so it never releases the others. */
PX_API px_status px_barrier(px_client* client, int64_t timeout_ms);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PARALLAX_C_H */
