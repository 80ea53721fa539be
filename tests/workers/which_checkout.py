"""Print where this process imported ``nemo_topr`` from (tests/test_harness.py).

    python which_checkout.py
"""

import nemo_topr

print(f"nemo_topr imported from {nemo_topr.__file__}", flush=True)
