#!/usr/bin/env bash
# Sets everything up and runs the main job: RNN vs LSTM vs GPT character
# language models trained on the Brown corpus, compared in one table (see
# README). Extra arguments go to charlm (build/examples/charlm --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
brown=$(scripts/fetch_brown.sh | tail -n 1)
exec build/examples/charlm --brown-dir "$brown" "$@"
