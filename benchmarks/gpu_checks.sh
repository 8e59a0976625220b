#!/usr/bin/env bash
# One GPU-machine call: re-verify the CUDA paths, then measure. Each step has its own time limit and
# writes under $OUT, so a slow step costs only itself. Steps: a comma list in $1 (default: all).
#   bash benchmarks/gpu_checks.sh verify,e2e,trace,dask
set -u
DASK_FLAGS=${DASK_FLAGS:-}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
steps=",${1:-verify,e2e,trace,dask},"  # also: h2d, recenter, recenter_cost, launch, tune_gpu, tune_gpu_conv, plans, fused_tma, conv_gpu, gpudecode
want() { [[ $steps == *",$1,"* ]]; }
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
# SEED_TUNING=1: start from the tuned winners a previous call recorded (results/autotune-<gpu>.json) instead of
# re-tuning every shape class on a fresh machine (1-2.5 min per benchmark); keys not in it are tuned as usual.
if [[ ${SEED_TUNING:-0} == 1 && -n ${TSCONV_CACHE_DIR:-} ]]; then
  seed="benchmarks/results/autotune-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1 | tr ' ' '_').json"
  mkdir -p "$TSCONV_CACHE_DIR"
  [[ -f $seed && ! -f $TSCONV_CACHE_DIR/$(basename "$seed") ]] && cp "$seed" "$TSCONV_CACHE_DIR/" && echo "seeded $seed"
fi
if want verify; then
  run 150 pytest_gpu python -m pytest -q -m gpu tests/test_head.py -x -p no:cacheprovider
  run 120 batched_check python benchmarks/gpu_batched_check.py --out "$OUT/gpu_batched_check.json"
fi
if want recenter; then  # conv1d's recenter on the real kernels, then the engine against the CPU engine
  run 200 pytest_recenter python -m pytest -q tests/kernels/test_recenter.py -x -p no:cacheprovider
  run "${ENGINE_LIMIT:-330}" engine_check python benchmarks/gpu_engine_check.py \
    --pipelines "${ENGINE_PIPELINES:-default,trend_ema,multiscale,dense_head}" --out "$OUT/gpu_engine_check.json"
fi
if want recenter_cost; then
  run 200 recenter_cost python benchmarks/recenter_cost.py --out "$OUT/recenter_cost.json"
fi
if want launch; then  # where a small conv1d call's host time goes (TMA calls: 0.34-0.55 ms, NOTES.md)
  run 240 launch_conv1d python benchmarks/launch_profile.py --op conv1d --calls 500 \
    --out "$OUT/launch_profile_conv1d.txt"
fi
if want tune_gpu; then  # the opt-in GPU-time tuner: its tests, then gemm tuned with it
  run 60 pytest_tuner python -m pytest -q tests/kernels/test_conv1d.py -k "gpu_ms or tuner" -p no:cacheprovider
  TSCONV_TUNE_TIMING=gpu run 200 gemm_gputime python benchmarks/gemm.py --budget-s 170 --out "$OUT/gemm_gputime.json"
fi
if want tune_gpu_conv; then  # conv1d tuned with the opt-in GPU-time tuner
  TSCONV_TUNE_TIMING=gpu run 330 conv1d_gputime python benchmarks/conv1d.py --budget-s 300 --no-subprocess \
    --out "$OUT/conv1d_gputime.json"
fi
if want conv_gpu; then  # conv1d's GPU tests (dense pointer and TMA kernels, depthwise, recenter)
  run 200 pytest_conv1d python -m pytest -q -m gpu tests/kernels/test_conv1d.py -p no:cacheprovider
fi
if want plans; then  # launch plans on the GPU: conv1d (dense, and the direct/bank/window ones behind
  # _DIRECT_PLANS_CUDA, which their test switches on) and gemm; replays must equal the full path bit for bit
  run 200 pytest_plans python -m pytest -q tests/kernels/test_conv1d.py tests/kernels/test_gemm.py -k plan \
    -p no:cacheprovider
fi
if want fused_tma; then  # the fused kernel's TMA variant (opt-in, TSCONV_FUSED_TMA=1): its tests, then fused.py
  TSCONV_FUSED_TMA=1 run 240 pytest_fused_tma python -m pytest -q tests/kernels/test_fused.py -k tma -p no:cacheprovider
  TSCONV_FUSED_TMA=1 run $((${FUSED_BUDGET:-300} + 30)) fused_tma python benchmarks/fused.py --budget-s "${FUSED_BUDGET:-300}" \
    --out "$OUT/fused_tma.json"
fi
if want gpudecode; then  # Blosc-LZ4 decoded on the GPU: tests, the decoder alone, then the engine with it
  run 120 pytest_gpudecode python -m pytest -q tests/kernels/test_blosc_lz4.py tests/test_gpudecode.py \
    tests/kernels/test_autotune_check.py tests/kernels/test_launch.py -p no:cacheprovider
  S=/tmp/tsconv-e2e/ticks_1048576x1024_16mb.zarr
  [[ -d $S ]] || run 60 gen_store python -c "from tsconv.synth import make_ticks; make_ticks('$S', rows=1<<20, features=1024)"
  run 120 gpu_decode python benchmarks/gpu_decode.py --store "$S" --batch 32 --repeats 3 --out "$OUT/gpu_decode.json"
  run 200 engine_gpu_decode python benchmarks/engine_gpu_decode.py --repeats 3 --threads 16 \
    --out "$OUT/engine_gpu_decode.json"
fi
if want h2d; then
  run 60 h2d python benchmarks/h2d_call.py --out "$OUT/h2d_call.json"
fi
if want e2e; then
  run 240 e2e python benchmarks/e2e.py --quick --sections gen,check,modes --out "$OUT/e2e_quick.json"
fi
if want trace; then
  run 200 trace python benchmarks/engine_trace.py --out "$OUT/engine_trace.json" \
    --repeats 3 \
    --variants "${TRACE_VARIANTS:-default,nommap,threads12,threads14,nice19,ring8,ring16,prefetch32,step16384,headauto,headgemm,headfused}"
fi
if want dask; then
  run 90 dask_small python benchmarks/gpu_dask_check.py $DASK_FLAGS --out "$OUT/gpu_dask_check.json"
  run 150 dask_big python benchmarks/gpu_dask_check.py $DASK_FLAGS \
    --src /tmp/tsconv-e2e/ticks_1048576x1024_16mb.zarr --pipeline /tmp/tsconv-e2e/pipe/e2e_1024.toml \
    --out "$OUT/gpu_dask_check_big.json"
fi
