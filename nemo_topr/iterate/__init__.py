"""`nemo-topr iterate`: rounds of generate -> curate -> score mu -> train -> export -> eval (the
command's help: `cli`). The driver config (`config`) and the rules between its keys
(`validation`); the processes a stage's command runs in (`processes`); a stage run once, resumed by
its done-marker (`stages`); the base model a run started from (`base_model`); what a round leaves
(`rounds`); the rounds in order (`driver`); the summary of the run (`summary`)."""

from nemo_topr.iterate.cli import main
from nemo_topr.iterate.config import IterateConfig

__all__ = ["IterateConfig", "main"]
