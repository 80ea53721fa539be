"""Any `nemo-topr` verb as one rank of a torch.distributed.run world (run_distributed's worker).

    python nemo_topr_cli.py VERB [args...]
"""

import sys

from nemo_topr.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
