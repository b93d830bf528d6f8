#!/usr/bin/env bash
# Sets everything up and runs the main job: the claims made for transformers
# against recurrent networks, each measured for an RNN, an LSTM and a GPT at
# matched parameter counts on the Brown corpus and on a synthetic recall task,
# with a verdict table at the end (see doc/study.md). Extra arguments go to the
# study (build/examples/study --help), e.g. --quick or --part cost.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
brown=$(scripts/fetch_brown.sh | tail -n 1)
exec build/examples/study --brown-dir "$brown" "$@"
