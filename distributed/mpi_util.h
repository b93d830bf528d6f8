#pragma once
// What distributed/mpi.cpp shares with distributed/ddp.cpp (MPI builds only).
#define OMPI_SKIP_MPICXX 1  // the C API only: OpenMPI's deprecated C++ bindings warn
#include <mpi.h>

#include "distributed/dist.h"

namespace tg::dist {

bool launched_by_mpi();
// DistError naming the call and MPI's text for rc, unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* call);
// DistError when the process runs under mpirun but made no Environment:
// each rank would otherwise train alone, silently.
void require_environment(const char* who);
MPI_Datatype mpi_type(DType d, const char* who);
int mpi_count(int64_t n, const char* who);  // DistError above INT_MAX

}  // namespace tg::dist
