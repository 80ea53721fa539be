"""The headline rows (figure, value, spread, target, met or missed) and RESULTS.md."""

from __future__ import annotations

from pathlib import Path

STEP_TARGET, LOGPROB_TARGET, PADDING_TARGET, SCORING_TARGET = 1.02, 0.10, 0.03, 2.5
# shared-prefix packing (issue 18), judged on the 8-shot workloads: fewer positions, faster step
SHARED_TOKENS_TARGET, SHARED_STEP_TARGET = 5.0, 3.0


def _spread(s: dict, scale: float = 1.0, digits: int = 3) -> str:
    return f"{s['q1'] * scale:.{digits}f}–{s['q3'] * scale:.{digits}f} (n={s['n']})"


def _row(section, figure, value, spread, target, met, notes) -> dict:
    status = "info" if met is None else ("met" if met else "MISSED")
    return {"section": section, "figure": figure, "value": value, "spread": spread, "target": target,
            "status": status, "notes": notes}


def _step_rows(entries: list[dict]) -> list[dict]:
    rows = []
    for r in entries:
        b, cost = r["batch"], r["step_cost"]
        direct, control = cost["cpu"]["ratio_b_over_a"], cost["sft_over_sft_control"]
        loss = cost["loss_only"]["cpu"]
        name = f"{r['model']} ({r['parameters'] / 1e6:.2f}M params, {r['num_layers']}L h{r['hidden_size']} "\
               f"V{r['vocab_size']}), TP={r['tp']}"
        rows.append(_row(
            "1 step cost", f"TOPR / SFT step time, {name}", f"{cost['decomposed_ratio']:.4f}",
            f"direct {direct['median']:.3f} [{_spread(direct)}]; A/A control {control['median']:.3f} "
            f"[{_spread(control)}]", f"≤ {STEP_TARGET}", cost["decomposed_ratio"] <= STEP_TARGET,
            f"{b['microbatches']}×{b['rows_per_microbatch']} rows of {b['seq_length']}, {b['sequences']} seqs; "
            f"SFT step {cost['cpu']['a']['median']:.3f} s CPU; loss alone (fwd+bwd): SFT "
            f"{1e3 * loss['a']['median'] / b['microbatches']:.2f} ms, TOPR {1e3 * loss['b']['median'] / b['microbatches']:.2f} "
            f"ms per micro-batch; value = 1 + (TOPR loss − SFT loss) / SFT step"))
    for r in entries:
        ratio = r["scoring"]["cpu"]["ratio_b_over_a"]
        rows.append(_row(
            "4 μ scoring", f"score-logprobs / training tokens/s, {r['model']}, TP={r['tp']}",
            f"{ratio['median']:.2f}", _spread(ratio, digits=2), f"≥ {SCORING_TARGET}", ratio["median"] >= SCORING_TARGET,
            f"forward-only {r['scoring']['scoring_tokens_per_cpu_s']:.0f} vs forward+backward "
            f"{r['scoring']['training_tokens_per_cpu_s']:.0f} tokens per CPU-second"))
    return rows


def _worst_rank(entry: dict, path: str, key: str) -> dict:
    return max((rank[path][key] for rank in entry["ranks"]), key=lambda s: s["median"])


def _logprob_rows(entries: list[dict]) -> list[dict]:
    rows = []
    for e in entries:
        ours, naive = _worst_rank(e, "megatron", "extra_over_logits"), _worst_rank(e, "naive", "extra_over_logits")
        time_ratio = max((rank["naive_over_megatron_cpu_time"] for rank in e["ranks"]), key=lambda s: s["median"])
        mib = e["logits_bytes"] / 2**20
        note = (f"{e['tokens']} tokens × V {e['vocab']} ({e['dtype']}), logits {mib:.0f} MiB per rank; naive "
                f"gather+log_softmax: {naive['median']:.2f}× logits extra; naive/labels-path time "
                f"{time_ratio['median']:.2f}×")
        if e["dtype"] == "bfloat16":
            note += ("; the labels path upcasts bf16 logits to an fp32 copy it keeps as the softmax "
                     "(Megatron-Core cross_entropy.py:25, upstream) — see docs/performance.md")
        rows.append(_row("2 log-prob path", f"labels-path extra peak memory / logits, TP={e['tp']}, {e['dtype']}",
                         f"{ours['median']:.3f}", _spread(ours), f"≤ {LOGPROB_TARGET}",
                         ours["median"] <= LOGPROB_TARGET, note))
    return rows


def _packing_rows(packing: dict) -> list[dict]:
    rows = []
    for name, entry in packing.items():
        for tiny, model in zip(entry["tiny_tokenizer"]["by_seq_length"],
                               entry["llama3_length_model"]["by_seq_length"], strict=True):
            shares = [s["packed_padding_share"] for s in (tiny, model) if s["sequences"]]
            value = " / ".join("n/a" if not s["sequences"] else f"{100 * s['packed_padding_share']:.2f} %"
                               for s in (tiny, model))
            notes = []
            for label, s in (("tiny", tiny), ("Llama-3 model", model)):
                if not s["sequences"]:
                    notes.append(f"{label}: all {s['dropped_too_long']} sequences longer than {s['seq_length']}")
                    continue
                bound = "= lower bound" if s["packed_rows"] == s["lower_bound_rows"] else \
                    f"lower bound {s['lower_bound_rows']}"
                notes.append(f"{label}: {s['packed_rows']} rows ({bound}), padded {100 * s['padded_padding_share']:.1f} %, "
                             f"padded to batch max {100 * s['padded_to_batch_max_padding_share']:.1f} %"
                             + (f", {s['dropped_too_long']} too long" if s["dropped_too_long"] else ""))
            sweep = {int(L): share for L, share in entry["llama3_length_model"]["row_length_sweep"].items()}
            if any(share > PADDING_TARGET for share in shares):
                fitting = [L for L, share in sweep.items() if share <= PADDING_TARGET]
                best = min(sweep, key=sweep.get)
                notes.append(f"Llama-3 model reaches ≤ 3 % first at row length {min(fitting)} "
                             f"({100 * sweep[min(fitting)]:.2f} %)" if fitting else
                             f"no row length {min(sweep)}-{max(sweep)} (step 512) reaches ≤ 3 % with the Llama-3 "
                             f"model; best {best} ({100 * sweep[best]:.2f} %)")
            rows.append(_row("3 packing", f"padding share packed, {name} @ {tiny['seq_length']} (tiny / Llama-3 model)",
                             value, "deterministic", f"≤ {100 * PADDING_TARGET:.0f} %",
                             all(s <= PADDING_TARGET for s in shares) if shares else None, "; ".join(notes)))
    return rows


def _pipeline_rows(p: dict) -> list[dict]:
    per_s = p["records_per_cpu_second"]
    stages = ", ".join(f"{stage} {per_s[stage]:,.0f}/s" for stage in ("validate", "tokenize", "pack", "collate"))
    return [
        _row("5 data pipeline", f"records/s validate+tokenize+pack+collate, GSM8K ({p['records']} records)",
             f"{per_s['total']:,.0f}", _spread(p["cpu_seconds"]["total"], digits=2) + " s", "—", None, stages),
        _row("5 data pipeline", "load_records / bare json.loads", f"{p['validate_over_json_loads']['median']:.2f}",
             _spread(p["validate_over_json_loads"], digits=2), "—", None, "validation overhead"),
        _row("5 data pipeline", "tokenize_records / bare batched tokenizer call",
             f"{p['tokenize_over_bare_tokenizer']['median']:.2f}",
             _spread(p["tokenize_over_bare_tokenizer"], digits=2), "—", None,
             "chat-template rendering of each prompt + bookkeeping"),
    ]


def _startup_rows(entries: list[dict]) -> list[dict]:
    rows = []
    for r in entries:
        cpu, wall = r["cpu"], r["wall"]
        rows.append(_row("6 start-up", f"launch to first training step, CPU s imported / HF start ({r['model']}, "
                         f"{r['parameters'] / 1e6:.2f} M params)", f"{cpu['imported_over_hf']['median']:.2f}",
                         _spread(cpu["imported_over_hf"], digits=2), "—", None,
                         f"CPU s: HF {cpu['hf_start_seconds']['median']:.1f}, imported "
                         f"{cpu['imported_start_seconds']['median']:.1f}; wall ratio "
                         f"{wall['imported_over_hf']['median']:.2f}; one-off import {r['import_wall_seconds']:.1f} s wall"))
    return rows


def _gpu_rows(g: dict) -> list[dict]:
    if g.get("skipped"):
        return [_row("GPU", "8B-shaped TOPR vs SFT, BF16/FP8, tokens/s and MFU", "not measured", "—",
                     f"≤ {STEP_TARGET}", None, g["reason"])]
    rows = []
    for r in g.get("runs", []):
        attention = f", {r['attention_backend']} attention" if r.get("attention_backend", "auto") != "auto" else ""
        shape = (f"{r['precision']}, {r['layers']}-layer 8B-shaped{attention}, {r['rows']}×{r['seq_length']} × "
                 f"{r['microbatches']} mb")
        sft = f"SFT {r['sft_tokens_per_s']:,.0f} tokens/s, MFU {_pct(r['sft_mfu'])}; TE {r['transformer_engine']}"
        if r["topr_error"]:
            error = r["topr_error"].strip().splitlines()[-1]
            rows.append(_row("GPU", f"TOPR / SFT step time, {shape}", "TOPR step FAILED", "—", f"≤ {STEP_TARGET}",
                             False, f"{sft}; TOPR: {error}"))
            continue
        ratio = r["topr_over_sft_time"]
        rows.append(_row("GPU", f"TOPR / SFT step time, {shape}", f"{ratio['median']:.3f}", _spread(ratio),
                         f"≤ {STEP_TARGET}", ratio["median"] <= STEP_TARGET,
                         f"{sft}; TOPR {r['topr_tokens_per_s']:,.0f} tokens/s, MFU {_pct(r['topr_mfu'])}"))
    rows += [_row("GPU", precision, "not run", "—", "—", None, message.strip().splitlines()[-1])
             for precision, message in g.get("errors", {}).items()]
    return rows


def _syncs_rows(s: dict) -> list[dict]:
    topr, asymre, sft = (s[name]["per_microbatch"] for name in ("topr", "asymre", "sft"))
    where = "; ".join(f"{call} ×{count} in {s['microbatches']} micro-batches" for call, count in s["sft"]["where"].items())
    return [_row("6 host syncs", "host-device syncs per micro-batch in the loss, TOPR / AsymRE / SFT (Bridge)",
                 f"{topr:g} / {asymre:g} / {sft:g}", "deterministic", "TOPR ≤ SFT + 1", s["met"],
                 f"counted on CPU by bench.syncs.SyncCounter, forward + backward of the loss alone, "
                 f"{s['microbatches']} micro-batches; SFT: {where or 'none'}")]


def shared_prefix_rows(s: dict) -> list[dict]:
    """Section 7 (bench.shared_prefix): per workload, positions, padding, step and mu-scoring
    time, unshared over shared; the zero-shot chat format is reported, not judged."""
    rows = []
    for name, e in s.items():
        if name == "environment":
            continue
        judged = e["prompt_format"] == "8shot"
        t, timing = e["tokens"], e["timing"]
        lengths = (f"{e['questions']} questions × {e['samples_per_question']} samples, prompt "
                   f"{e['prompt_tokens_mean']:.0f} / completion {e['completion_tokens_mean']:.0f} Llama-3 tokens (mean)")
        rows.append(_row("7 shared prefix", f"positions per optimizer step unshared @ {t['unshared_seq_length']} / "
                         f"shared @ {t['shared_seq_length']}, {name}", f"{t['positions_ratio']:.2f}", "deterministic",
                         f"≥ {SHARED_TOKENS_TARGET:g}",
                         t["positions_ratio"] >= SHARED_TOKENS_TARGET if judged else None,
                         f"{lengths}; rows {t['unshared_rows']} → {t['shared_rows']}, prompt copies per question "
                         f"{t['prompt_copies_per_group']:.2f}; sweep (ratio, padding): " + ", ".join(
                             f"{L}: {v['positions_ratio']:.2f}, {100 * v['shared_padding_share']:.1f} %"
                             for L, v in e["sweep"].items())))
        rows.append(_row("7 shared prefix", f"padding share of shared rows @ {t['shared_seq_length']}, {name}",
                         f"{100 * t['shared_padding_share']:.2f} %", "deterministic",
                         f"≤ {100 * PADDING_TARGET:.0f} %",
                         t["shared_padding_share"] <= PADDING_TARGET if judged else None,
                         f"unshared rows @ {t['unshared_seq_length']}: {100 * t['unshared_padding_share']:.2f} %"))
        tt = timing["tokens"]
        where = (f"{timing['questions']} question(s), {timing['microbatches']['unshared']} rows of "
                 f"{tt['unshared_seq_length']} → {timing['microbatches']['shared']} of {tt['shared_seq_length']} "
                 f"(positions ×{tt['positions_ratio']:.2f} fewer, shared padding "
                 f"{100 * tt['shared_padding_share']:.1f} %)")
        for figure, key in (("TOPR step time", "step"), ("μ scoring time", "scoring")):
            ratio = timing[key]["cpu"]["ratio_b_over_a"]  # shared / unshared
            speedup = 1.0 / ratio["median"]
            rows.append(_row("7 shared prefix",
                             f"{figure} unshared / shared (CPU, tiny Llama, local attention), {name}",
                             f"{speedup:.2f}", f"{1 / ratio['q3']:.2f}–{1 / ratio['q1']:.2f} (n={ratio['n']})",
                             f"≥ {SHARED_STEP_TARGET:g}" if key == "step" else "—",
                             speedup >= SHARED_STEP_TARGET if judged and key == "step" else None,
                             f"{where}; unshared {timing[key]['cpu']['a']['median']:.2f} s CPU"
                             + (f"; scores agree to {timing['scoring_max_relative_difference']:.1e} relative"
                                if key == "scoring" else "")))
        if "step_flex_vs_local_shared" in timing:
            ratio = timing["step_flex_vs_local_shared"]["cpu"]["ratio_b_over_a"]  # local / flex, shared rows
            rows.append(_row("7 shared prefix",
                             f"TOPR step time on shared rows, local attention / FlexCoreAttention (CPU, eager), {name}",
                             f"{ratio['median']:.2f}", f"{ratio['q1']:.2f}–{ratio['q3']:.2f} (n={ratio['n']})", "—",
                             None, f"{where}; FlexCoreAttention's μ scores agree with the unshared ones to "
                             f"{timing['flex_scoring_max_relative_difference']:.1e} relative"))
    return rows


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def headline(results: dict) -> list[dict]:
    builders = {"step": _step_rows, "logprob": _logprob_rows, "packing": _packing_rows, "pipeline": _pipeline_rows,
                "syncs": _syncs_rows, "startup": _startup_rows, "gpu": _gpu_rows,
                "shared_prefix": shared_prefix_rows}
    rows = []
    for section, build in builders.items():
        if section in results:
            rows += build(results[section])
    return sorted(rows, key=lambda row: row["section"])


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def write_markdown(results: dict, path: Path) -> str:
    env = results["environment"]
    lines = [
        "# nemo_topr benchmark results",
        "",
        f"Run {env['date_utc']} on {env['cpu_model']} ({env['cpu_count']} cores, "
        f"{(env['memory_total_bytes'] or 0) / 2**30:.0f} GiB), commit `{(env['git_commit'] or 'unknown')[:12]}`"
        f"{' (tracked files modified)' if env['git_dirty_tracked_files'] else ''}; torch {env['torch']}, "
        f"megatron-core {env['megatron_core']}, megatron-bridge {env['megatron_bridge']}, Python {env['python']}; "
        f"{env['threads_per_process']} torch thread(s) per process; load average at start "
        f"{env['load_average'][0]:.1f}, at end {env['load_average_end'][0]:.1f}; total {env['total_seconds']:.0f} s"
        f"{' (QUICK sizes: smoke test, not results)' if env['quick'] else ''}.",
        "",
        "Each ratio pairs two variants measured alternately in the same process (A B, B A, ...); value = "
        "median of the paired ratios, spread = interquartile range. Times are CPU time of the process "
        "(robust to other load on the shared cores). Method and sizes: bench/README.md; raw numbers: "
        "bench/results/*.json.",
        "",
    ]
    lines += _table(["section", "figure", "value", "spread", "target", "status", "notes"],
                    [[r["section"], r["figure"], r["value"], r["spread"], r["target"], r["status"], r["notes"]]
                     for r in results["headline"]])
    if "logprob" in results:
        lines += ["", "## Log-prob path memory (per rank, median over repetitions)", ""]
        rows = []
        for e in results["logprob"]:
            for rank, r in enumerate(e["ranks"]):
                rows.append([e["tp"], rank, e["dtype"], e["tokens"], e["vocab"], f"{e['logits_bytes'] / 2**20:.0f}",
                             f"{r['megatron']['extra_peak_bytes']['median'] / 2**20:.1f}",
                             f"{r['megatron']['extra_over_logits']['median']:.3f}",
                             f"{r['naive']['extra_peak_bytes']['median'] / 2**20:.1f}",
                             f"{r['naive']['extra_over_logits']['median']:.3f}",
                             f"{r['megatron']['cpu_s']['median']:.2f}", f"{r['naive']['cpu_s']['median']:.2f}"])
        lines += _table(["TP", "rank", "dtype", "tokens", "vocab", "logits MiB", "labels path extra MiB", "× logits",
                         "naive extra MiB", "× logits", "labels path CPU s", "naive CPU s"], rows)
    if "packing" in results:
        lines += ["", "## Packing (padding share of all row positions)", ""]
        rows = []
        for name, entry in results["packing"].items():
            for source in ("tiny_tokenizer", "llama3_length_model", "llama3_tokenizer"):
                if source not in entry:
                    continue
                lengths = entry[source]["lengths"]
                for s in entry[source]["by_seq_length"]:
                    rows.append([name, source, f"{lengths['mean']:.0f} / {lengths['p95']} / {lengths['max']}",
                                 s["seq_length"], s["sequences"], s["dropped_too_long"], s["packed_rows"],
                                 s["lower_bound_rows"], f"{100 * s['packed_padding_share']:.2f}",
                                 f"{100 * s['padded_padding_share']:.1f}",
                                 f"{100 * s['padded_to_batch_max_padding_share']:.1f}"])
        lines += _table(["dataset", "lengths", "mean / p95 / max tokens", "row length", "sequences", "too long",
                         "packed rows", "lower bound", "packed %", "padded %", "padded to batch max %"], rows)
    if "gpu" in results and not results["gpu"].get("skipped"):
        lines += ["", f"## GPU ({results['gpu']['device']})", ""]
        rows = []
        for r in results["gpu"]["runs"]:
            loss = r.get("loss_only", {})
            syncs = loss.get("syncs", {})
            rows.append([r["precision"], r["layers"], r["positions_per_step"], f"{r['model_tflop_per_step']:.1f}",
                         f"{r['sft_step_seconds']:.3f}", f"{r.get('topr_step_seconds', float('nan')):.3f}",
                         _pct(r["sft_mfu"]), _pct(r.get("topr_mfu")), f"{r['max_memory_allocated_gib']:.1f}",
                         f"{loss.get('topr_minus_sft_ms_per_microbatch', float('nan')):.2f}",
                         f"{syncs.get('sft', {}).get('per_microbatch', '—')} / "
                         f"{syncs.get('topr', {}).get('per_microbatch', '—')}"])
        lines += _table(["precision", "layers", "tokens/step", "model TFLOP/step", "SFT s/step", "TOPR s/step",
                         "SFT MFU", "TOPR MFU", "max GiB", "TOPR − SFT loss ms/micro-batch",
                         "host syncs per micro-batch SFT / TOPR"], rows)
        for precision, compared in results["gpu"].get("fp8_minus_bf16", {}).items():
            steps = compared["steps"]
            weights = "same weights" if compared["same_weights"] else "DIFFERENT weights (not comparable)"
            lines.append(f"\n{precision} − bf16, {weights}, same batches, steps 1 and 2: TOPR loss "
                         + ", ".join(f"{step['topr_loss']:+.4f}" for step in steps) + "; gradient norm "
                         + ", ".join(f"{100 * step['grad_norm_relative']:+.2f} %" for step in steps))
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text
