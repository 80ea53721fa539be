#!/usr/bin/env bash
# Body of every nemo_topr Slurm job (the sbatch scripts in this directory and the ones
# `nemo-topr submit` renders exec this). Runs one TOPR training run across the allocation:
# `srun` starts slurm/task.sh once per GPU, and each task execs one training rank.
#
#   slurm/topr_job.sh CONFIG_NAME [key=value ...]      (inside an allocation)
#
# Environment (all optional):
#   NEMO_TOPR_ROOT             repository checkout (default: $SLURM_SUBMIT_DIR)
#   NEMO_TOPR_RUN_DIR          run directory; the same directory resumes (default: runs/$SLURM_JOB_NAME)
#   NEMO_TOPR_GPUS_PER_NODE    ranks per node (default: $SLURM_GPUS_ON_NODE, else 8)
#   NEMO_TOPR_CONTAINER_IMAGE  run inside this enroot/pyxis image (e.g. nvcr.io/nvidia/pytorch:25.09-py3);
#                              unset: bare venv mode
#   NEMO_TOPR_CONTAINER_MOUNTS pyxis --container-mounts SRC:DST[,...]; must cover the checkout, the run
#                              dir, base_model and the data (`nemo-topr submit` derives and checks them)
#   NEMO_TOPR_VENV             bare venv mode: the virtual environment (default: $NEMO_TOPR_ROOT/.venv)
#   NEMO_TOPR_MASTER_PORT      rendezvous port (default: 29500 + job id mod 10000)
#
# Pre-emption (docs/cluster.md): submit with `--signal=USR1@SECONDS --requeue` (no `B:`). Slurm
# then sends SIGUSR1 to every task of the job step -- the training ranks themselves -- SECONDS
# before the time limit; Bridge (train.exit_signal=SIGUSR1, set below) saves a checkpoint at the
# next iteration boundary on every rank and stops, and rank 0 leaves RUN_DIR/STOPPED. This script
# then requeues the job, whose next start resumes from that checkpoint. Nothing here signals srun:
# SIGTERM to srun makes it SIGKILL every task (Slurm, src/srun/libsrun/srun_job.c,
# _srun_signal_mgr), which is exactly what must not happen before the save.
# A run that finished leaves RUN_DIR/COMPLETED. A rank that died of SIGUSR1 itself (the warning came
# before it could hold it) is requeued too; any other failure is not.
set -euo pipefail

if (($# < 1)); then
    echo "usage: $0 CONFIG_NAME [key=value ...]" >&2
    exit 2
fi
config_name=$1
shift
# The run directory is this script's to choose (below): it keeps the logs and the requeue marker
# there and passes it to train, so a run_dir= override would have train write elsewhere, where no
# STOPPED is looked for (a pre-empted job not requeued).
for override in "$@"; do
    if [[ $override =~ ^\+{0,2}run_dir= ]]; then
        echo "$0: $override: give the run directory as NEMO_TOPR_RUN_DIR (sbatch --export=ALL,NEMO_TOPR_RUN_DIR=DIR," \
             "or nemo-topr submit --run-dir), not as an override: this script keeps the job's logs and requeue" \
             "marker there" >&2
        exit 2
    fi
done

repo=${NEMO_TOPR_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
job_name=${SLURM_JOB_NAME:-topr}
job_id=${SLURM_JOB_ID:-0}
run_dir=${NEMO_TOPR_RUN_DIR:-$repo/runs/$job_name}
nodes=${SLURM_JOB_NUM_NODES:-1}
gpus_per_node=${NEMO_TOPR_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
log_dir=$run_dir/logs/job-$job_id-start-${SLURM_RESTART_COUNT:-0}
mkdir -p "$log_dir"
cd "$repo"  # relative paths in the run config are relative to the checkout (as in container mode)

# Rendezvous for torch.distributed, read by every rank through srun's environment.
MASTER_ADDR=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" | head -n 1)
MASTER_PORT=${NEMO_TOPR_MASTER_PORT:-$((29500 + job_id % 10000))}
LOCAL_WORLD_SIZE=$gpus_per_node
export MASTER_ADDR MASTER_PORT LOCAL_WORLD_SIZE

# The GPU ranks' process environment (NCCL, CUDA, allocator, threads); what is set already wins.
# shellcheck source=slurm/environment.sh
source "$repo/slurm/environment.sh"

# One task per GPU; every task sees all the node's GPUs and picks LOCAL_RANK (as under torchrun).
srun_args=("--nodes=$nodes" "--ntasks-per-node=$gpus_per_node" --kill-on-bad-exit=1
           "--output=$log_dir/rank-%t.log")
if [[ -n ${NEMO_TOPR_CONTAINER_IMAGE:-} ]]; then
    srun_args+=("--container-image=$NEMO_TOPR_CONTAINER_IMAGE"
                "--container-mounts=${NEMO_TOPR_CONTAINER_MOUNTS:-$repo:$repo,$run_dir:$run_dir}"
                "--container-workdir=$repo")
    python=python
    export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
else
    python=${NEMO_TOPR_VENV:-$repo/.venv}/bin/python
fi

echo "[topr_job] job $job_id: $nodes node(s) x $gpus_per_node rank(s), config $config_name, run dir $run_dir"
echo "[topr_job] rendezvous $MASTER_ADDR:$MASTER_PORT; logs: $log_dir"

rm -f "$run_dir/STOPPED"  # written by rank 0 only when this start stops early with a checkpoint
# The warning signal must match `#SBATCH --signal=USR1@...`; the dataloader workers (also tasks'
# processes, which slurmstepd signals) install Bridge's handler instead of dying of it.
srun "${srun_args[@]}" "$repo/slurm/task.sh" "$python" train --config-name "$config_name" "run_dir=$run_dir" \
    train.exit_signal=SIGUSR1 train.exit_signal_handler_for_dataloader=true "$@" && status=0 || status=$?

if [[ -f $run_dir/COMPLETED ]]; then
    echo "[topr_job] training completed"
    exit 0
fi
if [[ -f $run_dir/STOPPED ]]; then
    echo "[topr_job] $(cat "$run_dir/STOPPED"); requeueing job $job_id"
    scontrol requeue "$job_id"
    exit 0
fi
# A rank killed by SIGUSR1 took the warning before `nemo-topr train` could hold it (bash or Python
# still starting; nemo_topr/cli.py blocks it first thing). It is still the warning: requeue, and
# the next start resumes from the last checkpoint. srun's status is 128 + the highest signal that
# killed a task (Slurm's launch_slurm.c, `_task_finish`), so this is seen only when no rank died of
# a higher one: a rank already holding it answers --kill-on-bad-exit's SIGTERM by dying of the
# warning it holds (nemo_topr/training/preemption_warning.py), not of the SIGTERM, which would make it 143.
if ((status == 128 + $(kill -l USR1))); then
    echo "[topr_job] a rank died of the warning (SIGUSR1) before it could hold it (srun status $status);" \
         "requeueing job $job_id to resume from the last checkpoint"
    scontrol requeue "$job_id"
    exit 0
fi
echo "[topr_job] training failed (srun status $status); not requeued; rank logs: $log_dir" >&2
exit "$status"
