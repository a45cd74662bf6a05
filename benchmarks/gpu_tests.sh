#!/usr/bin/env bash
# The test suite on a GPU machine that reaches no package registry
# (docs/notes/2026-11-29-gpu-test-suite.md).
#
#   bash benchmarks/gpu_tests.sh fetch   # here, where pip reaches PyPI: the wheels into .whl/
#   bash benchmarks/gpu_tests.sh         # there: installs .whl/, runs the GPU-relevant files
#
# The machine's image brings jax with its CUDA plugin, numpy, scipy, pytest, pytest-xdist and
# pytest-timeout; the rest travels as CPython 3.12 wheels at requirements.txt's pins (about
# 45 MB; wordfreq as its package with the English, Spanish and German lists alone: its wheel
# is 56 MB). Left out: the files that build the embedded corpus (Debian's synthesizers, the
# Bible, the games), the CPU's C++ kernels, the docs and packaging checks, host memory and the
# CPU's FLOP counts. LIMIT_S (default 480) interrupts pytest, which then still prints the
# failures so far; TESTS and WORKERS override the files and the process count. Writes
# $OUT/pytest.log (default OUT=/tmp/gpu_tests).
set -uo pipefail

# Pinned in requirements.txt (the versions are read from it), then what they need that the
# image lacks, pinned as this machine's venv resolved them.
REQUIRED="array-record espeakng-loader flax importlib_resources jiwer kaldi-native-fbank
  ml_collections optax orbax-checkpoint polib soundfile soxr tensorboardX tensorflow-datasets"
DEPENDENCIES="cffi==2.1.1 dm-tree==0.1.10 docstring_parser==0.18.0 ftfy==6.3.1
  googleapis-common-protos==1.76.0 immutabledict==4.3.1 langcodes==3.5.1 locate==1.1.1
  pycparser==3.12 RapidFuzz==3.14.6 simple-parsing==0.1.9 tensorflow-metadata==1.21.0
  termcolor==3.3.0 toml==0.10.2 wcwidth==0.9.4"
SDISTS="promise==2.3"                      # no wheels on PyPI: built here, with pysword
EXCLUDE="bible_and_synthesizers embedded_corpus ding recorded_speech ur_quan packaging docs
  local_cpu_kernel kernel_cpu_kernel host_memory benchmark_flops benchmark_results"

if [ "${1:-}" = fetch ]; then
  exclude_file=$(git rev-parse --git-path info/exclude)
  grep -qx "/.whl/" "$exclude_file" 2>/dev/null || echo "/.whl/" >> "$exclude_file"
  rm -rf .whl && mkdir -p .whl/site
  platforms=""
  for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 \
             manylinux_2_28 manylinux_2_31 manylinux_2_34; do
    platforms="$platforms --platform ${tag}_x86_64"
  done
  pin() {   # name -> its line in requirements.txt (name==version), or a stop
    grep -iE "^$1==" requirements.txt || { echo "requirements.txt pins no $1" >&2; exit 1; }
  }
  required=$(for name in $REQUIRED; do pin "$name" || exit 1; done) || exit 1
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp $platforms -d .whl $required $DEPENDENCIES || exit 1
  pysword=$(pin pysword) || exit 1
  wordfreq=$(pin wordfreq) || exit 1
  python3 -m pip wheel -q --no-deps -w .whl $SDISTS "$pysword" || exit 1
  rm -rf /tmp/wordfreq_wheel /tmp/wordfreq_pkg
  python3 -m pip download -q --no-deps -d /tmp/wordfreq_wheel "$wordfreq" || exit 1
  python3 -m zipfile -e /tmp/wordfreq_wheel/wordfreq-*.whl /tmp/wordfreq_pkg
  cp -r /tmp/wordfreq_pkg/wordfreq .whl/site/
  find .whl/site/wordfreq/data -type f ! -name '*_en.msgpack.gz' ! -name '*_es.msgpack.gz' \
      ! -name '*_de.msgpack.gz' -delete
  du -sh .whl
  exit 0
fi

OUT=${OUT:-/tmp/gpu_tests}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/.whl/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
pattern=$(echo $EXCLUDE | tr ' ' '|')
TESTS=${TESTS:-$(ls tests/test_*.py | grep -vE "^tests/test_($pattern)\.py$")}
per_test=""
python3 -c "import pytest_timeout" 2> /dev/null && per_test="--timeout 300"
# SIGINT, not SIGTERM: pytest then reports the failures it has seen before it exits.
timeout -s INT "${LIMIT_S:-480}" python3 -m pytest -n "${WORKERS:-14}" --dist loadfile \
    -o addopts="" -p no:cacheprovider -v -rfE --tb=short $per_test $TESTS > "$OUT/pytest.log" 2>&1
echo "pytest: exit status $?"
grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed)" "$OUT/pytest.log" | tail -40
