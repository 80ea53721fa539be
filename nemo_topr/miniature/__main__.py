import sys

from nemo_topr.errors import run_refusing
from nemo_topr.miniature.pipeline import main

sys.exit(run_refusing("python -m nemo_topr.miniature", main, sys.argv[1:]))
