#!/usr/bin/env bash
# Everything the course checks only on an NVIDIA GPU, in one run, ending in one table:
#
#   grading   the grading suites on the GPU:            python -m pytest tests/grading --device cuda
#   cuda-only the tests that skip without CUDA outside the suites (devices, the GPU bench's own tests);
#             their session stays on the CPU (no --device): they move tensors to the GPU themselves
#   bench     sampling-course bench --device cuda --strict (its two targets: the captured step
#             against Hugging Face eager and compiled, batch 1)
#   notebook  notebooks/06b_gpu_decoding.ipynb executed top to bottom against the solutions
#
#   bash scripts/gpu_check.sh              # on a machine with one NVIDIA GPU: at most 8 minutes after the install
#   bash scripts/gpu_check.sh --dry-run    # print the steps and an empty table; runs nothing
#   bash scripts/gpu_check.sh --only bench --only notebook
#
# It makes (or reuses) the virtual environment .venv as CI does, with constraints.txt. Each
# step has a time limit; the table gives each step's result, its wall-clock seconds and its
# summary line, and each step's whole output is kept in gpu-check-logs/. Exits 0 when every
# step passed, 1 when one failed, 2 for a bad argument or a machine without a usable GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

STEPS=(grading cuda-only bench notebook)
usage() {
    echo "usage: bash scripts/gpu_check.sh [--dry-run] [--only STEP]... [--no-install] [--logs DIR] [--summarize STEP LOG]"
    echo "steps: ${STEPS[*]}"
}

DRY_RUN=0
INSTALL=1
LOGS=gpu-check-logs
ONLY=()
SUMMARIZE=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --no-install) INSTALL=0 ;;
        --only)
            [ $# -ge 2 ] || { echo "error: --only needs a step: ${STEPS[*]}" >&2; exit 2; }
            case " ${STEPS[*]} " in
                *" $2 "*) ONLY+=("$2") ;;
                *) echo "error: --only $2: no such step; the steps are: ${STEPS[*]}" >&2; exit 2 ;;
            esac
            shift ;;
        --logs)
            [ $# -ge 2 ] || { echo "error: --logs needs a folder" >&2; exit 2; }
            LOGS="$2"; shift ;;
        --summarize)  # the table's summary of one step's log (for the script's own tests)
            [ $# -ge 3 ] || { echo "error: --summarize needs a step and a log" >&2; exit 2; }
            SUMMARIZE=("$2" "$3"); shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
[ ${#ONLY[@]} -gt 0 ] && STEPS=("${ONLY[@]}")

# Each step: its time limit in seconds and its command. The limits add up to 8 minutes. On an H200
# the grading took 98-102 s, cuda-only 17 s and the bench 113 s. The notebook took 176 s when its bench
# cell ran both dtypes and ignored --budget; the cell now runs float32 only, within its budget.
declare -A LIMIT=([grading]=130 [cuda-only]=40 [bench]=150 [notebook]=160)
declare -A COMMAND=(
    [grading]="python -m pytest tests/grading --device cuda -q -rs -p no:randomly"
    [cuda-only]="python -m pytest tests/course/test_devices.py tests/apps/test_bench_gpu.py -q -rs -m 'not notebooks and not planted and not classroom'"
    # --budget keeps the bench inside its limit; --strict makes a missed target a failed step.
    [bench]="sampling-course bench --device cuda --strict --no-progress --budget 120"
    [notebook]="SAMPLING_COURSE_IMPL=solutions python -m pytest tests/course/test_notebooks.py -m notebooks -k 06b -q"
)

# The summary of a step's log: pytest's last line, or the bench's target rows.
summary() {
    local step="$1" log="$2"
    if [ "$step" = bench ]; then
        # A target row: label | dtype | measured | wanted | result, shortened to "eager/float32 6.10x ok".
        grep -E "captured step vs" "$log" | sed 's/│/|/g' | awk -F'|' '{
            gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); gsub(/^ +| +$/, "", $6)
            printf "%s%s/%s %s %s", (n++ ? "; " : ""), ($2 ~ /compiled/ ? "compiled" : "eager"), $3, $4, $6 }'
        echo
    else
        grep -E "(passed|failed|skipped|error|no tests ran)" "$log" | tail -n 1 | sed -E 's/=+//g; s/^ +//' | cut -c1-110
    fi
}

table() {  # rows: step result seconds summary (tab-separated, in $ROWS)
    printf '%-10s %-8s %7s  %s\n' step result seconds summary
    printf '%-10s %-8s %7s  %s\n' ---------- -------- ------- -------
    printf '%s' "$ROWS" | while IFS=$'\t' read -r step result seconds text; do
        printf '%-10s %-8s %7s  %s\n' "$step" "$result" "$seconds" "$text"
    done
}

if [ ${#SUMMARIZE[@]} -gt 0 ]; then
    summary "${SUMMARIZE[0]}" "${SUMMARIZE[1]}"
    exit 0
fi

ROWS=""
if [ "$DRY_RUN" = 1 ]; then
    for step in "${STEPS[@]}"; do
        echo "would run $step (limit ${LIMIT[$step]} s): ${COMMAND[$step]}"
        ROWS+="$step"$'\t'"dry-run"$'\t'"-"$'\t'"${COMMAND[$step]:0:80}"$'\n'
    done
    table
    exit 0
fi

# The environment, as CI makes it (.ci/run), with the extras the steps need.
if [ "$INSTALL" = 1 ]; then
    [ -d .venv ] || python3 -m venv .venv
    . .venv/bin/activate
    pip install -q -c constraints.txt -e . nbclient ipykernel || { echo "error: pip install failed" >&2; exit 2; }
    # constraints.txt pins torch's version, not its build. The torch wheel pip finds may be a CPU
    # build (a CPU-only index or mirror, as on the course's CI machines), and then every step would
    # skip or refuse the GPU. So when the machine has an NVIDIA GPU that this torch cannot see, the
    # same version is reinstalled from PyTorch's CUDA index (TORCH_CUDA_INDEX chooses another CUDA
    # build, e.g. https://download.pytorch.org/whl/cu126 for an older driver).
    if command -v nvidia-smi >/dev/null && ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        version=$(grep -E '^torch==' constraints.txt | cut -d= -f3)
        echo "torch $version here is a CPU build: installing its CUDA build from ${TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}"
        pip install -q --force-reinstall --no-deps "torch==$version" \
            --index-url "${TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}" \
            || { echo "error: could not install a CUDA build of torch $version" >&2; exit 2; }
    fi
elif [ -f .venv/bin/activate ]; then
    . .venv/bin/activate
fi
if ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "error: torch sees no CUDA GPU here ($(python -c 'import torch; print(torch.__version__)' 2>&1)): nothing to check" >&2
    exit 2
fi
python -c "import torch; print(f'GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}')"

mkdir -p "$LOGS"
failed=0
start_all=$SECONDS
for step in "${STEPS[@]}"; do
    log="$LOGS/$step.log"
    echo "== $step (limit ${LIMIT[$step]} s): ${COMMAND[$step]}"
    start=$SECONDS
    timeout --kill-after=10 "${LIMIT[$step]}" bash -c "${COMMAND[$step]}" > "$log" 2>&1
    status=$?
    seconds=$((SECONDS - start))
    case $status in
        0) result=passed ;;
        124|137) result=timeout; failed=1 ;;
        *) result=failed; failed=1 ;;
    esac
    ROWS+="$step"$'\t'"$result"$'\t'"$seconds"$'\t'"$(summary "$step" "$log")"$'\n'
done
echo
table
echo "total: $((SECONDS - start_all)) s; logs in $LOGS/"
exit $failed
