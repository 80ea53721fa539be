"""`python -m nemo_topr.training.train_export HF_ROOT [nemo-topr train args]`: `nemo-topr train`,
then `nemo-topr export --all-iterations` of its run to HF_ROOT (HF_ROOT/iter_NNNNNNN), in one
process.

Two commands pay Python's and Megatron's start-up (~15 s on 2 cores) twice; Bridge's finetune()
destroys its process group when it ends, so the export's own temporary one starts cleanly in the
same process. Used by the miniature (a training per run) and the tests that train to export.
"""

from __future__ import annotations

import os
import sys

from nemo_topr.errors import run_refusing


def main(argv: list[str]) -> int:
    from nemo_topr.model.quiet import quiet_known_noise
    from nemo_topr.training import export, recipe
    from nemo_topr.training.config import compose

    quiet_known_noise()
    hf_root, train_argv = argv[0], argv[1:]
    rendezvous = {key: os.environ.get(key) for key in ("MASTER_ADDR", "MASTER_PORT")}
    code = run_refusing("nemo-topr train", recipe.main, train_argv)
    if code:
        return code
    # Start the export as its own command would: `nemo-topr train` set a rendezvous port for its
    # process group, which the export's would reuse (env://) and may find still bound or taken
    # by a concurrent run; without one, it picks a free port of its own.
    for key, value in rendezvous.items():
        if value is None:
            os.environ.pop(key, None)
    args = recipe.parse_args(train_argv)
    raw = compose(args.config_name, args.overrides, args.config_path)
    return run_refusing("nemo-topr export", export.main, ["--ckpt", str(raw.run_dir), "--hf-out", hf_root,
                                                        "--all-iterations", "--device", raw.device])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
