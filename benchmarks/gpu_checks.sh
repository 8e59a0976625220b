#!/usr/bin/env bash
# One GPU-machine call: re-verify the CUDA paths, then measure. Each step has its own time limit and
# writes under $OUT, so a slow step costs only itself. Steps: a comma list in $1 (default: verify,e2e,trace,dask).
#   bash benchmarks/gpu_checks.sh verify,e2e,trace,dask
# Claims re-checked: the CUDA paths pass their GPU tests (pytest -m gpu), and the engine's timings in
# benchmarks/NOTES.md still hold on this machine (e2e, engine_trace, dask, fused, gpu_decode).
set -u
DASK_FLAGS=${DASK_FLAGS:-}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
steps=",${1:-verify,e2e,trace,dask},"  # also: recenter, plans, fused, conv_gpu, gpudecode
want() { [[ $steps == *",$1,"* ]]; }
tests_named() { for n; do find tests -name "$n" -print; done; }  # test files wherever tests/ keeps them
# The device tool returns at most 8 files: every step logs into one file.
run() {  # run LIMIT NAME CMD...: append to $OUT/log.txt, say how it went
  local limit=$1 name=$2
  shift 2
  local t0=$SECONDS
  echo "===== $name: $*" >>"$OUT/log.txt"
  timeout "$limit" "$@" >"$OUT/step.log" 2>&1
  local rc=$?
  cat "$OUT/step.log" >>"$OUT/log.txt"
  echo "[$name] rc=$rc $((SECONDS - t0)) s"
  grep -v "distributed\." "$OUT/step.log" | tail -n 4
  rm -f "$OUT/step.log"
}
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
# SEED_TUNING=1: start from the tuned winners shipped with tsconv (tsconv/kernels/tuned/autotune-<gpu>.json) instead of
# re-tuning every shape class on a fresh machine (1-2.5 min per benchmark); keys not in it are tuned as usual.
if [[ ${SEED_TUNING:-0} == 1 && -n ${TSCONV_CACHE_DIR:-} ]]; then
  seed="tsconv/kernels/tuned/autotune-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1 | tr ' ' '_').json"
  mkdir -p "$TSCONV_CACHE_DIR"
  [[ -f $seed && ! -f $TSCONV_CACHE_DIR/$(basename "$seed") ]] && cp "$seed" "$TSCONV_CACHE_DIR/" && echo "seeded $seed"
fi
if want verify; then
  # the head paths, then the engine against the CPU engine and float64 (the prepare kernel bit for bit)
  run 330 pytest_gpu python -m pytest -q -m gpu $(tests_named test_head.py test_gpu_engine.py) -x -p no:cacheprovider
fi
if want recenter; then  # conv1d's recenter on the real kernels, then the engine against the CPU engine
  run 200 pytest_recenter python -m pytest -q tests/kernels/test_recenter.py -x -p no:cacheprovider
  run "${ENGINE_LIMIT:-330}" engine_check python -m pytest -q -m gpu $(tests_named test_gpu_engine.py) \
    -k cuda_engine_matches -p no:cacheprovider
fi
if want conv_gpu; then  # conv1d's GPU tests (dense pointer and TMA kernels, depthwise, recenter)
  run 200 pytest_conv1d python -m pytest -q -m gpu tests/kernels/test_conv1d.py -p no:cacheprovider
fi
if want plans; then  # launch plans on the GPU: conv1d (dense, direct, bank, window) and gemm; replays must
  # equal the full path bit for bit
  run 200 pytest_plans python -m pytest -q tests/kernels/test_conv1d.py tests/kernels/test_gemm.py -k plan \
    -p no:cacheprovider
fi
if want fused; then  # the fused conv -> head kernel (its TMA variant, the default on sm_90): its tests, then fused.py
  run 240 pytest_fused python -m pytest -q tests/kernels/test_fused.py -k tma -p no:cacheprovider
  run $((${FUSED_BUDGET:-300} + 30)) fused python benchmarks/fused.py --budget-s "${FUSED_BUDGET:-300}" \
    --out "$OUT/fused.json"
fi
if want gpudecode; then  # Blosc-LZ4 decoded on the GPU: tests, then the decoder alone
  run 120 pytest_gpudecode python -m pytest -q $(tests_named test_blosc_lz4.py test_gpudecode.py \
    test_autotune_check.py test_launch.py) -p no:cacheprovider
  S=/tmp/tsconv-e2e/ticks_1048576x1024_16mb.zarr
  [[ -d $S ]] || run 60 gen_store python -c "from tsconv.synth import make_ticks; make_ticks('$S', rows=1<<20, features=1024)"
  run 120 gpu_decode python benchmarks/gpu_decode.py --store "$S" --batch 32 --repeats 3 --out "$OUT/gpu_decode.json"
fi
if want e2e; then
  run 240 e2e python benchmarks/e2e.py --quick --sections gen,check,modes --out "$OUT/e2e_quick.json"
fi
if want trace; then
  run 200 trace python benchmarks/engine_trace.py --out "$OUT/engine_trace.json" \
    --repeats 3 \
    --variants "${TRACE_VARIANTS:-default,cpudecode,nommap,threads12,threads14,ring8,ring16,prefetch32,step16384,headauto,headgemm,headfused}"
fi
if want dask; then
  run 90 dask_small python benchmarks/gpu_dask_check.py $DASK_FLAGS --out "$OUT/gpu_dask_check.json"
  run 150 dask_big python benchmarks/gpu_dask_check.py $DASK_FLAGS \
    --src /tmp/tsconv-e2e/ticks_1048576x1024_16mb.zarr --pipeline /tmp/tsconv-e2e/pipe/e2e_1024.toml \
    --out "$OUT/gpu_dask_check_big.json"
fi
