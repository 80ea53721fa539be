import sys

from nemo_topr.miniature.pipeline import main

sys.exit(main())
