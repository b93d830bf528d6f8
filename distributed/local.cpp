// distributed/dist.h and distributed/ddp.h in a build without MPI (meson found none, or
// -Dmpi=disabled): every process is the only rank of a world of one, so
// programs written for N ranks run unchanged as one.
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "distributed/ddp.h"

namespace tg::dist {

Environment::Environment(int&, char**&) {
  // Under mpirun each process would train alone and all would write the same files.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(var))
      abort("dist::Environment: started by mpirun, but this build has no MPI "
            "(install libopenmpi-dev and rebuild; meson option mpi)");
}
Environment::~Environment() = default;

int rank() { return 0; }
int world_size() { return 1; }

void abort(const std::string& message, int code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(code);
}

Tensor shard(const Tensor& batch) { return batch; }
void all_reduce_sum(std::span<double>) {}
double all_reduce_sum(double value) { return value; }
void check_same(const std::string&, const std::string&) {}
void broadcast(const Tensor&) {}
void barrier() {}
void idle_barrier() {}
std::vector<std::string> all_gather(const std::string& value) { return {value}; }

struct DistributedDataParallel::Impl {
  DDPStats stats;
};
DistributedDataParallel::DistributedDataParallel(nn::Module&, DDPOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.bucket_bytes <= 0)
    throw ValueError(fmt::format("DistributedDataParallel: bucket_bytes must be positive, got {}", options.bucket_bytes));
}
DistributedDataParallel::~DistributedDataParallel() = default;
void DistributedDataParallel::finish() {}
const DDPStats& DistributedDataParallel::stats() const { return impl_->stats; }
void DistributedDataParallel::reset_stats() { impl_->stats = {}; }

}  // namespace tg::dist
