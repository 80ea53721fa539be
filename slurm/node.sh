#!/usr/bin/env bash
# One node's share of a TOPR job: torchrun with one rank per GPU, rendezvous on the first node.
#
#   node.sh PYTHON NODES RANKS_PER_NODE MASTER_ADDR:PORT JOB_ID TRAIN_ARGS...
#
# SIGTERM from srun (pre-emption) is passed to the training ranks directly rather than to
# torchrun, which would kill them 30 s later whether or not their checkpoint is written.
set -uo pipefail

python=$1 nodes=$2 ranks_per_node=$3 endpoint=$4 job_id=$5
shift 5

"$python" -m torch.distributed.run --nnodes="$nodes" --nproc-per-node="$ranks_per_node" \
    --rdzv-backend=c10d --rdzv-endpoint="$endpoint" --rdzv-id="$job_id" \
    -m nemo_topr.cli train "$@" &
launcher=$!

# shellcheck disable=SC2329  # invoked through trap
forward_stop() {
    pkill -TERM -P "$launcher" || true
}
trap forward_stop TERM USR1

status=0
while true; do
    wait "$launcher" && status=0 || status=$?
    kill -0 "$launcher" 2>/dev/null || break
done
exit "$status"
