#pragma once
// tg::dist: the processes of a data-parallel job and what they say to each
// other. Under `mpirun -np N` every process is one rank of N; started any
// other way, a program is the only rank of a world of one and makes no MPI
// call at all (a build without MPI has only that world).
//
//   int main(int argc, char** argv) {
//     dist::Environment env(argc, argv);          // before anything else
//     try {
//       ... dist::rank(), dist::world_size(), dist::shard(batch) ...
//     } catch (const std::exception& e) {
//       dist::abort(fmt::format("train: {}", e.what()));  // ends every rank
//     }
//   }
//
// Data-parallel training itself is DistributedDataParallel (distributed/ddp.h).
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/tensor.h"

namespace tg::dist {

// The ranks disagree where they must agree (models, resumed state), or MPI
// failed. Thrown on every rank that sees it, with the same message.
struct DistError : std::runtime_error { using std::runtime_error::runtime_error; };

// Joins the MPI job when the process was started by mpirun (or another
// launcher that sets the PMI/PMIx environment), with thread support
// "funneled": only the thread that made the Environment calls MPI (the
// kernels' pool threads never do). One Environment per process, made before
// any other dist call and destroyed after the last (MPI_Finalize).
class Environment {
 public:
  Environment(int& argc, char**& argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
};

int rank();        // 0 .. world_size()-1; 0 without an Environment
int world_size();  // 1 without an Environment or without mpirun
inline bool is_main() { return rank() == 0; }  // the rank that prints and writes files

// Ends the whole job now: prints message (prefixed "[rank r/N] " when N > 1)
// to stderr and calls MPI_Abort, so that the other ranks stop instead of
// waiting forever for this one in a collective; in a world of one, exits with
// `code`. For a rank that cannot go on (an exception reached main).
[[noreturn]] void abort(const std::string& message, int code = 1);

// This rank's rows of a (B, ...) batch: B/N rows from rank*B/N (a view).
// N ranks that each train on their shard of the same batch compute, after
// averaging their gradients, the step one process computes on the whole
// batch. ValueError unless N divides B.
Tensor shard(const Tensor& batch);

// Element-wise sum over the ranks, in place, on every rank (MPI_Allreduce).
void all_reduce_sum(std::span<double> values);
double all_reduce_sum(double value);

// Every rank passes its own `value` (a description of something that must
// be equal everywhere: a model's parameter list, a resumed step); DistError
// on every rank unless all are equal, naming `what`, the first rank that
// differs from rank 0 and the first line where they differ.
void check_same(const std::string& what, const std::string& value);

// Copies rank 0's data into t on every rank (MPI_Bcast); t keeps its shape.
void broadcast(const Tensor& t);

void barrier();
// A barrier for a rank that may wait long (for rank 0 alone doing other
// work): it sleeps between polls instead of spinning on a core.
void idle_barrier();

// Every rank's value, in rank order, on every rank (MPI_Allgatherv).
std::vector<std::string> all_gather(const std::string& value);

}  // namespace tg::dist
