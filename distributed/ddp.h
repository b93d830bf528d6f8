#pragma once
// Data-parallel training: every rank holds the whole model, trains on its
// own shard of each batch (dist::shard) and, before the optimizer step,
// replaces its gradients by their mean over the ranks, so that every rank
// takes the same step; the optimizer is unchanged (PyTorch's
// DistributedDataParallel).
//
//   dist::DistributedDataParallel ddp(model);   // after loading a checkpoint
//   for (...) {
//     opt.zero_grad();
//     Tensor loss = model.loss(dist::shard(x), dist::shard(y));
//     loss.backward();   // buckets of gradients start averaging during backward
//     ddp.finish();      // waits for them; .grad is now the mean over ranks
//     opt.step();
//   }
//
// Overlap. Parameters are grouped into buckets of about bucket_bytes, in the
// reverse of their registration order (roughly the order in which backward
// finishes their gradients: the output layer's first, the embedding's last).
// A post-accumulate hook on each parameter counts down its bucket; a bucket
// whose gradients are all final is copied into one contiguous buffer and its
// MPI_Iallreduce starts while backward goes on with the layers below.
// Buckets start in index order on every rank (MPI requires collectives in
// the same order everywhere), so a bucket that is ready early waits for the
// ones before it. The hooks also poll the allreduces in flight: OpenMPI
// progresses a non-blocking collective only inside MPI calls.
#include <cstdint>
#include <memory>

#include "distributed/dist.h"
#include "nn/module.h"

namespace tg::dist {

struct DDPOptions {
  // Bytes of gradient per bucket (a parameter larger than this is a bucket
  // of its own). Smaller buckets start earlier in backward and hide more of
  // the communication; each costs one more message. Must match on every rank.
  int64_t bucket_bytes = 1 << 20;
  // false: no bucket starts during backward; after backward the ranks meet at
  // a barrier (timed apart, as skew_seconds) and then average every bucket.
  // For measuring what overlap hides; must match on every rank.
  bool overlap = true;
};

// Where the time of the averaging went, summed over rounds (one round: one
// backward and its finish) since construction or reset_stats().
struct DDPStats {
  int64_t rounds = 0;
  int64_t buckets = 0;          // per round
  int64_t bytes = 0;            // gradient bytes each rank sends into the allreduces, per round
  double hook_seconds = 0;      // inside the hooks during backward: copies into buckets, starting and polling allreduces
  double window_seconds = 0;    // from the first bucket's start to the end of backward: what communication can hide behind
  double skew_seconds = 0;      // overlap=false only: waiting at the barrier for the slowest rank's backward
  double wait_seconds = 0;      // blocked after backward until every allreduce completed (communication not hidden)
  double copy_back_seconds = 0; // writing the means into .grad
};

class DistributedDataParallel {
 public:
  // Checks that every rank has the same parameters and buffers (names,
  // shapes, dtypes, in order; DistError naming the first mismatch), copies
  // rank 0's values into every rank (MPI_Bcast), and hooks every parameter.
  // In a world of one it does nothing, and finish() returns at once.
  explicit DistributedDataParallel(nn::Module& module, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Starts the buckets not started yet, waits for all, and sets every
  // parameter's .grad to the mean over the ranks (a rank whose backward did
  // not reach a parameter contributes zeros for it). Call it after each
  // backward, before clipping and the optimizer step. When backward reached
  // every parameter, the last parameter's hook has already done all this and
  // finish() returns at once (so a loop that calls only backward() works too).
  void finish();

  const DDPStats& stats() const;
  void reset_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tg::dist
