"""The text report of `nemo-topr plan`: checks, the memory table with its arithmetic, notes and
the verdict."""

from __future__ import annotations

from nemo_topr.model.architecture import Architecture
from nemo_topr.cluster.checks import Finding
from nemo_topr.cluster.layout import Layout
from nemo_topr.cluster.memory import GIB, MemoryEstimate, optimizer_bytes_per_param


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def format_memory(estimate: MemoryEstimate) -> list[str]:
    """The per-GPU table (one column per stage) and the worst stage's arithmetic."""
    names = [s.name for s in estimate.stages]
    worst = estimate.worst
    row = "  {:<46}{:<50}" + "{:>8}" * len(names)
    which = f"worst stage: {worst.name}" if len(names) > 1 else "one pipeline stage"
    out = [f"memory per GPU, GiB ({which})", row.format("item", "formula", *names)]
    for lines in zip(*(estimate.lines[n] for n in names)):
        out.append(row.format(lines[0].name, lines[0].formula, *(f"{l.bytes / GIB:.2f}" for l in lines)))
    out.append(row.format("total", "", *(f"{estimate.total(n) / GIB:.2f}" for n in names)))
    out.append(f"arithmetic{f', {worst.name} stage' if len(names) > 1 else ''} (bytes)")
    out.append(f"  parameters on one GPU = {worst.params_arithmetic}")
    out += [f"  {line.name} = {line.arithmetic} = {line.bytes:,}" for line in estimate.lines[worst.name]]
    return out


def optimizer_notes(lay: Layout, estimate: MemoryEstimate) -> list[str]:
    """What the distributed optimizer saves, and what Adam costs over the paper's Adafactor."""
    worst = estimate.worst
    p, adam = worst.params, optimizer_bytes_per_param(lay)
    sharded, replicated = adam * p // lay.dp, adam * p
    current, other = (sharded, replicated) if lay.distributed_optimizer else (replicated, sharded)
    other_total = estimate.total(worst.name) - current + other
    moments = 8 * p // (lay.dp if lay.distributed_optimizer else 1)
    return [
        f"  distributed optimizer: Adam states {_gib(sharded)} sharded over DP={lay.dp}, {_gib(replicated)} "
        f"replicated; {'without' if lay.distributed_optimizer else 'with'} it a GPU would need "
        f"{_gib(other_total)}",
        f"  Adam replaces the paper's Adafactor (Megatron has none): its exp_avg + exp_avg_sq, 8 B/param = "
        f"{_gib(moments)} here, are what Adafactor (factored second moment, no momentum) avoids",
    ]


def format_report(title: str, arch: Architecture, source: str, lay: Layout, findings: list[Finding],
                  estimate: MemoryEstimate) -> str:
    fp8 = f"FP8 {lay.fp8}/{lay.fp8_recipe}" if lay.fp8 else "FP8 off"
    lines = [
        f"nemo-topr plan: {title} on {lay.nodes} node(s) x {lay.gpus_per_node} GPUs, "
        f"{estimate.capacity_bytes / GIB:g} GiB each",
        f"model      {arch.name} ({source}): {arch.total_params:,} parameters ({arch.total_params / 1e9:.2f} B)",
        f"           {arch.describe()}",
        f"           {arch.params_breakdown()}",
        f"layout     {lay.describe()}",
        f"precision  {'bf16' if lay.half_precision_weights else 'fp32'} weights, "
        f"{'fp32' if lay.grad_reduce_in_fp32 else 'bf16'} main grads, Adam"
        f"{' with the distributed optimizer' if lay.distributed_optimizer else ''}, "
        f"{lay.recompute or 'no'} recompute, {fp8}",
        "checks",
        *(f.format() for f in findings),
        *format_memory(estimate),
        "notes",
        *optimizer_notes(lay, estimate),
        verdict(findings, estimate),
    ]
    return "\n".join(lines)


def verdict(findings: list[Finding], estimate: MemoryEstimate) -> str:
    worst = estimate.worst
    need, have = estimate.total(worst.name), estimate.capacity_bytes
    where = f", {worst.name} pipeline stage" if len(estimate.stages) > 1 else ""
    if estimate.fits:
        memory = f"FITS: {_gib(need)} of {_gib(have)} per GPU ({_gib(have - need)} headroom{where})"
    else:
        memory = f"DOES NOT FIT: {_gib(need)} needed, {_gib(have)} per GPU ({_gib(need - have)} short{where})"
    failed = [f"{f.rule}: {f.fix}" if f.fix else f.rule for f in findings if f.blocking]
    if failed:  # "FITS" first read as a yes for a layout that cannot run (70B on one node)
        return f"verdict: LAYOUT REJECTED ({'; '.join(failed)}); memory, were it accepted: {memory}"
    return f"verdict: {memory}; layout OK"
