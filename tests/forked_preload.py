"""What tests/forked.py's fork server imports once: Megatron-Bridge, as a verb on CPU imports it
(``cpu_runtime.import_bridge``), with its known start-up noise quiet."""

from nemo_topr.model.cpu_runtime import import_bridge
from nemo_topr.model.quiet import quiet_known_noise

quiet_known_noise()
import_bridge()
