#!/usr/bin/env python3
"""Plots data-directory size over live data against time, from `onekv bench compare --sample-disk-ms`.

    python3 scripts/plot-gc.py OUT.png RESULT.json [RESULT.json ...]

Each RESULT.json is the JSON report of one `onekv bench compare` run (for example
`--modes onelog,onelog:nogc --workload w --sample-disk-ms 2000`). For every run in it, the mean over
its nodes of (data-directory bytes / live bytes) is drawn against seconds since the run started, one
line per contender and round; the live bytes are what the harness knows it left (records x (key +
value)). Prints, per run, the last and the largest ratio. Needs matplotlib.
"""

import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display on CI or over ssh
import matplotlib.pyplot as plt  # noqa: E402


def series(run):
    """(seconds, mean disk / live) points of one run."""
    live = max((node.get("live_bytes") or 0) for node in run["nodes"]) if run["nodes"] else 0
    if live == 0 or not run.get("disk_samples"):
        return []
    by_time = defaultdict(list)
    for sample in run["disk_samples"]:
        by_time[sample["elapsed_ms"]].append(sample["disk_bytes"])
    return [(ms / 1000.0, sum(sizes) / len(sizes) / live) for ms, sizes in sorted(by_time.items())]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for run in report["runs"]:
            points = series(run)
            if not points:
                continue
            phases = " + ".join(p["workload"] for p in run["phases"])
            value_bytes = run["phases"][0].get("value_bytes", "?")
            label = f"{run['mode']} r{run['round']} ({phases}, {value_bytes} B values)"
            ax.plot([t for t, _ in points], [r for _, r in points], label=label)
            ratios = [r for _, r in points]
            print(f"{path}: {label}: last {ratios[-1]:.2f}, largest {max(ratios):.2f}")
    ax.set_xlabel("seconds since the run started (Load, then the workload)")
    ax.set_ylabel("data directory ÷ live data (mean of nodes)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
