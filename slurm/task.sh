#!/usr/bin/env bash
# One rank of a `nemo-topr` command. slurm/topr_job.sh runs `srun slurm/task.sh PYTHON train ARGS...`,
# and `nemo-topr iterate nodes=N` its score-logprobs and train stages so, one task per GPU; this
# maps Slurm's task ids onto the variables torchrun would set and then *execs* Python, so the task
# process that slurmstepd signals is the rank itself (a shell left in between would die of
# SIGUSR1, whose default action is to terminate).
#
#   Slurm (per task)  ->  torch.distributed / Megatron
#   SLURM_PROCID          RANK        (global rank)
#   SLURM_LOCALID         LOCAL_RANK  (GPU index on this node; every task sees all the node's GPUs)
#   SLURM_NTASKS          WORLD_SIZE
# MASTER_ADDR, MASTER_PORT and LOCAL_WORLD_SIZE come from topr_job.sh (or iterate) through srun's
# environment.
set -euo pipefail

python=$1
shift
export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS
exec "$python" -m nemo_topr.cli "$@"
