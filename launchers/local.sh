#!/usr/bin/env bash
# Single-node launcher: torchrun with one rank per GPU (or N CPU ranks over gloo).
#
#   launchers/local.sh [-n RANKS] CONFIG_NAME [key=value ...]
#
#   launchers/local.sh llama31_8b_bf16 base_model=/models/Llama-3.1-8B-Instruct dataset.train_path=scored.jsonl
#   launchers/local.sh -n 2 tiny_cpu model.tensor_model_parallel_size=2     # CPU, TP=2 over gloo
#
# RANKS defaults to the number of visible GPUs, or 1 without one. Rerunning the same command
# resumes from the run directory's latest checkpoint.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${NEMO_TOPR_PYTHON:-$repo/.venv/bin/python}
ranks=""
while getopts "n:h" option; do
    case $option in
        n) ranks=$OPTARG ;;
        *) sed -n '2,11p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if (($# < 1)); then
    sed -n '2,11p' "$0"
    exit 2
fi
if [[ -z $ranks ]]; then
    ranks=$("$python" -c 'import torch; print(max(torch.cuda.device_count(), 1))')
fi
config_name=$1
shift
cd "$repo"
exec "$python" -m torch.distributed.run --standalone --nproc-per-node="$ranks" \
    -m nemo_topr.cli train --config-name "$config_name" "$@"
