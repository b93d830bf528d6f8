// DistributedDataParallel over MPI (see distributed/ddp.h).
#include "distributed/ddp.h"

#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "distributed/mpi_util.h"

namespace tg::dist {

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

struct DistributedDataParallel::Impl {
  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket = 0;
    int64_t offset = 0;  // in the bucket's buffer, in elements
    bool final = false;  // its gradient is final in this round
  };
  struct Bucket {
    Tensor buffer;              // (n,) contiguous, one dtype
    std::vector<size_t> params; // indices into Impl::params
    size_t waiting = 0;         // parameters whose gradient is not final yet this round
    MPI_Request request = MPI_REQUEST_NULL;
  };

  DDPOptions options;
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  std::vector<HookHandle> hooks;
  size_t next_start = 0;     // buckets start in index order
  size_t next_done = 0;      // buckets before it have completed
  size_t final_params = 0;   // this round
  bool averaged = false;     // this round's means are in .grad
  double first_start = -1;   // when this round's first bucket started (-1: none yet)
  DDPStats stats;

  void on_final(size_t i);
  void start(Bucket& b);
  void start_ready();
  void poll();
  void complete();
  void reset_round();
};

DistributedDataParallel::DistributedDataParallel(nn::Module& module, DDPOptions options) : impl_(std::make_unique<Impl>()) {
  require_environment("DistributedDataParallel");
  if (options.bucket_bytes <= 0)
    throw ValueError(fmt::format("DistributedDataParallel: bucket_bytes must be positive, got {}", options.bucket_bytes));
  Impl& d = *impl_;
  d.options = options;
  if (world_size() == 1) return;

  std::string layout = fmt::format("options bucket_bytes {} overlap {}\n", options.bucket_bytes, options.overlap);
  for (auto& [name, p] : module.named_parameters())
    layout += fmt::format("parameter {} {} {}\n", name, p.shape(), dtype_name(p.dtype()));
  for (auto& [name, b] : module.named_buffers())
    layout += fmt::format("buffer {} {} {}\n", name, b.shape(), dtype_name(b.dtype()));
  check_same("DistributedDataParallel: the models", layout);

  {
    NoGradGuard no_grad;
    for (auto& [name, t] : module.state_dict()) broadcast(t);
  }

  // Buckets, from the last registered parameter to the first, split where
  // the dtype changes or the next parameter would overflow bucket_bytes.
  for (auto& [name, p] : module.named_parameters()) {
    if (!is_floating(p.dtype()))
      throw DTypeError(fmt::format("DistributedDataParallel: parameter {} is {}, not floating", name, dtype_name(p.dtype())));
    d.params.push_back({name, p});
  }
  std::vector<std::pair<DType, int64_t>> layouts;  // each bucket's dtype and elements
  for (size_t k = d.params.size(); k-- > 0;) {
    Impl::Param& p = d.params[k];
    const DType dt = p.tensor.dtype();
    const int64_t n = p.tensor.numel(), item = static_cast<int64_t>(itemsize(dt));
    if (layouts.empty() || layouts.back().first != dt || (layouts.back().second + n) * item > options.bucket_bytes) {
      layouts.emplace_back(dt, 0);
      d.buckets.emplace_back();
    }
    p.bucket = d.buckets.size() - 1;
    p.offset = layouts.back().second;
    layouts.back().second += n;
    d.buckets.back().params.push_back(k);
  }
  for (size_t b = 0; b < d.buckets.size(); ++b) {
    auto [dt, n] = layouts[b];
    mpi_count(n, "DistributedDataParallel");
    d.buckets[b].buffer = zeros({n}, dt);
    d.buckets[b].waiting = d.buckets[b].params.size();
    d.stats.bytes += n * static_cast<int64_t>(itemsize(dt));
  }
  d.stats.buckets = static_cast<int64_t>(d.buckets.size());

  for (size_t k = 0; k < d.params.size(); ++k)
    d.hooks.push_back(d.params[k].tensor.register_post_accumulate_grad_hook([&d, k](const Tensor&) { d.on_final(k); }));
}

DistributedDataParallel::~DistributedDataParallel() {
  for (const HookHandle& h : impl_->hooks) h.remove();
  // An allreduce still in flight (an exception left the round unfinished)
  // may yet write its buffer: keep those alive, the job is going down.
  static std::vector<Tensor> in_flight;
  for (size_t b = impl_->next_done; b < impl_->next_start; ++b) in_flight.push_back(impl_->buckets[b].buffer);
}

void DistributedDataParallel::Impl::on_final(size_t i) {
  const double t0 = now();
  Param& p = params[i];
  if (p.final)
    throw DistError(fmt::format(
        "DistributedDataParallel: the gradient of {} became final twice in one round: call finish() after every "
        "backward (a backward that does not reach every parameter leaves its round open)",
        p.name));
  averaged = false;  // set again when this round completes
  p.final = true;
  ++final_params;
  --buckets[p.bucket].waiting;
  if (options.overlap) start_ready();
  poll();
  stats.hook_seconds += now() - t0;
  // Backward reached every parameter: nothing more can come this round.
  if (final_params == params.size()) complete();
}

void DistributedDataParallel::Impl::start(Bucket& b) {
  if (first_start < 0) first_start = now();
  NoGradGuard no_grad;
  for (size_t k : b.params) {
    const Param& p = params[k];
    Tensor dst = b.buffer.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.shape());
    const Tensor g = p.tensor.grad();
    if (g.defined())
      dst.copy_(g);
    else
      dst.zero_();
  }
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, b.buffer.storage()->data, static_cast<int>(b.buffer.numel()),
                           mpi_type(b.buffer.dtype(), "DistributedDataParallel"), MPI_SUM, MPI_COMM_WORLD, &b.request),
            "MPI_Iallreduce");
}

void DistributedDataParallel::Impl::start_ready() {
  while (next_start < buckets.size() && buckets[next_start].waiting == 0) start(buckets[next_start++]);
}

void DistributedDataParallel::Impl::poll() {
  // One MPI_Test drives OpenMPI's progress engine for every request in flight.
  while (next_done < next_start) {
    int flag = 0;
    check_mpi(MPI_Test(&buckets[next_done].request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (!flag) break;
    ++next_done;
  }
}

void DistributedDataParallel::Impl::complete() {
  if (first_start >= 0) stats.window_seconds += now() - first_start;
  if (!options.overlap) {
    const double t0 = now();
    barrier();
    stats.skew_seconds += now() - t0;
  }
  double t0 = now();
  while (next_start < buckets.size()) start(buckets[next_start++]);
  for (; next_done < next_start; ++next_done)
    check_mpi(MPI_Wait(&buckets[next_done].request, MPI_STATUS_IGNORE), "MPI_Wait");
  stats.wait_seconds += now() - t0;

  t0 = now();
  NoGradGuard no_grad;
  const double inv = 1.0 / world_size();
  for (Bucket& b : buckets) {
    b.buffer.mul_(inv);
    for (size_t k : b.params) {
      const Param& p = params[k];
      Tensor mean = b.buffer.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.shape());
      const Tensor g = p.tensor.grad();
      if (g.defined())
        g.copy_(mean);
      else
        p.tensor.set_grad(mean.clone());
    }
  }
  stats.copy_back_seconds += now() - t0;
  ++stats.rounds;
  reset_round();
  averaged = true;
}

void DistributedDataParallel::Impl::reset_round() {
  for (Param& p : params) p.final = false;
  for (Bucket& b : buckets) b.waiting = b.params.size();
  next_start = next_done = final_params = 0;
  first_start = -1;
}

void DistributedDataParallel::finish() {
  if (world_size() == 1 || impl_->averaged) return;
  impl_->complete();
}

const DDPStats& DistributedDataParallel::stats() const { return impl_->stats; }

void DistributedDataParallel::reset_stats() {
  impl_->stats = DDPStats{.buckets = impl_->stats.buckets, .bytes = impl_->stats.bytes};
}

}  // namespace tg::dist
