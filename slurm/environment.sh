# shellcheck shell=bash
# Process environment of GPU training ranks, after Megatron-Bridge's Llama 3 H100 recipes
# (megatron/bridge/recipes/utils/environment_utils.py, COMMON_RECIPE_ENV_VARS); anything already
# set in the environment wins. Sourced by slurm/topr_job.sh; `nemo-topr iterate device=cuda` gives
# it to its score and train stages (nemo_topr/cluster/environment.py reads the export lines, which
# must keep the form `export NAME=${NAME:-value}`). docs/cluster.md tabulates it.

# One hardware work queue per GPU, so kernels start in the order they are issued: Megatron issues
# the overlapped grad reduce-scatter / param all-gather (ddp.overlap_*) and TP collectives ahead
# of the compute they must overlap (megatron/core/distributed/distributed_data_parallel.py).
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
# NVLink SHARP (NVLS) buffers cost GPU memory and need NCCL user buffers, which these runs do not use.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# No NCCL CUDA-graph buffer registration (it pairs with user buffers, unused here).
export NCCL_GRAPH_REGISTER=${NCCL_GRAPH_REGISTER:-0}
# Let the caching allocator grow segments instead of fragmenting on varying packed-row shapes.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
# Free NCCL input tensors when the collective ends rather than via recordStream (less memory held).
export TORCH_NCCL_AVOID_RECORD_STREAMS=${TORCH_NCCL_AVOID_RECORD_STREAMS:-1}
# Put NCCL's streams at high priority so communication is not starved by compute kernels.
export TORCH_NCCL_HIGH_PRIORITY=${TORCH_NCCL_HIGH_PRIORITY:-1}
# A failed collective aborts the rank (and --kill-on-bad-exit the step) instead of hanging.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
# NCCL prints warnings and errors only; set INFO to debug the network.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# CPU threads per rank for tokenisation and host-side ops (8 ranks share a node's cores).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
