"""The peer benchmark's report (bench/peer_bench.py): peer.md with its table, ratios and the
phases of Cutline's restarts, and the PNG plots, from the figures of peer.json."""

from __future__ import annotations

from pathlib import Path


def write_report(results: dict, out: Path, systems: tuple[str, ...]) -> None:
    """peer.md with the table and ratios, and the two PNG plots (``systems`` in this order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = results["sizes"]
    rows = [
        "| state | system | records/s | batch p50 / p99 ms | written MiB/min | upload per "
        "checkpoint p50 / p95 MiB (full state) | storage at the end MiB | "
        "peak memory MiB: resident (anonymous) | "
        "restart to 1st batch s: from process start / after JVM up | standby takeover: kill "
        "to 1st batch s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        for system in systems:
            r = size["systems"].get(system)
            if not r:
                continue
            mib = 2**20
            checkpoint = ""  # Flink: its checkpoints' own durations, beside their intervals
            if r.get("checkpoint_ms_p50") is not None:
                checkpoint = (
                    f" (checkpoint {_fmt(r['checkpoint_ms_p50'])} / "
                    f"{_fmt(r.get('checkpoint_ms_p99'))})"
                )
            upload = "n/a"
            if r.get("upload_bytes_p50") is not None:
                upload = (
                    f"{_fmt(r['upload_bytes_p50'], mib)} / {_fmt(r['upload_bytes_p95'], mib)} "
                    f"({_fmt(r.get('full_state_bytes_max'), mib)})"
                )
            rows.append(
                f"| {size['size_mib']} MiB ({size['keys']:,} keys) | {system} | "
                f"{_fmt(r.get('records_per_s'))} | {_fmt(r.get('batch_ms_p50'))} / "
                f"{_fmt(r.get('batch_ms_p99'))}{checkpoint} | "
                f"{_written(r)} | {upload} | "
                f"{_fmt(r.get('storage_bytes_end'), mib)} | "
                f"{_fmt(r.get('peak_rss_bytes'), mib)} ({_fmt(r.get('peak_anon_bytes'), mib)}) | "
                f"{_fmt(r.get('restart_to_first_batch_s'))} / "
                f"{_fmt(r.get('restart_after_jvm_up_s'))} | "
                f"{_fmt(r.get('takeover_to_first_batch_s'))} |"
            )
    ratios = ["", "Ratios (Cutline / peer; restart: peer / Cutline):", ""]
    for size in sizes:
        s = size["systems"]
        c = s.get("cutline", {})
        for peer in ("spark_python", "spark_tws", "spark_sql", "flink_sql", "flink_blackhole"):
            if peer not in s:
                continue
            p = s[peer]
            tput = _ratio(c.get("records_per_s"), p.get("records_per_s"))
            restart = _ratio(p.get("restart_to_first_batch_s"), c.get("restart_to_first_batch_s"))
            warm = _ratio(p.get("restart_after_jvm_up_s"), c.get("restart_after_jvm_up_s"))
            standby = _ratio(p.get("restart_to_first_batch_s"), c.get("takeover_to_first_batch_s"))
            written = _ratio(c.get("bytes_written_per_min"), p.get("bytes_written_per_min"))
            ratios.append(
                f"- {size['size_mib']} MiB, vs {peer}: throughput {tput}; written per minute "
                f"{written}; restart {restart} faster ({warm} after JVM up); a standby's "
                f"takeover {standby} faster"
            )
    when = sorted(
        {f"{system}: {r['measured_at']}" for size in sizes for system, r in size["systems"].items()
         if r.get("measured_at")}
    )  # fmt: skip
    if when:
        ratios += ["", "Measured (per system, the invocation's end): " + "; ".join(when) + "."]
    phases = ["", "Where Cutline's restart goes (s, from the driver's startup line):", ""]
    for size in sizes:
        timeline = size["systems"].get("cutline", {}).get("restart_phases_s")
        if timeline:
            parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in timeline.items())
            phases.append(f"- {size['size_mib']} MiB: {parts}")
        timeline = size["systems"].get("cutline", {}).get("takeover_phases_s")
        if timeline:
            parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in timeline.items())
            phases.append(
                f"- {size['size_mib']} MiB, a standby's takeover (from the order): {parts}"
            )
    (out / "peer.md").write_text(
        "# Peer benchmark (bench/peer_bench.py)\n\n"
        + results["setup"]
        + "\n\n"
        + "\n".join(rows + ratios + (phases if len(phases) > 3 else []))
        + "\n\n![throughput](peer_throughput.png) ![restart](peer_restart.png)\n"
    )
    for metric, name, label in (
        ("records_per_s", "peer_throughput.png", "records/s (steady state)"),
        ("restart_to_first_batch_s", "peer_restart.png", "restart to first micro-batch (s)"),
    ):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for system in systems:
            points = [
                (size["size_mib"], size["systems"][system][metric])
                for size in sizes
                if size["systems"].get(system, {}).get(metric) is not None
            ]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=system)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("state size (MiB: keys x 150 B of key and value)")
        ax.set_ylabel(label)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)


def _written(r: dict) -> str:
    """MiB written per minute in the sustained phase; a run that never reached it (its backlog
    outlasted the run) shows its whole run's rate instead, marked as such."""
    if r.get("bytes_written_per_min") is not None:
        return _fmt(r["bytes_written_per_min"], 2**20)
    if r.get("bytes_written_total") and r.get("run_minutes"):
        whole = r["bytes_written_total"] / r["run_minutes"]
        return f"n/a (backlog only: {_fmt(whole, 2**20)})"
    return "n/a"


def _fmt(value, unit: float = 1) -> str:
    if value is None:
        return "n/a"
    v = value / unit
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def _ratio(a, b) -> str:
    return f"{a / b:.1f}x" if a and b else "n/a"


if __name__ == "__main__":  # render the report again from a directory's peer.json
    import json
    import sys

    from peer_bench import RESULTS, SYSTEMS

    where = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    write_report(json.loads((where / "peer.json").read_text()), where, SYSTEMS)
