#!/usr/bin/env bash
# Builds trainrun on a GPU machine against the PyTorch installed there, runs the
# GPU tests and the one-GPU throughput benchmark. For a machine that reaches no
# package registry: the Debian packages of tools/gpu/packages.txt come along as
# .deb files in .gpu/ (tools/gpu/fetch.sh, run where apt works; copy .gpu/ to the
# GPU machine) and are unpacked under .gpu-work/root, never /. From the
# repository's root:
#   tools/gpu/run.sh [STAGE...]
#
# Stages, in the order given: build (what the GPU tests and the benchmark
# need; TRAINRUN_GPU_CXXFLAGS=-g for line numbers), test (the GPU tests),
# all-tests (builds the rest, runs the whole suite), bench, debug (the GPU
# tests, or those matching TRAINRUN_GPU_DEBUG_CASES, with a stack printed by
# every process that crashes; it reports, it does not fail); by default build
# test bench; compression (bf16 gradient compression against none, one worker)
# runs only when named. TRAINRUN_GPU_BENCH_ROUNDS (5) and TRAINRUN_GPU_BENCH_ARGS
# (such as --trainer or --all-sides) shape the bench. TRAINRUN_GPU_DEADLINE_S
# bounds the whole call (a device session's limit less a margin): the bench
# takes the time left but TRAINRUN_GPU_TEST_RESERVE_S (180) when a test stage
# comes after it, and starts no round it cannot finish; ctest starts no test
# past the deadline. The unpacked packages and the build stay in $TRAINRUN_GPU_WORK
# (.gpu-work, ignored), so a later call skips what is done. Logs go to $OUT
# where it is set, else .gpu-work/out.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
if (($#)); then stages=("$@"); else stages=(build test bench); fi
work=${TRAINRUN_GPU_WORK:-$repo/.gpu-work}
out=${OUT:-$work/out}
mkdir -p "$out"
root=$work/root
build=$work/build
python=${PYTHON:-python3}
jobs=$(nproc)

deadline=""
if [[ -n ${TRAINRUN_GPU_DEADLINE_S:-} ]]; then
  deadline=$(($(date +%s) + TRAINRUN_GPU_DEADLINE_S))
fi
seconds_left() { echo $((deadline - $(date +%s))); }

stage_start() { echo "== $1 ($(date +%T))"; SECONDS=0; }
stage_end() { echo "== $1 took ${SECONDS}s"; }

failed=()
echo "== machine"
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH=$PATH:/usr/local/cuda/bin
uname -srm
(. /etc/os-release && echo "$PRETTY_NAME") || true
ldd --version | sed -n 1p  # reads it all: head would SIGPIPE ldd under pipefail
g++ --version | sed -n 1p || { echo "run: no g++ here" >&2; exit 1; }
cmake --version | sed -n 1p || { echo "run: no cmake here" >&2; exit 1; }
nvcc --version | tail -1 || { echo "run: no nvcc here; a CUDA LibTorch's CMake package needs it" >&2; exit 1; }
nvidia-smi -L || echo "run: nvidia-smi found no GPU"
"$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'devices', torch.cuda.device_count(), 'cxx11 ABI', torch.compiled_with_cxx11_abi())"
torch_prefix=$("$python" -c "import torch; print(torch.utils.cmake_prefix_path)")
gpus=$("$python" -c "import torch; print(torch.cuda.device_count())")

# The unpacked Debian tree stands in for /usr: headers and libraries found
# after the compiler's own and after LibTorch's (whose fmt differs from
# Debian's); for the loader only the libraries this machine lacks (the build's
# RUNPATH names the rest); pkg-config reading only its files.
if [[ ! -e $root/.unpacked ]]; then
  "$python" tools/gpu/unpack.py .gpu/debs "$root"
fi
multiarch=$root/usr/lib/x86_64-linux-gnu
export CPLUS_INCLUDE_PATH=$root/usr/include C_INCLUDE_PATH=$root/usr/include
export LIBRARY_PATH=$multiarch
export LD_LIBRARY_PATH=$root/lacking${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_LIBDIR=$multiarch/pkgconfig:$root/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$root
export PATH=$PATH:$root/usr/bin  # ninja and pkg-config where the machine has none
data=$root/usr/share/datasets/fashion-mnist
export FASHION_MNIST_DIR=$data  # for the GPU tests and the benchmark

# The GPU tests (test_gpu and the plugins it runs) and the benchmark's plugin.
gpu_targets=(trainrun trainrun-worker test_gpu ddp_plugin trainer_plugin quickstart fashion_mnist
             lightning_fashion_mnist)

for ((i = 0; i < ${#stages[@]}; i++)); do
  stage=${stages[i]}
  case $stage in
    build)
      stage_start build
      # The linker finds the unpacked libraries that others need (libspdlog for
      # libtrainrun) only through -rpath-link: LIBRARY_PATH serves -l alone.
      link_flags="-Wl,-rpath-link,$multiarch"
      # libcurl: the machine's own shared one where it has one (Debian's needs
      # libraries of Debian's, its libldap among them), with the unpacked headers.
      curl_args=()
      for lib in /usr/lib/x86_64-linux-gnu/libcurl.so.4 /lib/x86_64-linux-gnu/libcurl.so.4 \
                 /usr/lib64/libcurl.so.4; do
        if [[ -e $lib ]]; then
          curl_args=(-DCURL_LIBRARY="$lib" -DCURL_INCLUDE_DIR="$root/usr/include")
          echo "build: libcurl from $lib"
          break
        fi
      done
      # No precompiled headers: on 16 cores each one's build would be a serial
      # step ahead of files that then compile in one or two waves.
      cmake -S . -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$torch_prefix;$root/usr" "${curl_args[@]}" \
        -DTRAINRUN_PRECOMPILE_HEADERS=OFF \
        -DCMAKE_EXE_LINKER_FLAGS="$link_flags" -DCMAKE_SHARED_LINKER_FLAGS="$link_flags" \
        -DCMAKE_MODULE_LINKER_FLAGS="$link_flags" -DCMAKE_CXX_FLAGS="${TRAINRUN_GPU_CXXFLAGS:-}" \
        -DTRAINRUN_CHART_JS="$(ls "$root"/usr/share/javascript/chart.js/chart.{umd,min}.js \
                               2>/dev/null | head -1)" \
        > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
      grep -E "^-- (Found|Torch|trainrun)" "$out/configure.log" || true
      bound=()
      if [[ -n $deadline ]]; then
        left=$(seconds_left)
        bound=(timeout $((left > 1 ? left : 1)))
      fi
      "${bound[@]}" cmake --build "$build" -j"$jobs" --target "${gpu_targets[@]}" \
        > "$out/build.log" 2>&1 \
        || { grep -E -A5 "error|FAILED" "$out/build.log" | head -80; tail -3 "$out/build.log"; exit 1; }
      echo "build: $(grep -c 'warning:' "$out/build.log" || true) warnings"
      stage_end build
      ;;
    test)
      stage_start test
      rc=0
      stop=()
      if [[ -n $deadline ]]; then
        if (($(seconds_left) < 30)); then
          echo "test: $(seconds_left) s left before TRAINRUN_GPU_DEADLINE_S: not run"
          failed+=(test-no-time)
          stage_end test
          continue
        fi
        # A time of day, in UTC as ctest runs below: CTest 3.25 reads one with a zone
        # as none, and applies the local zone's offset in whole hours.
        stop=(--stop-time "$(TZ=UTC date -d "@$deadline" +%T)")
      fi
      # One GPU is shared: the cases run 4 at a time (each needs at most 2 ranks).
      TZ=UTC ctest --test-dir "$build" -L gpu -j4 --output-on-failure "${stop[@]}" \
        > "$out/gpu_tests.log" 2>&1 || rc=$?
      grep -E "Test +#|tests passed|skipped:|ERROR|CHECK" "$out/gpu_tests.log" || true
      echo "test: ctest exited $rc"
      ((rc == 0)) || failed+=(test)
      # A GPU here and a case that saw none: the tests did not reach it.
      if ((gpus > 0)) && grep -qE "skipped: (no CUDA device|.*this machine has 0)" \
           "$out/gpu_tests.log"; then
        echo "test: torch sees $gpus GPU(s) but a GPU test saw none" >&2
        failed+=(test-saw-no-gpu)
      fi
      stage_end test
      ;;
    all-tests)  # the whole suite, CPU tests included
      stage_start all-tests
      cmake --build "$build" -j"$jobs" >> "$out/build.log" 2>&1 \
        || { grep -E -A5 "error|FAILED" "$out/build.log" | head -80; exit 1; }
      rc=0
      ctest --test-dir "$build" --output-on-failure -j"$jobs" > "$out/all_tests.log" 2>&1 || rc=$?
      grep -E "tests passed|\(Failed|\(Timeout|Not Run" "$out/all_tests.log" || true
      echo "all-tests: ctest exited $rc"
      ((rc == 0)) || failed+=(all-tests)
      stage_end all-tests
      ;;
    bench)
      stage_start bench
      torchrun_script=$(dirname "$(command -v "$python")")/torchrun
      [[ -x $torchrun_script ]] || torchrun_script=torchrun
      budget=()
      if [[ -n $deadline ]]; then
        # A later test stage keeps its reserve, cut down to 90 s when the bench
        # would get less than a round and a half (about 150 s).
        reserve=0
        for later in "${stages[@]:i+1}"; do
          [[ $later == test ]] && reserve=${TRAINRUN_GPU_TEST_RESERVE_S:-180}
        done
        left=$(seconds_left)
        if ((left - reserve < 150 && reserve > 90)); then
          reserve=$((left - 150 > 90 ? left - 150 : 90))
        fi
        budget=(--budget $((left - reserve)))
        if ((budget[1] < 90)); then
          echo "bench: ${budget[1]} s left for it before TRAINRUN_GPU_DEADLINE_S: not run"
          failed+=(bench-no-time)
          stage_end bench
          continue
        fi
        echo "bench: a budget of ${budget[1]} s, $reserve s kept for the tests"
      fi
      # trainrun, torchrun + DDP and plain PyTorch (a DataLoader, resident data,
      # a CUDA graph), interleaved, at batch 128 and 512; TRAINRUN_GPU_BENCH_ARGS
      # adds to them (--trainer: train::Trainer eager and captured too).
      # Into the log, not through tee: a stop signalled to the whole group would
      # end tee before the bench prints the rounds it completed.
      rc=0
      # shellcheck disable=SC2086
      "$python" tools/bench/gpu_step.py --build "$build" --rounds "${TRAINRUN_GPU_BENCH_ROUNDS:-5}" \
        --data-dir "$data" --torchrun "$torchrun_script" --python "$python" "${budget[@]}" \
        ${TRAINRUN_GPU_BENCH_ARGS:-} > "$out/bench.log" 2>&1 || rc=$?
      cat "$out/bench.log"
      ((rc == 0)) || failed+=(bench)
      stage_end bench
      ;;
    compression)  # bf16 gradient compression against none; one rank has nothing to save
      stage_start compression
      "$python" tools/bench/ddp_throughput.py --build "$build" --gpu --rounds 2 \
        --compression bf16 --skip-torchrun --data-dir "$data" 2>&1 | tee "$out/compression.log" \
        || failed+=(compression)
      stage_end compression
      ;;
    debug)  # the GPU cases again, each process that crashes printing its stack
      stage_start debug
      command -v gcc >/dev/null || { echo "run: no gcc here for tools/gpu/backtrace.c" >&2; exit 1; }
      gcc -shared -fPIC -O1 -o "$work/backtrace.so" tools/gpu/backtrace.c
      for binary in "$build/trainrun-worker" "$build/tests/test_gpu"; do
        echo "$binary loads:"
        ldd "$binary" | grep -E "stdc\+\+|libgcc_s|torch_cpu|spdlog|fmt" || true
      done
      LD_PRELOAD=$work/backtrace.so ctest --test-dir "$build" -L gpu -j4 \
        ${TRAINRUN_GPU_DEBUG_CASES:+-R "$TRAINRUN_GPU_DEBUG_CASES"} --output-on-failure \
        2>&1 | "$python" tools/gpu/symbolize.py > "$out/debug.log" || true
      # The smallest run on the GPU: a model, no data loader.
      LD_PRELOAD=$work/backtrace.so "$build/trainrun" --plugin \
        "$build/examples/quickstart/libquickstart.so" -n 1 --use-gpu \
        --storage-path "$work/debug-results" 2>&1 | "$python" tools/gpu/symbolize.py \
        >> "$out/debug.log" || true
      grep -E "Test +#|tests passed|trainrun\] (run|rank)" "$out/debug.log" || true
      grep -E -A30 "backtrace.c: signal" "$out/debug.log" | grep -E "=>|signal" | head -120 || true
      stage_end debug
      ;;
    *) echo "run: unknown stage $stage (build, test, all-tests, bench, compression, debug)" >&2
       exit 2 ;;
  esac
done
if ((${#failed[@]})); then
  echo "run: failed: ${failed[*]}" >&2
  exit 1
fi
echo "run: every stage passed"
