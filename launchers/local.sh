#!/usr/bin/env bash
# Single-node launcher: torchrun with one rank per GPU (or N CPU ranks over gloo).
#
#   launchers/local.sh [-n RANKS] CONFIG_NAME [key=value ...]
#
#   launchers/local.sh llama31_8b_bf16 base_model=/models/Llama-3.1-8B-Instruct dataset.train_path=scored.jsonl
#   launchers/local.sh -n 2 tiny_cpu model.tensor_model_parallel_size=2     # CPU, TP=2 over gloo
#
# RANKS defaults to the number of visible GPUs, or 1 without one. Relative paths are the current
# directory's, as for `nemo-topr train`. Rerunning the same command
# resumes from the run directory's latest checkpoint. With GPUs visible, the ranks get a Slurm
# job's environment (slurm/environment.sh: NCCL, CUDA, allocator, threads; what is set wins).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${NEMO_TOPR_PYTHON:-$repo/.venv/bin/python}
ranks=""
while getopts "n:h" option; do
    case $option in
        n) ranks=$OPTARG ;;
        *) sed -n '2,12p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [[ -n $ranks && ! $ranks =~ ^[1-9][0-9]*$ ]]; then
    echo "launchers/local.sh: -n takes a number of ranks, 1 or more; got '$ranks'" >&2  # torchrun: a traceback
    exit 2
fi
if (($# < 1)); then
    sed -n '2,12p' "$0"
    exit 2
fi
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
ranks=${ranks:-$((gpus > 0 ? gpus : 1))}
if ((gpus > 0)); then
    # shellcheck source=slurm/environment.sh
    source "$repo/slurm/environment.sh"
fi
config_name=$1
shift
# from the caller's directory: relative paths are the caller's, as for `nemo-topr train` itself
exec "$python" -m torch.distributed.run --standalone --nproc-per-node="$ranks" \
    -m nemo_topr.cli train --config-name "$config_name" "$@"
