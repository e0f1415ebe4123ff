#!/bin/sh
# Longer fuzzing run (not CI): fuzz/run.sh [SECONDS]  (default 3600)
# Keeps the corpus in fuzz/corpus/ (grows across runs) and crash inputs in fuzz/crashes/.
set -eu
cd "$(dirname "$0")/.."
mkdir -p fuzz/corpus fuzz/crashes
exec "${PYTHON:-python}" -m fuzz.connection -max_total_time="${1:-3600}" \
    -artifact_prefix=fuzz/crashes/ fuzz/corpus
