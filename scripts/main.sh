#!/usr/bin/env bash
# Sets everything up and runs the main job: the RNN-vs-LSTM-vs-transformer
# character language-model comparison on the Brown corpus.
# Extra arguments go to charlm (see build/examples/charlm --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_brown.sh >/dev/null
exec build/examples/charlm "$@"
