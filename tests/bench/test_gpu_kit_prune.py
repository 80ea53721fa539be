"""bench/gpu_kit/prune_fatbin.py on a hand-built ELF64 whose .nv_fatbin holds two containers."""

import importlib.util
import json
import struct
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("prune_fatbin", REPO / "bench/gpu_kit/prune_fatbin.py")
prune_fatbin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prune_fatbin)

ENTRY_HEADER = 64


def entry(kind: int, sm: int, payload: bytes) -> bytes:
    header = bytearray(ENTRY_HEADER)
    struct.pack_into("<HHII", header, 0, kind, 0x101, ENTRY_HEADER, len(payload))
    struct.pack_into("<I", header, 28, sm)
    return bytes(header) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def elf(fatbin: bytes, code: bytes = b"\x90" * 40) -> tuple[bytes, int]:
    """An ELF64 header, some code, the .nv_fatbin section, then the section headers (null,
    .shstrtab, .nv_fatbin). Returns the file and the section's offset."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    fatbin_off = 64 + len(code)
    names_off = fatbin_off + len(fatbin)
    shoff = names_off + len(names)
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)

    def section(name: int, offset: int, size: int) -> bytes:
        out = bytearray(64)
        struct.pack_into("<I", out, 0, name)
        struct.pack_into("<QQ", out, 0x18, offset, size)
        return bytes(out)

    sections = section(0, 0, 0) + section(1, names_off, len(names)) + section(11, fatbin_off, len(fatbin))
    return bytes(header) + code + fatbin + names + sections, fatbin_off


FATBIN = (container(entry(2, 80, b"A" * 32), entry(2, 90, b"B" * 32), entry(1, 120, b"C" * 16))
          + b"\0" * 8  # padding between containers, as in real libraries
          + container(entry(2, 90, b"D" * 16), entry(2, 100, b"E" * 16)))


def test_prune_zeroes_other_architectures_and_keeps_sm90_and_everything_else(tmp_path):
    data, offset = elf(FATBIN)
    lib = tmp_path / "libx.so"
    lib.write_bytes(data)

    report = prune_fatbin.prune(lib, keep_sm=90)

    pruned = lib.read_bytes()
    expected_fatbin = (container(entry(2, 80, bytes(32)), entry(2, 90, b"B" * 32), entry(1, 120, bytes(16)))
                       + b"\0" * 8 + container(entry(2, 90, b"D" * 16), entry(2, 100, bytes(16))))
    assert len(pruned) == len(data)
    assert pruned[:offset] == data[:offset] and pruned[offset + len(FATBIN):] == data[offset + len(FATBIN):]
    assert pruned[offset:offset + len(FATBIN)] == expected_fatbin
    assert report["kept"] == {"elf sm_90": 48}
    assert report["zeroed"] == {"elf sm_80": 32, "ptx sm_120": 16, "elf sm_100": 16}
    assert report["zeroed_bytes"] == 64
    json.dumps(report)  # the command line prints it as JSON


def test_prune_refuses_a_library_without_the_kept_architecture_and_writes_nothing(tmp_path):
    data, _ = elf(container(entry(2, 80, b"A" * 32), entry(2, 100, b"E" * 16)))
    lib = tmp_path / "libx.so"
    lib.write_bytes(data)

    with pytest.raises(ValueError, match="no sm_90 entry"):
        prune_fatbin.prune(lib, keep_sm=90)
    assert lib.read_bytes() == data


def test_prune_refuses_a_file_without_a_fatbin_section(tmp_path):
    data, _ = elf(b"")
    lib = tmp_path / "libx.so"
    lib.write_bytes(data.replace(b".nv_fatbin", b".rodata\0\0\0"))

    with pytest.raises(ValueError, match="no .nv_fatbin section"):
        prune_fatbin.prune(lib, keep_sm=90)
