#!/usr/bin/env bash
# Body of every nemo_topr Slurm job (the sbatch scripts in this directory and the ones
# `nemo-topr submit` renders exec this). Runs one TOPR training run across the allocation:
# `srun` starts slurm/node.sh once per node, which starts torchrun (one rank per GPU).
#
#   slurm/topr_job.sh CONFIG_NAME [key=value ...]      (inside an allocation)
#
# Environment (all optional):
#   NEMO_TOPR_ROOT             repository checkout (default: $SLURM_SUBMIT_DIR)
#   NEMO_TOPR_RUN_DIR          run directory; the same directory resumes (default: runs/$SLURM_JOB_NAME)
#   NEMO_TOPR_GPUS_PER_NODE    ranks per node (default: $SLURM_GPUS_ON_NODE, else 8)
#   NEMO_TOPR_CONTAINER_IMAGE  run inside this enroot/pyxis image (e.g. nvcr.io/nvidia/pytorch:25.09-py3);
#                              unset: use the checkout's .venv (bare venv mode)
#   NEMO_TOPR_CONTAINER_MOUNTS pyxis --container-mounts (default: the checkout and the run dir)
#
# Pre-emption: submit with `--signal=B:USR1@600 --requeue`. On USR1 (or TERM) the training ranks
# get SIGTERM, save a checkpoint at the next iteration boundary and stop; the job then requeues
# itself and the next start resumes from that checkpoint. A run that finished leaves
# RUN_DIR/COMPLETED and is not requeued; any other failure is not requeued either.
set -euo pipefail

if (($# < 1)); then
    echo "usage: $0 CONFIG_NAME [key=value ...]" >&2
    exit 2
fi
config_name=$1
shift

repo=${NEMO_TOPR_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
job_name=${SLURM_JOB_NAME:-topr}
job_id=${SLURM_JOB_ID:-0}
run_dir=${NEMO_TOPR_RUN_DIR:-$repo/runs/$job_name}
nodes=${SLURM_JOB_NUM_NODES:-1}
gpus_per_node=${NEMO_TOPR_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
log_dir=$run_dir/logs/job-$job_id
mkdir -p "$log_dir"

master_addr=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" | head -n 1)
master_port=$((29500 + job_id % 10000))

# NCCL / InfiniBand defaults; anything already set in the environment wins.
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-0}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}  # TP comm/compute overlap ordering
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

srun_args=(--ntasks-per-node=1 --kill-on-bad-exit=1 "--output=$log_dir/node-%n.log")
if [[ -n ${NEMO_TOPR_CONTAINER_IMAGE:-} ]]; then
    srun_args+=("--container-image=$NEMO_TOPR_CONTAINER_IMAGE"
                "--container-mounts=${NEMO_TOPR_CONTAINER_MOUNTS:-$repo:$repo,$run_dir:$run_dir}"
                "--container-workdir=$repo")
    python=python
    export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
else
    python=$repo/.venv/bin/python
fi

echo "[topr_job] job $job_id: $nodes node(s) x $gpus_per_node rank(s), config $config_name, run dir $run_dir"
echo "[topr_job] logs: $log_dir"

stop_requested=0
# shellcheck disable=SC2329  # invoked through trap
request_stop() {
    stop_requested=1
    echo "[topr_job] pre-emption signal: asking the training ranks to checkpoint and stop"
    kill -TERM "$srun_pid" 2>/dev/null || true
}
trap request_stop USR1 TERM

srun "${srun_args[@]}" "$repo/slurm/node.sh" "$python" "$nodes" "$gpus_per_node" "$master_addr:$master_port" \
    "$job_id" --config-name "$config_name" "run_dir=$run_dir" "$@" &
srun_pid=$!
status=0
while true; do
    wait "$srun_pid" && status=0 || status=$?
    # a trapped signal interrupts `wait` with status > 128 while srun is still running
    kill -0 "$srun_pid" 2>/dev/null || break
done

if [[ -f $run_dir/COMPLETED ]]; then
    echo "[topr_job] training completed"
    exit 0
fi
if ((stop_requested)); then
    echo "[topr_job] stopped early with a checkpoint; requeueing job $job_id"
    scontrol requeue "$job_id"
    exit 0
fi
echo "[topr_job] training failed (status $status); not requeued, see $log_dir" >&2
exit "$status"
