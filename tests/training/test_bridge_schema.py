"""nemo_topr/training/bridge_schema.py: the kept copy of what the schema check reads of Bridge is
the installed Bridge's, judges every field as Bridge's own class does, and spares `plan`,
`submit` and the iterate driver Bridge's import."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import typing

import pytest

from nemo_topr.training import bridge_schema, schema
from tests.conftest import REPO, checkout_env

REGENERATE = "the installed Bridge differs from bridge_schema.json: python -m nemo_topr.training.bridge_schema"

# a value of every kind a YAML or an override gives a key
PROBES = (None, True, False, 0, 3, -1, 1.5, math.nan, "bf16", "x", [1], {"a": 1})


@pytest.fixture(scope="module")
def live():
    return bridge_schema.live_schema()


def test_the_kept_schema_is_the_installed_bridges(live):
    kept = json.loads(bridge_schema.SNAPSHOT.read_text())
    assert kept["versions"] == bridge_schema.installed_versions(), REGENERATE
    assert bridge_schema.encode(live) == kept, REGENERATE


def _classes(sections: dict[str, type | None]) -> dict[str, type]:
    """Every dataclass the sections' keys reach (their fields but the private `_` ones), by
    qualified name."""
    found: dict[str, type] = {}
    todo = [cls for cls in sections.values() if cls is not None]
    while todo:
        cls = todo.pop()
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name not in found:
            found[name] = cls
            hints = typing.get_type_hints(cls)
            todo += [nested for field in dataclasses.fields(cls) if not field.name.startswith("_")
                     if (nested := bridge_schema.dataclass_in(hints[field.name])) is not None]
    return found


def test_each_rebuilt_field_is_judged_as_bridges_own(live):
    """Bridge's classes are the oracle: for every field of every class a section reaches, the
    rebuilt one has the same name and its annotation accepts, refuses and describes each probe
    value as the original's does."""
    kept = bridge_schema.decode(json.loads(bridge_schema.SNAPSHOT.read_text()))
    assert {name: cls and cls.__qualname__ for name, cls in kept.sections.items()} == \
        {name: cls and cls.__qualname__ for name, cls in live.sections.items()}
    theirs, ours = _classes(live.sections), _classes(kept.sections)
    assert sorted(ours) == sorted(theirs)
    judged = 0
    for name, cls in theirs.items():
        names = [field.name for field in dataclasses.fields(cls) if not field.name.startswith("_")]
        assert [field.name for field in dataclasses.fields(ours[name])] == names, name
        hints, rebuilt = typing.get_type_hints(cls), typing.get_type_hints(ours[name])
        for field in names:
            original, copy = hints[field], rebuilt[field]
            assert schema.expected(copy) == schema.expected(original), (name, field)
            assert schema.admits_none(copy) == schema.admits_none(original), (name, field)
            assert [schema.matches(v, copy) for v in PROBES] == [schema.matches(v, original) for v in PROBES]
            nested = bridge_schema.dataclass_in(original)
            assert getattr(bridge_schema.dataclass_in(copy), "__qualname__", None) == getattr(nested, "__qualname__",
                                                                                              None)
            judged += 1
    model_keys = [field for field in dataclasses.fields(live.sections["model"]) if not field.name.startswith("_")]
    assert judged > len(model_keys) > 300  # every section's, and GPTModelProvider's hundreds among them
    assert (kept.dtype_names, kept.activation_names) == (live.dtype_names, live.activation_names)
    assert {"bf16", "float32"} <= kept.dtype_names and {"silu", "gelu"} <= kept.activation_names


def test_another_installed_bridge_is_read_from_bridge_itself(live, monkeypatch):
    bridge_schema.load.cache_clear()
    try:
        with monkeypatch.context() as patched:
            patched.setattr(bridge_schema, "installed_versions", lambda: {"megatron-bridge": "0.7.0",
                                                                          "megatron-core": "0.19.2"})
            assert bridge_schema.load().sections["model"] is live.sections["model"]
    finally:
        bridge_schema.load.cache_clear()
    kept = bridge_schema.load().sections["model"]  # the pinned versions again: the kept copy
    assert kept is not live.sections["model"] and kept.__qualname__ == "GPTModelProvider"


CHECK_WITHOUT_BRIDGE = r'''
import json, sys
from nemo_topr import cli
from nemo_topr.training.config import check_values, compose
from omegaconf import OmegaConf
planned = cli.main(["plan", "llama31_8b_bf16", "--nodes", "1"])
try:
    check_values(OmegaConf.to_container(compose("tiny_cpu", ["model.num_layerz=2"]), resolve=True))
    key = None
except Exception as error:
    key = error.key
imported = sorted(m for m in sys.modules if m.startswith("megatron"))
print(json.dumps({"planned": planned, "refused": key, "imported": imported}))
'''


def test_plan_checks_every_key_without_importing_megatron():
    """In a fresh interpreter, as a user's `plan` or `submit` starts: a preset planned, a typo
    refused by its key, and no Megatron module imported."""
    proc = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_BRIDGE], cwd=REPO, env=checkout_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {"planned": 0, "refused": "model.num_layerz.unknown", "imported": []}
