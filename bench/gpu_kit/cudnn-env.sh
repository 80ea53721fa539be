# GPU machine, sourced before every command: one cuDNN per process (docs/cluster.md, "Which
# Transformer Engine"): the one in the interpreter's nvidia/cudnn (torch's, and where TE loads it
# from; install-cudnn.sh replaces it), first on LD_LIBRARY_PATH and preloaded, so that nothing
# loads a system cuDNN beside it.
cudnn_lib=$(python3 -c "import sysconfig; print(sysconfig.get_path('purelib'))")/nvidia/cudnn/lib
if [ -f "$cudnn_lib/libcudnn.so.9" ]; then
  export LD_LIBRARY_PATH=$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} CUDNN_PATH=${cudnn_lib%/lib}
  export LD_PRELOAD=$cudnn_lib/libcudnn.so.9${LD_PRELOAD:+:$LD_PRELOAD}
else
  echo "cudnn-env.sh: no libcudnn.so.9 in $cudnn_lib: cuDNN left to the loader" >&2
fi
source .gpu/kit/env.sh
