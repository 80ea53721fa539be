"""Zero, in place, the device code that a lent GPU cannot run, so that the carry compresses.

A CUDA library's `.nv_fatbin` section holds one cubin per GPU architecture for every kernel
(TE 2.17.1's core library: sm_75 to sm_120, 633 MiB, of which sm_90's is 83 MiB). An H100 or
H200 loads only its sm_90 cubins, so the payload of every other entry is overwritten with zeros:
headers, sizes and offsets stay as they were, the file keeps its length, and the entries for the
kept architecture stay byte for byte (checked after writing). The driver picks an entry by the
architecture named in its header; a zeroed payload is never read on an sm_90 device.

    python3 prune_fatbin.py LIBRARY [--keep-sm 90]   (prints bytes per architecture, as JSON)
"""

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "elf"}


def fatbin_section(data: bytes) -> tuple[int, int]:
    """Offset and size of the ELF64 section named .nv_fatbin."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    names_off, = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        header = shoff + i * shentsize
        name_idx, = struct.unpack_from("<I", data, header)
        name = data[names_off + name_idx:data.index(b"\0", names_off + name_idx)]
        if name == b".nv_fatbin":
            offset, size = struct.unpack_from("<QQ", data, header + 0x18)
            return offset, size
    raise ValueError("no .nv_fatbin section")


def entries(section: memoryview):
    """(kind, sm, payload start, payload end) of every entry, in section order."""
    pos = 0
    while pos + 16 <= len(section):
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", section, pos)
        if magic != FATBIN_MAGIC:  # containers are 8-byte aligned, with padding between them
            pos += 8
            continue
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHII", section, entry)
            sm, = struct.unpack_from("<I", section, entry + 28)
            yield KINDS.get(kind, str(kind)), sm, entry + entry_header, entry + entry_header + payload
            entry += entry_header + payload
        pos = end


def prune(path: Path, keep_sm: int) -> dict:
    data = bytearray(path.read_bytes())
    offset, size = fatbin_section(data)
    section = memoryview(data)[offset:offset + size]
    kept, zeroed, kept_hash = {}, {}, hashlib.sha256()
    for kind, sm, start, end in entries(section):
        key = f"{kind} sm_{sm}"
        if sm == keep_sm:
            kept[key] = kept.get(key, 0) + end - start
            kept_hash.update(section[start:end])
        else:
            zeroed[key] = zeroed.get(key, 0) + end - start
            section[start:end] = bytes(end - start)
    if not kept:
        raise ValueError(f"{path}: no sm_{keep_sm} entry in .nv_fatbin: nothing would run")
    section.release()
    path.write_bytes(data)
    check = hashlib.sha256()
    section = memoryview(path.read_bytes())[offset:offset + size]
    for _, sm, start, end in entries(section):
        if sm == keep_sm:
            check.update(section[start:end])
    if check.digest() != kept_hash.digest():
        raise ValueError(f"{path}: the kept sm_{keep_sm} entries changed while writing")
    return {"file": path.name, "bytes": len(data), "fatbin_bytes": size,
            "kept": kept, "zeroed": zeroed, "zeroed_bytes": sum(zeroed.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", type=Path)
    parser.add_argument("--keep-sm", type=int, default=90)
    args = parser.parse_args()
    try:
        print(json.dumps(prune(args.library, args.keep_sm)))
    except ValueError as error:
        sys.exit(f"prune_fatbin: {error}")


if __name__ == "__main__":
    main()
