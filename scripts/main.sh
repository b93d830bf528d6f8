#!/usr/bin/env bash
# Sets everything up and runs the main job: the claims made for transformers
# against recurrent networks, each measured for an RNN, an LSTM and a GPT at
# matched parameter counts on the Brown corpus and on a synthetic recall task,
# with a verdict table at the end (see doc/study.md). Extra arguments go to the
# study (build/examples/study --help), e.g. --quick or --part cost. The scale
# part's runs spread over one MPI rank per core (the other parts run on rank 0
# with every core), where the build has MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
brown=$(scripts/fetch_brown.sh | tail -n 1)
launch=()
if command -v mpirun > /dev/null && [[ $(nproc) -gt 1 ]] &&
   ldd build/examples/study | grep -q libmpi; then
  # Slots are hardware threads, as nproc counts them (OpenMPI's default,
  # physical cores, refuses a rank per thread on an SMT machine).
  launch=(mpirun -n "$(nproc)" --use-hwthread-cpus --bind-to none)
  [[ $EUID -eq 0 ]] && launch+=(--allow-run-as-root)
fi
exec "${launch[@]}" build/examples/study --brown-dir "$brown" "$@"
