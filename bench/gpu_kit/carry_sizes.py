"""What each call of a GPU window carries (pack.sh writes it to .gpu/kit/sizes.json): the work tree,
the carried paths, their bytes against the 64 MiB a call may carry, and how stage 2's payload was
made (sizes before and after xz, the pruned architectures, the cuDNN stand-ins). Run from the
project root after pack.sh has written .gpu/."""

import argparse
import json
from pathlib import Path

LIMIT_BYTES = 64 * 2**20
SHA = "SHA"  # the window's commit, filled in when the calls are made


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def call(command: str, carry: list[str], tree: int) -> dict:
    carried = {path: tree_bytes(Path(path)) for path in carry}
    total = tree + sum(carried.values())
    return {"command": command, "carry": carry, "carried_bytes": carried, "bytes": total,
            "fits": total <= LIMIT_BYTES}


def calls(parts: int, tree: int, first_part_with_base: bool) -> list[dict]:
    """The base (with part 1 where it fits beside it), one call per further part, the call with the
    last part making stage 2 ready and going on with the items; a further call only continues them."""
    base = "bash .gpu/kit/install-base.sh && python3 -m compileall -q -j 16 /tmp/site"
    out, carry, command = [], [".gpu/base"], base
    for k in range(1, parts + 1):
        if k > 1 or not first_part_with_base:
            out.append(call(command, [*carry, ".gpu/kit"], tree))
            carry, command = [], ""
        carry.append(f".gpu/s{k}")
        command += (" && " if command else "") + f"bash .gpu/kit/window.sh stage {k}"
    # 600 s a call: staging and ready take about a minute of it
    command += f" && bash .gpu/kit/window.sh ready && bash .gpu/kit/window.sh items {SHA} 480"
    out.append(call(command, [*carry, ".gpu/kit"], tree))
    out.append(call(f"bash .gpu/kit/window.sh items {SHA} 560", [".gpu/kit"], tree))  # or what the lease has left
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree-bytes", type=int, required=True, help="git ls-files (tracked and untracked)")
    parser.add_argument("--payload", type=Path, required=True, help="the payload folder before tar and xz")
    parser.add_argument("--archive", type=Path, required=True, help="the payload as one .tar.xz")
    parser.add_argument("--xz-seconds", type=float, required=True)
    parser.add_argument("--prune", type=Path, required=True, help="prune_fatbin.py's JSON line")
    parser.add_argument("--stand-ins", type=Path, required=True, help="the cuDNN libraries carried as stand-ins")
    parser.add_argument("--first-part-with-base", action="store_true", help="part 1 rides with the base in call 1")
    args = parser.parse_args()
    parts = sorted(Path(".gpu").glob("s[0-9]*/part.*"), key=lambda p: int(p.parent.name[1:]))
    raw = tree_bytes(args.payload)
    big = {str(f.relative_to(args.payload)): f.stat().st_size
           for f in sorted(args.payload.rglob("*")) if f.is_file() and f.stat().st_size > 2**20}
    archive = args.archive.stat().st_size
    print(json.dumps({
        "limit_bytes": LIMIT_BYTES, "tree_bytes": args.tree_bytes,
        "payload": {"raw_bytes": raw, "files_over_1_MiB": big, "xz_bytes": archive, "ratio": raw / archive,
                    "compressor": "xz -9e -T1", "xz_seconds_on_this_cpu": args.xz_seconds},
        "prune": json.loads(args.prune.read_text()),
        "cudnn_stand_ins": args.stand_ins.read_text().split(),
        "parts_bytes": [p.stat().st_size for p in parts],
        "first_part_with_base": args.first_part_with_base,
        "calls": calls(len(parts), args.tree_bytes, args.first_part_with_base),
    }, indent=1))


if __name__ == "__main__":
    main()
