"""What the schema check reads of Megatron-Bridge, kept as data: its config sections' fields and
their annotations, and the dtype and activation names Bridge converts.

`plan`, `submit` and the iterate driver check a config's keys against Bridge's dataclasses
(`nemo_topr.training.schema`) but build nothing from them, and importing Bridge costs ~8 CPU-s a
start. So they read ``bridge_schema.json``, written from the pinned Bridge by

    python -m nemo_topr.training.bridge_schema

and checked against the installed Bridge by ``tests/training/test_bridge_schema.py``. Where the
installed megatron-bridge or megatron-core is not the version the file was written from, the
check imports Bridge's classes themselves (`live_schema`), so it never judges a config against
another version's fields.

The file rebuilds each dataclass with its field names and its annotations, in the terms the
schema check judges: the scalar types, None, Any, ``torch.dtype``, ``Literal`` choices, unions
and nested dataclasses; any other annotation (a callable, an enum, a container) becomes a class
of the same name, which the check, as with the original, leaves to Bridge's setter.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nemo_topr import installed_version

SNAPSHOT = Path(__file__).with_name("bridge_schema.json")
PACKAGES = ("megatron-bridge", "megatron-core")
SCALARS = {"bool": bool, "int": int, "float": float, "str": str, "None": type(None), "Any": Any,
           "torch.dtype": torch.dtype}


@dataclass(frozen=True)
class BridgeSchema:
    sections: dict[str, type | None]  # each section of a run config -> the dataclass it lands on
    dtype_names: frozenset[str]  # the names Bridge converts to a torch dtype (activation_map.DTYPE_MAP)
    activation_names: frozenset[str]  # ... and to an activation function (ACTIVATION_FUNC_MAP)


def installed_versions() -> dict[str, str | None]:
    return {package: installed_version(package) for package in PACKAGES}


def live_schema() -> BridgeSchema:
    """Bridge's own classes and tables (imports Megatron-Bridge)."""
    from nemo_topr.model import cpu_runtime

    cpu_runtime.import_bridge()
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.utils.activation_map import ACTIVATION_FUNC_MAP, DTYPE_MAP

    from nemo_topr.training.data import ToprDatasetConfig

    classes = {name: dataclass_in(hint) for name, hint in typing.get_type_hints(ConfigContainer).items()
               if not name.startswith("_")}
    return BridgeSchema({**classes, "model": GPTModelProvider, "dataset": ToprDatasetConfig},
                        frozenset(DTYPE_MAP), frozenset(ACTIVATION_FUNC_MAP))


def dataclass_in(hint: Any) -> type | None:
    """The dataclass an annotation names (alone, or in an Optional/Union), else None."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return next((m for m in members if isinstance(m, type) and dataclasses.is_dataclass(m)), None)


def encode(schema: BridgeSchema) -> dict[str, Any]:
    """`schema` as JSON data: the classes by their qualified name, each field's annotation as a
    tree (see the module's docstring)."""
    classes: dict[str, Any] = {}

    def encode_class(cls: type) -> str:
        key = f"{cls.__module__}.{cls.__qualname__}"
        if key not in classes:
            classes[key] = None  # a class that refers to itself is encoded once
            hints = typing.get_type_hints(cls)
            classes[key] = {"module": cls.__module__, "qualname": cls.__qualname__, "fields": {
                field.name: encode_hint(hints[field.name]) for field in dataclasses.fields(cls)
                if not field.name.startswith("_")}}
        return key

    def encode_hint(hint: Any) -> Any:
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            return {"union": [encode_hint(member) for member in typing.get_args(hint)]}
        if origin is typing.Literal:
            choices = list(typing.get_args(hint))
            if not all(choice is None or isinstance(choice, (bool, int, float, str)) for choice in choices):
                raise TypeError(f"a Literal of other than JSON scalars: {hint}")
            return {"literal": choices}
        name = next((name for name, scalar in SCALARS.items() if hint is scalar), None)
        if name is not None:
            return name
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return {"dataclass": encode_class(hint)}
        return {"other": getattr(hint, "__name__", str(hint))}

    sections = {name: None if cls is None else encode_class(cls) for name, cls in schema.sections.items()}
    return {"versions": installed_versions(), "sections": sections, "classes": dict(sorted(classes.items())),
            "dtype_names": sorted(schema.dtype_names), "activation_names": sorted(schema.activation_names)}


def decode(data: dict[str, Any]) -> BridgeSchema:
    """The BridgeSchema `encode` wrote: each class rebuilt as a dataclass of the same module, name,
    fields and annotations."""
    built: dict[str, type] = {}

    def build_class(key: str) -> type:
        if key not in built:
            spec = data["classes"][key]
            cls = dataclasses.make_dataclass(spec["qualname"].rsplit(".", 1)[-1],
                                             [(name, Any, dataclasses.field(default=None)) for name in spec["fields"]],
                                             module=spec["module"])
            cls.__qualname__ = spec["qualname"]
            built[key] = cls  # before its annotations: a field may name its own class
            cls.__annotations__ = {name: build_hint(hint) for name, hint in spec["fields"].items()}
        return built[key]

    def build_hint(hint: Any) -> Any:
        if isinstance(hint, str):
            return SCALARS[hint]
        (kind, value), = hint.items()
        if kind == "union":
            return typing.Union[tuple(build_hint(member) for member in value)]
        if kind == "literal":
            return typing.Literal[tuple(value)]
        if kind == "dataclass":
            return build_class(value)
        return type(value, (), {})

    sections = {name: None if key is None else build_class(key) for name, key in data["sections"].items()}
    return BridgeSchema(sections, frozenset(data["dtype_names"]), frozenset(data["activation_names"]))


@functools.cache
def load() -> BridgeSchema:
    """The schema from bridge_schema.json where the installed Bridge is the one it was written from,
    else Bridge's own (`live_schema`)."""
    data = json.loads(SNAPSHOT.read_text())
    return decode(data) if data["versions"] == installed_versions() else live_schema()


def main() -> int:
    from nemo_topr.model.quiet import quiet_known_noise

    quiet_known_noise()
    SNAPSHOT.write_text(json.dumps(encode(live_schema()), indent=1) + "\n")
    print(f"wrote {SNAPSHOT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
