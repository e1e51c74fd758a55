#!/usr/bin/env bash
# Issue #43's GPU cells in one run, for a lent GPU machine (at most TOTAL=570 s), the cells
# the bar needs first. Parts, in the default order (seconds each took on an H200
# on 2026-11-28, BENCHMARKS.md's "Issue #43's GPU run"):
#   gpu_tests          tests/test_static_steps_gpu.py, tests/test_moe_gpu.py and tests/test_upstream_numerics.py
#                      (`pytest -m gpu`): real CUDA graphs against the eager paths on the
#                      official-tiny fixtures, token for token and pass for pass; MoE grouped
#                      GEMMs against the loop; Dream in bf16 against transformers' Qwen2 (36 s
#                      before the compiled and full-pass tests were added: at most 180 s)
#   compiled           `bench static-steps` at LLaDA-8B's full shape in bfloat16, one row, the
#                      dual reuse step and the full step under dynamic, graphs and compiled
#                      (the pass compiled by torch.compile, then captured: fused norms, rotary
#                      and casts; not run yet, nor has inductor compiled a 32-layer pass
#                      there: at most 200 s; a part stopped mid-run keeps its steps so far
#                      in its JSON, `partial_repeat`)
#   compiled16         not in the default order: the same at 16 rows
#   compiled_f32       the same at 4 layers in float32: compiled's tokens against dynamic's
#   step_profile       `bench step-profile` at LLaDA-8B's shape in bfloat16: the one-row dual
#                      reuse step's kernels by category, and its wall time under static,
#                      graphs and compiled (not run yet; an estimated 40 s without compiled)
#   step_profile_none  the same for the one-row step without a cache, a full pass over 512
#                      tokens (against which Fast-dLLM's `none` is compared; not run yet)
#   fastdllm           `bench fastdllm` (bench/.fastdllm/ exported here and carried along):
#                      Fast-dLLM's own LLaDA generate against ours, 1 row (4 of 6 cells in 120 s;
#                      ours under auto: graphs, now for none's full passes too)
#   decode_modes       `bench decode-modes`: whole threshold-rule decodes (1 and 16 rows,
#                      prefix, dual and none) under dynamic, static and graphs (not run yet; at
#                      most 150 s: the JSON keeps each cell as it ends)
#   static_steps_bf16  `bench static-steps` at LLaDA-8B's full shape in bfloat16, 1 and 16 rows:
#                      cache none / prefix / dual under dynamic, static and graphs (117 s)
#   static_steps_f32   `bench static-steps` at 4 layers in float32: every mode's tokens must be
#                      dynamic's (over 60 s)
#   refill             `bench refill` at LLaDA-8B's key/value heads in bfloat16 (27 s)
#   experts            `bench experts` in bfloat16: a LLaDA2.0-mini MoE layer (about 20 s)
#   fastdllm16         not in the default order: Fast-dLLM's 16-row cells, theirs on the first
#                      THEIR_ROWS (default 4) prompts, its time scaled (4 of 6 cells in 130 s
#                      with THEIR_ROWS=2)
# PARTS="NAME[:SECONDS] ..." picks the parts, their order and time limits. Each part has its
# own limit and log; a part that fails does not stop the next. The whole call keeps within
# TOTAL seconds (default 570): a part gets at most what is left, and one with under 30 s left
# is skipped and says so, so the call ends before the tool stops it. The default order puts
# what has not run on a GPU first and fills TOTAL before `static_steps_bf16`, `refill` and
# `experts` (measured on 2026-11-28) come; name them in PARTS to rerun them after a change
# to the step. The logs and tables go to
# WORK; after each part OUT gets its JSON and a fresh gpu_session.tgz of everything so far
# (the device tool returns at most 8 files).
#
#   # here first: python -m bench fastdllm --export (Fast-dLLM's files into bench/.fastdllm/)
#   # on the device machine, from the repository root (carry bench/.fastdllm):
#   bash bench/gpu_session.sh                             # writes under $OUT
#   PARTS="fastdllm16:450" bash bench/gpu_session.sh      # a second call (PART=fastdllm16 too)
#   # a smoke run of the same script on the CPU (tiny sizes, about a minute):
#   SMOKE=1 OUT=/tmp/gpu_smoke bash bench/gpu_session.sh
#   # then, here, each suite's section from its JSON (--section: beside the CPU run's), e.g.
#   .venv/bin/python -m bench static-steps --report-only --json FILES/static_steps_bf16.json \
#       --section static_steps_h200_bf16
#   .venv/bin/python -m bench fastdllm --report-only --json FILES1/fastdllm.json \
#       --merge FILES2/fastdllm16.json
#   # and the projection with its dual cells (--json: the eager run of the same GPU kind)
#   .venv/bin/python -m bench projection --data-dir DATA --json bench/results/gpu_bench_h200.json \
#       --cached-steps FILES/static_steps_bf16.json
set -u
OUT=${OUT:-/tmp/gpu_session}
WORK=${WORK:-$(mktemp -d /tmp/gpu_session.XXXX)}  # logs and tables, packed at the end
mkdir -p "$OUT" "$WORK"
PY=${PY:-python3}
FASTDLLM_FLAGS=${FASTDLLM_FLAGS:-}  # more flags for both Fast-dLLM parts, e.g. --caches prefix none
if [ "${SMOKE:-0}" = 1 ]; then
    DEVICE=cpu BF16=float32 LAYERS=1 F32_LAYERS=1 ROWS="1 2" REPEATS=1 WARM=0
    COMPILED_MODES="static" PROFILE_COMPILED=""  # no compiled mode off CUDA
    SHAPE="--width 64 --heads 4 --prompt-length 16 --gen-length 16 --block 4"
    PROFILE_SHAPE="--width 64 --heads 4 --prompt-length 16 --gen-length 16 --block 16"
    DECODE_MODES="--tiny --device cpu --rows 1 2 --repeats 1 --schedules threshold"
    FAST="--tiny --rows 1 --repeats 1"
    FAST16="--tiny --rows 2 --repeats 1 --their-rows 1"
else
    DEVICE=cuda BF16=bfloat16 LAYERS=32 F32_LAYERS=4 ROWS="1 16" REPEATS=2 WARM=5
    COMPILED_MODES="graphs compiled" PROFILE_COMPILED="--compiled"
    SHAPE="" PROFILE_SHAPE=""
    DECODE_MODES="--device cuda --rows 1 16 --repeats 2 --schedules threshold"
    DECODE_MODES="$DECODE_MODES --caches prefix dual none"
    FAST="--device cuda --rows 1 --repeats 3 --repeat-budget-s 30 --deadline-s ${FAST_DEADLINE:-240}"
    # Fast-dLLM decodes one row a call: its 16-row time is scaled from its first THEIR_ROWS
    FAST16="--device cuda --rows 16 --repeats 1 --their-rows ${THEIR_ROWS:-4}"
    FAST16="$FAST16 --deadline-s ${FAST16_DEADLINE:-360}"
fi

STARTED=$(date +%s)
TOTAL=${TOTAL:-570}  # the whole call's seconds: the device tool stops a command at 600
part() {  # part NAME SECONDS COMMAND...: run it under a time limit, log kept under $WORK
    local name=$1 limit=${LIMIT:-$2}  # LIMIT: the seconds PARTS gave this part, if any
    shift 2
    local left=$((TOTAL - ($(date +%s) - STARTED)))
    if [ "$left" -lt 30 ]; then  # skipped, said: better than a call stopped mid-part
        echo "== $name skipped: $left s left of TOTAL=$TOTAL" | tee "$WORK/$name.log"
        return
    fi
    if [ "$limit" -gt "$left" ]; then limit=$left; fi
    echo "== $name ($(date -u +%H:%M:%S), at most $limit s)"
    timeout -k 10 "$limit" "$@" >"$WORK/$name.log" 2>&1
    echo "exit status $?" >>"$WORK/$name.log"
    tail -n 3 "$WORK/$name.log"
    # what has been measured reaches OUT now, should the tool stop a later part
    if [ -f "$WORK/$name.json" ]; then cp "$WORK/$name.json" "$OUT/"; fi
    tar czf "$OUT/gpu_session.tgz" -C "$WORK" .
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$WORK/gpu.txt" 2>&1
have_fastdllm() {
    [ -d bench/.fastdllm ] && return 0
    echo "== $1 skipped: bench/.fastdllm/ is absent (python -m bench fastdllm --export, carry it)"
    return 1
}
run_part() {  # run_part NAME: one part of the session, by name
    case $1 in
    gpu_tests)  # on the CPU its tests only skip
        [ "${SMOKE:-0}" = 1 ] && return
        part gpu_tests 180 "$PY" -m pytest -q -n 0 -m gpu -p no:cacheprovider -rs \
            tests/test_static_steps_gpu.py tests/test_moe_gpu.py tests/test_upstream_numerics.py ;;
    compiled)  # one row's reuse and full steps under compiled beside graphs, full shape
        part compiled 200 "$PY" -m bench static-steps --device "$DEVICE" --dtype "$BF16" \
            --layers "$LAYERS" $SHAPE --rows 1 --repeats 1 --warm-up "$WARM" --caches dual \
            --modes $COMPILED_MODES --json "$WORK/compiled.json" --out "$WORK/compiled.md" ;;
    compiled16)  # the same at 16 rows (not in the default order)
        part compiled16 200 "$PY" -m bench static-steps --device "$DEVICE" --dtype "$BF16" \
            --layers "$LAYERS" $SHAPE --rows 16 --repeats 1 --warm-up "$WARM" --caches dual \
            --modes $COMPILED_MODES --json "$WORK/compiled16.json" \
            --out "$WORK/compiled16.md" ;;
    compiled_f32)  # compiled's tokens against dynamic's in float32
        part compiled_f32 120 "$PY" -m bench static-steps --device "$DEVICE" \
            --dtype float32 --layers "$F32_LAYERS" $SHAPE --rows 1 --repeats 1 --caches dual \
            --modes $COMPILED_MODES --json "$WORK/compiled_f32.json" \
            --out "$WORK/compiled_f32.md" ;;
    step_profile)  # the one-row dual reuse step, kernel by kernel
        part step_profile 150 "$PY" -m bench step-profile --device "$DEVICE" --dtype "$BF16" \
            --layers "$LAYERS" $PROFILE_SHAPE $PROFILE_COMPILED --json "$WORK/step_profile.json" \
            --out "$WORK/step_profile.md" ;;
    step_profile_none)  # the one-row step without a cache (a full pass), kernel by kernel
        part step_profile_none 90 "$PY" -m bench step-profile --device "$DEVICE" \
            --dtype "$BF16" --layers "$LAYERS" --cache none $PROFILE_SHAPE \
            --json "$WORK/step_profile_none.json" --out "$WORK/step_profile_none.md" ;;
    decode_modes)  # whole threshold-rule decodes under dynamic, static and graphs (none too)
        part decode_modes 150 "$PY" -m bench decode-modes $DECODE_MODES \
            --json "$WORK/decode_modes.json" --out "$WORK/decode_modes.md" ;;
    static_steps_bf16)
        part static_steps_bf16 200 "$PY" -m bench static-steps --device "$DEVICE" \
            --dtype "$BF16" --layers "$LAYERS" $SHAPE --rows $ROWS --repeats "$REPEATS" \
            --warm-up "$WARM" --json "$WORK/static_steps_bf16.json" \
            --out "$WORK/static_steps_bf16.md" ;;
    fastdllm)
        have_fastdllm fastdllm || return
        part fastdllm 300 "$PY" -m bench fastdllm $FAST $FASTDLLM_FLAGS --json "$WORK/fastdllm.json" \
            --out "$WORK/fastdllm.md" ;;
    fastdllm16)
        have_fastdllm fastdllm16 || return
        part fastdllm16 450 "$PY" -m bench fastdllm $FAST16 $FASTDLLM_FLAGS --json "$WORK/fastdllm16.json" \
            --out "$WORK/fastdllm16.md" ;;
    static_steps_f32)
        part static_steps_f32 150 "$PY" -m bench static-steps --device "$DEVICE" \
            --dtype float32 --layers "$F32_LAYERS" $SHAPE --rows $ROWS --repeats 1 \
            --json "$WORK/static_steps_f32.json" --out "$WORK/static_steps_f32.md" ;;
    refill)
        if [ "${SMOKE:-0}" = 1 ]; then
            part refill 60 "$PY" -m bench refill --device cpu --repeats 1 --out "$WORK/refill.md"
        else
            part refill 60 "$PY" -m bench refill --device cuda --dtype bfloat16 --real-shape \
                --out "$WORK/refill.md"
        fi ;;
    experts)
        if [ "${SMOKE:-0}" = 1 ]; then
            part experts 60 "$PY" -m bench experts --quick --repeats 1 --out "$WORK/experts.md"
        else
            part experts 60 "$PY" -m bench experts --device cuda --dtype bfloat16 \
                --out "$WORK/experts.md"
        fi ;;
    esac
}

# what has not run on a GPU and Fast-dLLM's missing cells first; the rest as time allows
# (static_steps_bf16, refill and experts were measured on 2026-11-28: they come after the new)
DEFAULT_PARTS="gpu_tests compiled fastdllm compiled_f32 step_profile step_profile_none"
DEFAULT_PARTS="$DEFAULT_PARTS decode_modes static_steps_bf16 static_steps_f32 refill experts"
KNOWN=" $DEFAULT_PARTS fastdllm16 compiled16 "
PARTS=${PARTS:-$DEFAULT_PARTS}
if [ "${PART:-all}" = fastdllm16 ]; then PARTS=fastdllm16; fi  # the second call alone
for item in $PARTS; do  # every name and limit checked before any part runs
    case $KNOWN in *" ${item%%:*} "*) ;; *)
        echo "PARTS: no part named '${item%%:*}' (the parts:$KNOWN)"; exit 2 ;;
    esac
    case $item in *:*)
        seconds=${item#*:}
        case $seconds in '' | *[!0-9]*) seconds=0 ;; esac
        if [ $((10#$seconds)) -lt 1 ]; then
            echo "PARTS: '$item': give NAME:SECONDS with SECONDS a whole number above 0"
            exit 2
        fi ;;
    esac
done
for item in $PARTS; do  # NAME or NAME:SECONDS (that part's time limit instead of its own)
    LIMIT=""
    case $item in *:*) LIMIT=$((10#${item#*:})) ;; esac
    run_part "${item%%:*}"
done
# the device tool returns at most 8 files: everything in one archive (remade after each part)
tar czf "$OUT/gpu_session.tgz" -C "$WORK" .
