"""The GPU time until stage 2 is ready, from a dry run's sizes and times (dryrun.sh writes its output
as bench/results/gpu_kit_dryrun_<date>.json).

    python3 window_estimate.py SIZES_JSON TIMES_TXT DRYRUN_LOG

The per-call costs are the lease times of past windows on the H200, from their committed logs; the
ready step's unpacking is this CPU's measured time, taken as the GPU machine's (16 idle cores, one
xz stream: one core either way).
"""

import json
import re
import sys

# lease held, seconds: machine start with the base call, then one call per further part
PAST_WINDOWS = {
    "fast (2026-11-26, gpu_h200_2026-11-26_stage2b_log.txt)": {
        "start_and_base": 54.0, "per_part_call": (135.2 - 54.0) / 16,
        "how": "call 1 held 54.0 s; 16 part calls of 49-50 MiB from 54.0 to 135.2 s held"},
    "slow (2026-11-28, gpu_h200_2026-11-28_stage2d_log.txt)": {
        "start_and_base": 100.2, "per_part_call": (531.1 - 100.2) / 6,
        "how": "call 1 held 100.2 s; 6 part calls of 62 MiB from 100.2 to 531.1 s held"},
}
TE_SMOKE_S = 25.0  # TE's wheels, extension and smoke test: 22-25 s on the H200 (stage2b, stage2c logs)
TARGET_S = 240.0


def main() -> None:
    sizes = json.load(open(sys.argv[1]))
    times = [line.split() for line in open(sys.argv[2]) if line.strip()]
    log = open(sys.argv[3]).read()
    unpack = [int(s) for s in re.findall(r"payload unpacked and checked in (\d+) s", log)]
    if len(unpack) != 1:
        sys.exit(f"{sys.argv[3]}: expected one 'payload unpacked and checked' line, found {len(unpack)}")
    parts = len(sizes["parts_bytes"]) - sizes["first_part_with_base"]  # part calls after the base
    estimates = {}
    for name, rate in PAST_WINDOWS.items():
        seconds = rate["start_and_base"] + parts * rate["per_part_call"] + unpack[0] + TE_SMOKE_S
        estimates[name] = {
            "seconds": round(seconds, 1), "within_target": seconds <= TARGET_S,
            "arithmetic": f"{rate['start_and_base']} (start and base) + {parts} x {rate['per_part_call']:.1f} "
                          f"(part calls) + {unpack[0]} (unpack, CPU-measured) + {TE_SMOKE_S} (TE smoke test) "
                          f"= {seconds:.1f} s", "rates_from": rate["how"]}
    calls = [{"call": int(k), "bytes": int(b), "exit": int(rc), "dry_run_seconds_on_cpu": float(s)}
             for k, b, rc, s in times]
    summary = (f"stage 2 in {parts} call(s) after the base; largest call "
               f"{max(c['bytes'] for c in calls) / 2**20:.1f} MiB of 64; ready after "
               + " / ".join(f"{e['seconds']:.0f} s ({n.split()[0]} day)" for n, e in estimates.items())
               + f" of GPU time (target {TARGET_S:.0f} s)")
    print(json.dumps({**sizes, "dry_run": calls, "estimate": {
        "target_seconds": TARGET_S, "unpack_seconds_on_cpu": unpack[0], "by_past_window": estimates,
        "summary": summary}}, indent=1))


if __name__ == "__main__":
    main()
