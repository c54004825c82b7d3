#!/usr/bin/env bash
# Benchmarks on a GPU machine without internet (the H200 of docs/benchmarks.md).
# Usage, from the repository root, with the web stack on PYTHONPATH (see docs/benchmarks.md):
#   OUT=results bash loadtests/gpu/run.sh VARIANT...
# Variants: nf4, int8, nf4-head (bitsandbytes weights on the fast engine, with lm_head quantized
# too for nf4-head); the small-GPU configurations of issue 37, each under its memory cap:
# nf4-16g (nf4 and its output layer, float16, HYMT_GPU_MEMORY_GIB=16), int8-16g, bf16-24g,
# nf4-16g-cc75 (nf4-16g with the compute-capability-7.5 kernels forced, a T4's); profile (loadtests.profile: the engine alone, lone
# and loaded, with a torch.profiler trace of one lone request), ipc (loadtests.ipc: the process
# split's own cost, to an engine that answers at once), overload (queue bound 512: a flood of
# 4,096 requests at once (QUEUE sets the bound) with /health polled, then goodput at RATE
# requests/s, default 85, under a DEADLINE, default 5 s).
# flood (issue 36: the 4,096-request flood at a queue bound of QUEUE, default 512, from 8 client
# processes into a canned responder, the machine's floor, then into the service's front door alone
# (loadtests.canned --doorway), then into the service with its default settings, one command,
# after loadtests.doorway's CPU a connection costs at the door on the machine's cores;
# FLOOD_CPUS=CLIENT:SERVICE, e.g. 0-7:8-15, keeps the clients off the servers' cores, and the
# service then picks its API processes from the cores it is given); fast (the fast engine through HTTP, plus the naive baseline), fast-fp8 (its FP8 weights),
# fast-profile / fast-profile-fp8 / fast-profile-nf4-16g (loadtests.profile on the fast engine, the
# last in nf4-16g's configuration, with SERVICE_ENV's settings too; WINDOW_AFTER=S profiles
# the loaded steps' kernels for 2 s from S s into its throughput phase), fidelity-float32 /
# fidelity-bfloat16, fidelity-nf4, fidelity-int8 (loadtests.fidelity: TEXTS texts alone and in a CROWD,
# against generate() on the same weights; nf4 and int8 in float16, as issue 37 asks; FIDELITY_ARGS=
# --dequantized-reference runs generate() over the dequantized weights instead, the numbers the engine
# multiplies, where bitsandbytes' own int8 forward rounds the activations to int8 as well),
# smoke (the demo model in bf16, nf4, int8 and fp8 (SMOKE_QUANTS, default "none nf4 int8 fp8") through the fast engine's GPU code without
# inductor, 8 texts alone and among 48 against generate(): a crash shows in seconds, first),
# kernels (loadtests.kernels: decode attention and one-row projections alone, in CUDA graphs;
# KERNEL_ARGS=--gemv-sweep adds every block size of the one-row kernel); quant-kernels
# (loadtests.quant_kernels: one layer's products in bf16, nf4, int8, int4 by tinygemm and by
# bitsandbytes' own kernels, at 1 to 1,024 rows; QUANT_ARGS="--rows-sweep" adds every tile of the batch kernel, "--gemv-sweep" every block size of the one-row kernel).
# stream (loadtests.streaming: time to first token and to the full text of a 2,000-word document
# through POST /translate/stream), replicas (loadtests.replicas: REPLICAS services, one per GPU, behind
# the shipped nginx and Redis, REQUESTS concurrent clients, a flood of FLOOD at a queue bound of QUEUE,
# then one replica alone; needs loadtests/gpu/add-stack.sh); cpu-7b (issue 37's CPU fallback: the dummy 7B in
# bf16 on the machine's CPU cores, 4 requests at once and LONE alone, 16 tokens each; it leaves the GPU
# alone, so it may run beside a GPU variant: start it in the background with its own OUT and WORK). For the bench variants CONCURRENCY
# (default REQUESTS) keeps that many requests in flight: a steady state when REQUESTS is larger. Each writes VARIANT.json and VARIANT.log. SERVICE_ENV="NAME=VALUE ..." adds settings to every
# service the bench variants start.
set -uo pipefail
out=${OUT:?set OUT}; work=${WORK:-/tmp/hymt-bench}; mkdir -p "$work" "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
service_env=(--env HYMT_LOAD_FORMAT=dummy --env HYMT_CACHE_SIZE=0 --env HYMT_DATA_DIR="$work/data"
             --env HYMT_MAX_QUEUE_SIZE=4096)
for setting in ${SERVICE_ENV:-}; do service_env+=(--env "$setting"); done  # e.g. SERVICE_ENV="HYMT_X=1"
common=("${service_env[@]}" --out "$work")
requests=${REQUESTS:-1024}
for variant in "$@"; do
  echo "=== $variant $(date +%T)"
  if [ "$variant" = profile ]; then  # the engine without HTTP, and a torch.profiler trace
    HYMT_LOAD_FORMAT=dummy HYMT_DATA_DIR="$work/data" timeout "${VARIANT_TIMEOUT:-280}" \
      python3 -m loadtests.profile --requests "$requests" --report "$work/$variant.json" \
      > "$work/$variant.out" 2>&1
    echo "exit $?"; cat "$work/$variant.json" 2>/dev/null || tail -c 3000 "$work/$variant.out"
    cp "$work/$variant.json" "$out/" 2>/dev/null; continue
  fi
  if [ "$variant" = smoke ]; then  # every weight format's code on the GPU in seconds: the demo model
    for quant in ${SMOKE_QUANTS:-none nf4 int8 fp8}; do  # (the real architecture, tiny), nothing compiled by inductor
      HYMT_QUANTIZATION=$quant HYMT_FAST_COMPILE=off HYMT_FAST_MAX_ROWS=64 HYMT_DATA_DIR="$work/data" \
        timeout "${VARIANT_TIMEOUT:-120}" python3 -m loadtests.fidelity --texts 8 --crowd 48 \
        --max-new-tokens 24 --report "$work/smoke-$quant.json" > "$work/smoke-$quant.out" 2>&1
      echo "$quant exit $?"; grep -E '^(alone:|crowd:) ' "$work/smoke-$quant.out"
      tail -n 3 "$work/smoke-$quant.out" | cut -c1-400; cp "$work/smoke-$quant.json" "$out/" 2>/dev/null
    done; continue
  fi
  if [ "${variant#fidelity-}" != "$variant" ]; then  # loadtests.fidelity: fast engine vs generate()
    dtype=${variant#fidelity-}; quant=none
    case $dtype in nf4|int8) quant=$dtype; dtype=float16 ;; esac  # bitsandbytes' weights, float16
    HYMT_QUANTIZATION=$quant HYMT_DTYPE=$dtype HYMT_LOAD_FORMAT=dummy HYMT_DATA_DIR="$work/data" timeout "${VARIANT_TIMEOUT:-280}" \
      python3 -m loadtests.fidelity --texts "${TEXTS:-64}" --crowd "${CROWD:-1000}" ${FIDELITY_ARGS:-} --report "$work/$variant.json" \
      --reference-cache "$work/$variant.reference.pt" > "$work/$variant.out" 2>&1
    # (a cut-off run, repeated, reads transformers' side back; each phase reports as it ends)
    rc=$?; grep -E '^(reference|engine ready|alone:|crowd:) ' "$work/$variant.out"
    echo "exit $rc"; cat "$work/$variant.json" 2>/dev/null || tail -c 3000 "$work/$variant.out"
    cp "$work/$variant.json" "$out/" 2>/dev/null; continue
  fi
  if [ "${variant#fast-profile}" != "$variant" ]; then  # the fast engine alone (bf16, or -fp8)
    quant=none; [ "$variant" = fast-profile-fp8 ] && quant=fp8
    small=(); [ "$variant" = fast-profile-nf4-16g ] && quant=nf4 && small=(HYMT_QUANTIZE_LM_HEAD=true
      HYMT_DTYPE=float16 HYMT_GPU_MEMORY_GIB=16)  # nf4-16g's configuration, the engine alone
    env ${SERVICE_ENV:-} "${small[@]}" HYMT_ENGINE=fast HYMT_QUANTIZATION=$quant HYMT_LOAD_FORMAT=dummy HYMT_DATA_DIR="$work/data" timeout "${VARIANT_TIMEOUT:-280}" \
      python3 -m loadtests.profile --requests "$requests" --concurrency "${CONCURRENCY:-0}" --lone "${LONE:-6}" --report "$work/$variant.json" --trace "$work/$variant.kernels.json" \
      ${WINDOW_AFTER:+--window-after "$WINDOW_AFTER"} \
      > "$work/$variant.out" 2>&1
    echo "exit $?"; cat "$work/$variant.json" 2>/dev/null || tail -c 3000 "$work/$variant.out"
    grep -E '"(fast engine ready|decode graphs captured|decode compiled|kv cache allocated|decode attention measured)"' "$work/$variant.out" | cut -c1-600
    cp "$work/$variant.json" "$work/$variant.kernels.json" "$out/" 2>/dev/null; continue
  fi
  if [ "$variant" = stream ]; then  # loadtests.streaming: a 2,000-word document streamed
    timeout "${VARIANT_TIMEOUT:-280}" python3 -m loadtests.streaming --label stream \
      "${common[@]}" > "$work/stream.out" 2>&1
    echo "exit $?"; cat "$work/stream.json" 2>/dev/null || tail -c 3000 "$work/stream.out"
    cp "$work/stream.json" "$out/" 2>/dev/null; continue
  fi
  if [ "$variant" = quant-kernels ]; then  # loadtests.quant_kernels: a layer's products by weight format
    timeout "${VARIANT_TIMEOUT:-280}" python3 -m loadtests.quant_kernels ${QUANT_ARGS:-} --report "$work/quant-kernels.json" > "$work/quant-kernels.out" 2>&1
    echo "exit $?"; cat "$work/quant-kernels.json" 2>/dev/null || tail -c 3000 "$work/quant-kernels.out"
    cp "$work/quant-kernels.json" "$out/" 2>/dev/null; continue
  fi
  if [ "$variant" = kernels ]; then  # loadtests.kernels: decode kernels alone, in CUDA graphs
    timeout "${VARIANT_TIMEOUT:-280}" python3 -m loadtests.kernels ${KERNEL_ARGS:-} --report "$work/kernels.json" > "$work/kernels.out" 2>&1
    echo "exit $?"; cat "$work/kernels.json" 2>/dev/null || tail -c 3000 "$work/kernels.out"
    cp "$work/kernels.json" "$out/" 2>/dev/null; continue
  fi
  if [ "$variant" = replicas ]; then  # loadtests.replicas: N replicas behind nginx and Redis, then one
    stack=${STACK:-$PWD/.gpu-site/stack/bin}  # loadtests/gpu/add-stack.sh puts nginx and Redis there
    n=${REPLICAS:-2}; c=${REQUESTS:-2048}
    timeout "${VARIANT_TIMEOUT:-540}" python3 -m loadtests.replicas --out "$work/replicas" \
      --replicas "$n" --devices "${DEVICES:-$(seq -s, 0 $((n - 1)))}" --requests "$c" --concurrency "$c" \
      --flood-requests "${FLOOD:-4096}" --nginx "$stack/nginx" --redis-server "$stack/redis-server" \
      "${service_env[@]}" --env HYMT_MAX_QUEUE_SIZE="${QUEUE:-1024}" > "$work/replicas.out" 2>&1
    echo "exit $?"; cat "$work/replicas/replicas.json" 2>/dev/null || tail -c 3000 "$work/replicas.out"
    cp "$work/replicas/replicas.json" "$out/" 2>/dev/null; continue
  fi
  if [ "$variant" = flood ]; then  # the machine's floor (a canned 429), then the service's defaults
    # FLOOD_CPUS=CLIENT:SERVICE (taskset lists, e.g. 0-7:8-15): every client on the first cores,
    # every server (canned, doorway, the service) on the others, as if the clients were elsewhere.
    on_client=(); on_server=(); cpus_args=()
    if [ -n "${FLOOD_CPUS:-}" ]; then
      on_client=(taskset -c "${FLOOD_CPUS%%:*}"); on_server=(taskset -c "${FLOOD_CPUS##*:}")
      cpus_args=(--client-cpus "${FLOOD_CPUS%%:*}" --service-cpus "${FLOOD_CPUS##*:}")
    fi
    # CPU a connection costs at the door on these cores, without a network (loadtests.doorway).
    timeout 60 python3 -m loadtests.doorway --connections 40000 > "$work/doorway-cpu.json" 2>"$work/doorway-cpu.err"
    cat "$work/doorway-cpu.json"; cp "$work/doorway-cpu.json" "$out/" 2>/dev/null
    "${on_server[@]}" python3 -m loadtests.canned --port 8100 --processes 8 > "$work/canned.out" 2>&1 & canned=$!
    sleep 4
    timeout 120 "${on_client[@]}" python3 -m loadtests.overload --url http://127.0.0.1:8100 --report "$work/flood-canned.json" \
      flood --requests 4096 --processes 8 > "$work/flood-canned.out" 2>&1
    echo "canned exit $?"; kill $canned; wait $canned 2>/dev/null
    cat "$work/flood-canned.json" 2>/dev/null | head -c 1500; cp "$work/flood-canned.json" "$out/" 2>/dev/null
    "${on_server[@]}" python3 -m loadtests.canned --port 8101 --processes 8 --doorway > "$work/doorway.out" 2>&1 & doorway=$!
    sleep 6  # the service's front door alone: uvicorn and the doorway, a door always shut
    timeout 120 "${on_client[@]}" python3 -m loadtests.overload --url http://127.0.0.1:8101 --report "$work/flood-doorway.json" \
      flood --requests 4096 --processes 8 > "$work/flood-doorway.out" 2>&1
    echo "doorway exit $?"; kill $doorway; wait $doorway 2>/dev/null
    grep -E '"(refusal_p50_ms|refusal_p99_ms|health_p99_ms|lost)"' "$work/flood-doorway.json"; cp "$work/flood-doorway.json" "$out/" 2>/dev/null
    timeout "${VARIANT_TIMEOUT:-280}" python3 -m loadtests.bench --label flood --requests 256 --lone-requests 0 \
      --baseline-requests 0 --flood-requests 4096 --flood-processes 8 "${common[@]}" ${cpus_args[@]+"${cpus_args[@]}"} \
      --env HYMT_MAX_QUEUE_SIZE="${QUEUE:-512}" > "$work/flood.out" 2>&1
    echo "exit $?"; grep -E '"(refusal_p50_ms|refusal_p99_ms|health_p99_ms|health_max_ms|lost|by_status|start_to_ready_s)"' "$work/flood.json" || tail -c 3000 "$work/flood.out"
    grep -A5 -E '"(flood_cpu_s|flood_warm_cpu_s)"' "$work/flood.json"  # where the service's cores went
    cp "$work/flood.json" "$out/" 2>/dev/null; continue
  fi
  if [ "$variant" = ipc ]; then
    timeout 120 python3 -m loadtests.ipc --report "$work/ipc.json" > "$work/ipc.out" 2>&1
    echo "exit $?"; cat "$work/ipc.json" 2>/dev/null || tail -c 3000 "$work/ipc.out"
    cp "$work/ipc.json" "$out/" 2>/dev/null; continue
  fi
  case $variant in
    overload)   args=(--env HYMT_MAX_QUEUE_SIZE="${QUEUE:-512}" --baseline-requests 0
                      --flood-requests 4096 --flood-processes "${FLOOD_PROCESSES:-4}" --goodput-rate "${RATE:-85}"
                      --goodput-deadline "${DEADLINE:-5}" --goodput-duration 20) ;;
    fast)       args=(--env HYMT_ENGINE=fast --baseline-requests "${BASELINE:-12}") ;;
    fast-fp8)   args=(--env HYMT_ENGINE=fast --env HYMT_QUANTIZATION=fp8 --baseline-requests 0) ;;
    nf4-head)   args=(--env HYMT_QUANTIZATION=nf4 --env HYMT_QUANTIZE_LM_HEAD=true --baseline-requests 0) ;;
    nf4-16g)    args=(--env HYMT_QUANTIZATION=nf4 --env HYMT_QUANTIZE_LM_HEAD=true --env HYMT_DTYPE=float16
                      --env HYMT_GPU_MEMORY_GIB=16 --baseline-requests 0) ;;
    nf4-16g-cc75) args=(--env HYMT_QUANTIZATION=nf4 --env HYMT_QUANTIZE_LM_HEAD=true --env HYMT_DTYPE=float16
                      --env HYMT_GPU_MEMORY_GIB=16 --env HYMT_FAST_CAPABILITY=7.5 --baseline-requests 0) ;;
    int8-16g)   args=(--env HYMT_QUANTIZATION=int8 --env HYMT_DTYPE=float16 --env HYMT_GPU_MEMORY_GIB=16
                      --baseline-requests 0) ;;
    bf16-24g)   args=(--env HYMT_GPU_MEMORY_GIB=24 --baseline-requests 0) ;;
    cpu-7b)     args=(--env HYMT_DEVICE=cpu --env CUDA_VISIBLE_DEVICES= --env HYMT_DTYPE=bfloat16
                      --env HYMT_FAST_MAX_ROWS=4 --env HYMT_FAST_NUM_PAGES=256 --env HYMT_MAX_NEW_TOKENS=16
                      --env HYMT_REQUEST_TIMEOUT_S=1200 --baseline-requests 0) ;;
    nf4)        args=(--env HYMT_QUANTIZATION=nf4 --baseline-requests 0) ;;
    int8)       args=(--env HYMT_QUANTIZATION=int8 --baseline-requests 0) ;;
    *) echo "unknown variant $variant"; continue ;;
  esac
  n=$requests; [ "$variant" = overload ] && n=256  # its throughput step is only a check
  [ "$variant" = cpu-7b ] && n=4  # the machine's CPU cores: a second a token or so
  timeout "${VARIANT_TIMEOUT:-280}" python3 -m loadtests.bench --label "$variant" --requests "$n" \
    --concurrency "${CONCURRENCY:-$n}" --lone-requests "${LONE:-6}" "${common[@]}" "${args[@]}" > "$work/$variant.out" 2>&1
  echo "exit $?"
  grep -E '"(output_tokens_per_s|steady_output_tokens_per_s|steady_window_s|ms_per_output_token_p50|start_to_ready_s|start_to_first_translation_s|ratio_vs_baseline|weights_bytes|ok|refused_p99_s|peak_running|loaded_mean_running|loaded_device_busy|warm_connections|refusal_p50_ms|refusal_p99_ms|health_p99_ms|health_max_ms|lost|goodput_share_of_admitted)"' "$work/$variant.json" || tail -c 3000 "$work/$variant.out"
  grep -A5 '"throughput_cpu_s"' "$work/$variant.json"; grep -A7 '"loaded_shares"' "$work/$variant.json"
  # What the engine fitted (rows, pages, its budget, the step times it measured): in the log only.
  # The allocator's reserved and allocated memory after each start phase (memory budget, kv
  # cache and its second fit, decode graphs, prefill graphs, ready): where the workspace the fit
  # set aside went.
  grep -E '"message":"(memory budget|kv cache allocated|kv cache sized again|decode graphs captured|prefill graphs captured|fast engine ready|decode rows or prefill chunk lowered)' \
    "$work/$variant.log" 2>/dev/null | cut -c1-1500
  grep -vE '"service.frontend.access"' "$work/$variant.log" 2>/dev/null | tail -n 15 | cut -c1-400
  cp "$work/$variant.json" "$out/" 2>/dev/null  # written after every step: partial results survive
done
tar czf "$out/bench.tgz" -C "$work" --exclude=data .
