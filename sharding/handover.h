// A sparse table handed from one run of a job to the next when a run breaks, instead of
// going back to the periodic checkpoint.
//
// When a job's run breaks (a node lost or joined, a worker lost), each node keeps what it
// held of a synchronous table (any route but the column-wise alltoall; a replicated route's
// table is one partition, held whole): its own partitions and, with replicas, a copy of the
// partitions of the node before it in the epoch. Each partition comes with the push steps
// it applied and the journal of its last few steps (step_journal.h). When the job's next
// run registers the table, every node of the new epoch hands in its part (a handover image,
// below) and every node plans alike from all of them (plan_handover): each partition from
// its own node, or from the copy where that node is gone; every partition back to the same
// push step (the cut, below). Nothing after the cut is kept: a push step some partitions
// applied and others did not is undone where it was applied, as the step under way is. A
// partition no node holds, or one too far ahead to go back, leaves the table to the
// periodic checkpoint, and the plan says why.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "sharding/checkpoint.h"
#include "sharding/step_journal.h"

namespace px {

struct HandoverUnit {
  uint32_t partition = 0;
  bool replica = false;  // a copy of the previous node's partition, not this node's own
  uint64_t applied = 0;  // push steps of the run applied
  uint64_t applies = 0;  // optimizer applications (Adam's step), the run's restore included
  ShardFileData rows;    // the partition's rows, values and state now
  std::deque<StepJournal::Record> journal;  // oldest first
};

struct HandoverData {
  uint64_t epoch = 0;  // the epoch the run was in
  uint64_t run = 0;    // the run (its id in that epoch): a later run of one epoch is newer
  uint32_t node = 0;   // this node's rank in that epoch
  uint32_t nodes = 0;
  uint32_t partitions = 0;
  uint64_t dim = 0;
  uint32_t slots = 0;
  uint64_t restored_steps = 0;  // the push steps the run was restored at
  std::vector<HandoverUnit> units;
};

// An image is what a node hands in: every field, the rows as shard images (checkpoint.h).
// A node with nothing to hand in sends an empty image (0 bytes).
size_t handover_image_bytes(const HandoverData& data);
void encode_handover(const HandoverData& data, char* out);
// False with why for anything malformed (a truncated or damaged image, a unit's arrays not
// its dim and slots, a partition past the table's); bytes must be 8-byte aligned.
bool decode_handover(const char* bytes, size_t size, HandoverData* data, std::string* why);

struct HandoverPlan {
  bool ok = false;
  std::string why;  // not ok: why the table comes from the checkpoint instead
  uint64_t epoch = 0;
  uint64_t cut = 0;                 // the old run's push steps every partition is back at
  uint64_t restored_steps = 0;      // the old run's restore + cut: the new run's count
  uint64_t applies = 0;             // optimizer applications at the cut (the most of any)
  uint32_t from_replicas = 0;       // partitions taken from a copy (their node is gone)
  uint32_t rolled_back = 0;         // partitions taken back from past the cut
  std::vector<ShardFileData> rows;  // every partition's rows at the cut
};

// handed: what each node of the new epoch handed in (empty images left out). Only the
// newest run's parts count, by epoch and then run (a node's older part is of a run before). Every
// node, given the same parts in the same order, plans the same.
//
// uncommitted: the push steps taken back beyond the last one every partition applied. A
// worker's push is done when sent, and its step is committed after (parallax.elastic's
// State.commit()); an epoch that ends between the two leaves the newest push step applied
// everywhere and committed nowhere, which the next run would push again. Taking it back
// (1, the daemon's choice) loses at most that step where it was committed, rather than
// applying it twice where it was not: a worker pushes step k+1 only after committing k,
// so every partition applied at most one step past the last commit.
HandoverPlan plan_handover(std::vector<HandoverData> handed, uint64_t uncommitted = 1);

}  // namespace px
