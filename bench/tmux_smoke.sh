#!/usr/bin/env bash
# Smoke test of the real `scaletrain` binary in a real terminal (tmux, 100×32): walk the wizard for
# Qwen/Qwen2.5-7B-Instruct LoRA on --gpus 4xH200 at effective batch 128, with bad entries refused in place,
# write the run directory, quit with ctrl+q (exit 0); then start with no --gpus and check that a machine without a
# GPU is told so and offered the catalog. Prints every step and the screens it read; exits non-zero on a failure.
#
#   bench/tmux_smoke.sh                        # prints the transcript
#   bench/tmux_smoke.sh > bench/results/tmux_smoke.txt
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${SCALETRAIN_BIN:-$ROOT/.venv/bin/scaletrain}
PY=${SCALETRAIN_PY:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d /tmp/scaletrain-tmux.XXXXXX)
SESSION=scaletrain-smoke-$$
RUN_DIR=$WORK/run
FAILED=0
command -v tmux >/dev/null || { echo "tmux is not installed (apt-get install -y tmux)"; exit 2; }

cleanup() { tmux kill-session -t "$SESSION" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

now_ms() { date +%s%3N; }
screen() { tmux capture-pane -p -t "$SESSION"; }
say() { printf '%s\n' "$*"; }
show() { say "----- screen: $1"; screen | sed -e 's/[[:space:]]*$//' | awk 'NF || p {print; p=NF}'; say "-----"; }
check() {  # check NAME: record PASS/FAIL of the previous wait
  if [ "$2" = 0 ]; then say "PASS  $1"; else say "FAIL  $1"; FAILED=1; fi
}
# wait_for TEXT [SECONDS]: poll the pane every 20 ms until TEXT is on screen
wait_for() {
  local deadline=$(( $(now_ms) + ${2:-15} * 1000 ))
  while [ "$(now_ms)" -lt "$deadline" ]; do
    screen | grep -qF -- "$1" && return 0
    sleep 0.02
  done
  return 1
}
keys() { tmux send-keys -t "$SESSION" "$@"; sleep 0.15; }
start() {  # start CMD...: the wizard in a fresh 100×32 session; its exit code lands in $WORK/exit
  rm -f "$WORK/exit"
  tmux kill-session -t "$SESSION" 2>/dev/null
  T0=$(now_ms)
  tmux new-session -d -s "$SESSION" -x 100 -y 32 \
    "cd '$WORK' && TERM=xterm-256color $* ; echo \$? > '$WORK/exit'; sleep 30"
}
exit_code() {
  local deadline=$(( $(now_ms) + 15000 ))
  while [ ! -s "$WORK/exit" ] && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.05; done
  cat "$WORK/exit" 2>/dev/null || echo "none"
}

say "scaletrain tmux smoke test — $(date -Is) — $(uname -srm), tmux $(tmux -V | cut -d' ' -f2)"
say "binary: $BIN"

# ---- 1. --gpus 4xH200, walk to a written run directory -----------------------------------------------------------
start "$BIN" --gpus 4xH200 --run-dir "$RUN_DIR"
wait_for "1 Hardware" 20; check "first screen painted ($(( $(now_ms) - T0 )) ms after start, process start included)" $?
wait_for "4xH200: NVIDIA H200" 10; check "step 1 shows the planned 4×H200" $?
if "$PY" -c 'import sys; from scaletrain.engine.devices.nvml import detect; sys.exit(0 if detect().gpus else 1)'; then
  say "SKIP  no-GPU wording (this machine has a GPU)"
else
  wait_for "No GPU detected on this machine" 10; check "step 1 says there is no GPU here, plainly" $?
fi
show "step 1 (hardware)"

keys C-n
wait_for "catalog id, config.json path" 10; check "step 2 (model) opened" $?
keys "qwen2.5 7b"
wait_for "Qwen/Qwen2.5-7B-Instruct" 10; check "catalog search finds Qwen2.5-7B-Instruct" $?
keys Enter
wait_for "7,615,616,512 params" 10; check "picked model shows its exact parameter count" $?
keys Right Enter          # the method is asked, not preselected: full → lora
show "step 2 (model & method)"

keys C-n
wait_for "solver" 10 && wait_for "4 GPUs = 128" 15; check "step 3 (batch) opened; solver shows micro × accum × 4 GPUs = 128" $?
keys C-u; keys "12a"
wait_for "must be a whole number" 10; check "letters in the batch size are refused in place" $?
keys C-n
wait_for "Batch & data" 5 && ! screen | grep -qF "per-GPU memory at the peak"; check "ctrl+n does not advance past a bad entry" $?
keys C-u; keys "130"
wait_for "is not a multiple" 10 && wait_for "nearest reachable: 128 or 132" 5; check "a batch no GPU count divides is refused in place, with the nearest batches" $?
show "step 3 (a refused batch)"
keys C-u; keys "128"
wait_for "4 GPUs = 128" 10; check "effective batch 128 accepted" $?

keys C-n
wait_for "per-GPU memory at the peak" 15 && wait_for "fits" 5; check "step 4 (plan) shows the memory bars and a fit verdict" $?
wait_for "alternatives" 15; check "step 4 lists the planner's alternatives" $?
before=$(screen | grep -o "grad-ckpt o[nf]*" | head -1)
if [ "$before" = "grad-ckpt off" ]; then want="grad-ckpt on"; else want="grad-ckpt off"; fi
keys c
wait_for "$want" 5; check "what-if key c flips checkpointing ($before → $want)" $?
keys c
show "step 4 (plan)"

keys C-n
wait_for "files will be written" 15; check "step 5 (write) previews the files" $?
keys w
wait_for "wrote" 10; check "w writes the run directory" $?
show "step 5 (written)"
keys C-q
code=$(exit_code); [ "$code" = 0 ]; check "ctrl+q on the last step exits 0 (got $code)" $?
"$PY" - "$RUN_DIR" <<'EOF'; check "plan.json: Qwen2.5-7B-Instruct LoRA on 4×H200, effective batch 128" $?
import json, sys
p = json.load(open(sys.argv[1] + "/plan.json"))
assert p["model"]["name"] == "Qwen/Qwen2.5-7B-Instruct", p["model"]["name"]
assert p["training"]["method"] == "lora", p["training"]["method"]
assert p["hardware"]["gpu"] == "H200" and p["batch"]["world_size"] == 4, p["hardware"]
assert p["batch"]["effective_batch"] == 128, p["batch"]
print("      " + ", ".join(sorted(f for f in __import__("os").listdir(sys.argv[1]))))
print(f"      micro {p['batch']['micro_batch']} × accum {p['batch']['grad_accum']} × {p['batch']['world_size']}"
      f" = {p['batch']['effective_batch']}, {p['training']['strategy']}, per GPU {p['memory']['per_gpu_bytes']['total']:,} B"
      f" (fits: {p['memory']['fits']})")
EOF

# ---- 2. no --gpus: detection, and ctrl+q on the first step --------------------------------------------------------
start "$BIN"
wait_for "1 Hardware" 20; check "wizard without --gpus painted ($(( $(now_ms) - T0 )) ms)" $?
if "$PY" -c 'import sys; from scaletrain.engine.devices.nvml import detect; sys.exit(0 if detect().gpus else 1)'; then
  wait_for "Detected" 10; check "detected GPUs are listed" $?
else
  wait_for "No GPU detected on this machine" 10 && wait_for "hardware from the catalog" 5
  check "no GPU and no --gpus: says so (NVML's reason) and offers the catalog" $?
fi
show "step 1 without --gpus"
keys C-q
code=$(exit_code); [ "$code" = 0 ]; check "ctrl+q on the first step exits 0 (got $code)" $?

# ---- 3. ctrl+q in the middle (step 3, with a refusal on screen) ----------------------------------------------------
start "$BIN" --gpus 2xA100-80GB --model scaletrain/tiny-llama --method full
wait_for "1 Hardware" 20
keys C-n; wait_for "catalog id, config.json path" 10
keys C-n; wait_for "solver" 10
keys C-u; keys "x"; wait_for "must be a whole number" 10
keys C-q
code=$(exit_code); [ "$code" = 0 ]; check "ctrl+q on step 3 with a bad entry on screen exits 0 (got $code)" $?

if [ "$FAILED" = 0 ]; then say "RESULT: PASS"; else say "RESULT: FAIL"; fi
exit "$FAILED"
