# The manifest of a sparse-variable checkpoint: <dir>/<job>.<variable>.manifest, written
# last (temp file, fsync, rename), so a checkpoint exists exactly when its manifest does.
# The shard files it lists hold rows with their global row numbers, so a restore may use
# another node count or partitioning.
@0xb4d0a9c6f2e81357;

struct CheckpointManifest {
  formatVersion @0 :UInt32;     # 1
  job @1 :Text;
  variable @2 :Text;
  rows @3 :UInt64;
  dim @4 :UInt64;
  options @5 :Text;             # SparseOptions::canonical() when saved
  stateSlots @6 :UInt32;        # optimizer state values per row value
  optimizerSteps @7 :UInt64;    # applied push steps (Adam's bias correction resumes there)
  nodes @8 :UInt32;             # node count when saved
  partitions @9 :UInt32;
  shardFiles @10 :List(Text);   # names relative to the manifest's directory, one per node
}
