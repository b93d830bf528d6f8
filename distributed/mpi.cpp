// The MPI side of distributed/dist.h (built when meson finds MPI; distributed/local.cpp otherwise).
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "distributed/mpi_util.h"

namespace tg::dist {

namespace {
bool g_joined = false;  // MPI_Init_thread was called by an Environment
int g_rank = 0, g_size = 1;
}  // namespace

bool launched_by_mpi() {
  // OpenMPI's mpirun, PMIx launchers (OpenMPI 5, Slurm) and PMI ones (MPICH's hydra, Slurm).
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(var)) return true;
  return false;
}

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw DistError(fmt::format("{}: {}", call, std::string(text, static_cast<size_t>(len))));
}

Environment::Environment(int& argc, char**& argv) {
  if (g_joined) throw DistError("dist::Environment: only one per process");
  if (!launched_by_mpi()) return;  // a world of one: no MPI call at all
  int provided = 0;
  check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  g_joined = true;
  if (provided < MPI_THREAD_SERIALIZED)
    abort(fmt::format("dist::Environment: this MPI gives thread support level {}, below MPI_THREAD_SERIALIZED", provided));
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
}

Environment::~Environment() {
  if (!g_joined) return;
  MPI_Finalize();
  g_joined = false;
  g_rank = 0, g_size = 1;
}

int rank() { return g_rank; }
int world_size() { return g_size; }

void abort(const std::string& message, int code) {
  if (g_size > 1)
    std::fprintf(stderr, "[rank %d/%d] %s\n", g_rank, g_size, message.c_str());
  else
    std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  if (g_joined) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

void require_environment(const char* who) {
  if (!g_joined && launched_by_mpi())
    throw DistError(fmt::format("{}: started by mpirun but no dist::Environment was made (make one first thing in main)", who));
}

MPI_Datatype mpi_type(DType d, const char* who) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
    case DType::bf16: break;  // MPI has no bfloat16 sum; gradients are float32
  }
  throw DTypeError(fmt::format("{}: no MPI type for {}", who, dtype_name(d)));
}

int mpi_count(int64_t n, const char* who) {
  if (n > INT_MAX) throw DistError(fmt::format("{}: {} elements is more than one MPI call takes ({})", who, n, INT_MAX));
  return static_cast<int>(n);
}

Tensor shard(const Tensor& batch) {
  const int64_t B = batch.size(0), N = world_size();
  if (B % N != 0)
    throw ValueError(fmt::format("dist::shard: a batch of {} rows does not split evenly over {} ranks", B, N));
  return N == 1 ? batch : batch.narrow(0, rank() * (B / N), B / N);
}

void all_reduce_sum(std::span<double> values) {
  require_environment("dist::all_reduce_sum");
  if (g_size == 1) return;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), mpi_count(static_cast<int64_t>(values.size()), "all_reduce_sum"),
                          MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
}

double all_reduce_sum(double value) {
  all_reduce_sum(std::span<double>(&value, 1));
  return value;
}

namespace {
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.find('\n', pos), text.size());
    out.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}
}  // namespace

std::vector<std::string> all_gather(const std::string& value) {
  require_environment("dist::all_gather");
  if (g_size == 1) return {value};
  const size_t N = static_cast<size_t>(g_size);
  int len = mpi_count(static_cast<int64_t>(value.size()), "all_gather");
  std::vector<int> lens(N), offsets(N);
  check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  int64_t total = 0;
  for (size_t r = 0; r < N; ++r) offsets[r] = mpi_count(total, "all_gather"), total += lens[r];
  std::string all(static_cast<size_t>(total), '\0');
  check_mpi(MPI_Allgatherv(value.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, MPI_COMM_WORLD),
            "MPI_Allgatherv");
  std::vector<std::string> out;
  for (size_t r = 0; r < N; ++r) out.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lens[r])));
  return out;
}

void check_same(const std::string& what, const std::string& value) {
  require_environment("dist::check_same");
  if (g_size == 1) return;
  // Every rank gathers every rank's text, so all of them reach the same verdict.
  const std::vector<std::string> texts = all_gather(value);
  const std::vector<std::string> first = lines_of(texts[0]);
  for (size_t r = 1; r < texts.size(); ++r) {
    const std::vector<std::string> other = lines_of(texts[r]);
    for (size_t k = 0; k < std::max(first.size(), other.size()); ++k) {
      const std::string a = k < first.size() ? first[k] : "(nothing)", b = k < other.size() ? other[k] : "(nothing)";
      if (a != b)
        throw DistError(fmt::format("{} differ between ranks: rank {} has '{}' where rank 0 has '{}' (line {})", what, r,
                                    b, a, k + 1));
    }
  }
}

void broadcast(const Tensor& t) {
  require_environment("dist::broadcast");
  if (g_size == 1) return;
  Tensor buf = t.is_contiguous() ? t : t.contiguous();
  // In chunks: an MPI count is an int.
  char* p = static_cast<char*>(buf.storage()->data) + buf.offset() * static_cast<int64_t>(itemsize(buf.dtype()));
  for (int64_t left = buf.numel() * static_cast<int64_t>(itemsize(buf.dtype())); left > 0;) {
    int n = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    check_mpi(MPI_Bcast(p, n, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
    p += n, left -= n;
  }
  if (buf.impl() != t.impl())
    t.copy_(buf);
  else
    t.bump_version();
}

void barrier() {
  require_environment("dist::barrier");
  if (g_size > 1) check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

void idle_barrier() {
  require_environment("dist::idle_barrier");
  if (g_size == 1) return;
  // MPI_Barrier polls at full speed; a rank that waits here for minutes would
  // take a core from the threads of the rank it waits for.
  MPI_Request request;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &request), "MPI_Ibarrier");
  for (int done = 0;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace tg::dist
