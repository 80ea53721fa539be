# GPU machine, sourced before every command: one cuDNN per process (docs/cluster.md, "Which
# Transformer Engine"): torch's own nvidia/cudnn (window.sh ready replaces it), first on
# LD_LIBRARY_PATH, preloaded and named by CUDNN_PATH (where TE looks first), so that nothing loads a
# system cuDNN beside it. GRAPH_JIT_ONLY: cuDNN's documented configuration with only libcudnn,
# libcudnn_graph and libcudnn_engines_runtime_compiled (the NVRTC-compiled engines, SDPA's), the
# subset window.sh carries; 9.28 logs it as JIT at cudnnCreate (bench/results/gpu_kit_dryrun_*.txt).
export CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY
cudnn_lib=${CUDNN_LIB_DIR:-$(python3 -c "import os, torch; print(os.path.realpath(torch.__file__ + '/../../nvidia/cudnn/lib'))")}
if [ -f "$cudnn_lib/libcudnn.so.9" ]; then
  export LD_LIBRARY_PATH=$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} CUDNN_PATH=${cudnn_lib%/lib}
  export LD_PRELOAD=$cudnn_lib/libcudnn.so.9${LD_PRELOAD:+:$LD_PRELOAD}
else
  echo "cudnn-env.sh: no libcudnn.so.9 in $cudnn_lib: cuDNN left to the loader" >&2
fi
source .gpu/kit/env.sh
