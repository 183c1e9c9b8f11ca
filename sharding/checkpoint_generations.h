// Periodic checkpoints of a job, kept as numbered generations:
//   <dir>/<job>/<generation>.partial/   while being written (every node's shard files and
//                                       the manifests of the job's sparse variables)
//   <dir>/<job>/<generation>/           once every variable of the job is saved: the rename
//                                       of the folder is the commit, so a generation either
//                                       exists complete or not at all
// Generations are numbered 1, 2, ... per job (zero-padded so names sort), continuing after
// a restart; the newest `keep` complete ones stay. A restore takes, per variable, the newest
// manifest among the newest complete generation and a checkpoint written directly into
// <dir> (px_checkpoint, the drain).
#pragma once

#include <cstdint>
#include <string>

namespace px {

// "<dir>/<job>" (the job's name made safe, as in checkpoint_stem).
std::string generations_dir(const std::string& dir, const std::string& job);
// The folder generation n of job is written into, and the one it is renamed to.
std::string partial_generation_dir(const std::string& dir, const std::string& job, uint64_t n);
std::string generation_dir(const std::string& dir, const std::string& job, uint64_t n);

// The number after every generation of job in dir, complete or not (1 if none).
uint64_t next_generation(const std::string& dir, const std::string& job);
// The newest complete generation of job in dir; 0 if none.
uint64_t newest_generation(const std::string& dir, const std::string& job);

// Creates generation n's partial folder (and its parents); false with error if it cannot.
bool begin_generation(const std::string& dir, const std::string& job, uint64_t n,
                      std::string* error);
// Renames the partial folder to the complete one and fsyncs the job's folder.
bool commit_generation(const std::string& dir, const std::string& job, uint64_t n,
                       std::string* error);
// Removes generation n's partial folder (a generation that failed).
void discard_generation(const std::string& dir, const std::string& job, uint64_t n);
// Removes every complete generation of job but the newest keep, and every partial one
// older than the newest complete (left by a daemon that died while writing). Returns how
// many folders were removed.
int prune_generations(const std::string& dir, const std::string& job, int keep);

// The manifest a variable restores from: the newer (by modification time) of
// <dir>/<job>.<variable>.manifest and the newest complete generation's; "" if neither.
std::string restore_manifest(const std::string& dir, const std::string& job,
                             const std::string& variable);

}  // namespace px
