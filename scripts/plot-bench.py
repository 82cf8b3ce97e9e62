#!/usr/bin/env python3
"""Plots the YCSB results matrix written by scripts/bench-matrix and prints its tables.

    python3 scripts/plot-bench.py RESULTS_DIR OUT_DIR

Reads RESULTS_DIR/size{1024,16384}-{a..f}.json and RESULTS_DIR/threads{N}-a.json (the JSON of
`onekv bench compare`), writes to OUT_DIR:
  - threads-throughput.png: workload A ops/s against client threads (1 KiB values), a line per contender
  - threads-p99.png: workload A read and update p99 latency against client threads, a line per contender
  - workloads-1k.png, workloads-16k.png: ops/s of Load and A–F per contender, one bar group per workload
and prints the markdown tables of docs/benchmarks.md on stdout (means over rounds when there are several).
Files that are missing are skipped, so a reduced matrix still plots. Needs matplotlib.
"""

import glob
import json
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")  # no display on CI or over ssh
import matplotlib.pyplot as plt  # noqa: E402

CONTENDERS = ["onelog", "separated", "classic", "etcd"]
WORKLOADS = ["a", "b", "c", "d", "e", "f"]
SIZES = [(1024, "1k", "1 KiB"), (16384, "16k", "16 KiB")]
# Fixed colours so a contender looks the same in every plot.
COLOURS = {"onelog": "#1f77b4", "separated": "#2ca02c", "classic": "#ff7f0e", "etcd": "#7f7f7f"}


def load(path):
    with open(path) as f:
        return json.load(f)


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def runs_of(result, mode):
    return [r for r in result["runs"] if r["mode"] == mode]


def phase(run, workload):
    for p in run["phases"]:
        if p["workload"] == workload:
            return p
    return None


def throughput(result, mode, workload):
    """Mean ops/s of one phase of one contender over its rounds."""
    return mean(
        [
            phase(r, workload)["throughput_ops_per_sec"]
            for r in runs_of(result, mode)
            if phase(r, workload) is not None
        ]
    )


def errors(result, mode):
    return sum(p["errors"] for r in runs_of(result, mode) for p in r["phases"])


def percentile(result, mode, workload, op, key="p99_us"):
    values = []
    for r in runs_of(result, mode):
        p = phase(r, workload)
        if p is None:
            continue
        for o in p["ops"]:
            if o["op"] == op and o["count"] > 0:
                values.append(o[key])
    return mean(values)


def op_names(result, workload):
    names = []
    for r in result["runs"]:
        p = phase(r, workload)
        if p is None:
            continue
        for o in p["ops"]:
            if o["op"] not in names and o["count"] > 0:
                names.append(o["op"])
    return names


def node_mean(result, mode, key):
    """Mean over rounds of the mean over nodes of one amplification figure (None where not reported)."""
    per_run = [mean([n.get(key) for n in r["nodes"]]) for r in runs_of(result, mode)]
    return mean(per_run)


def fmt(value, digits=0):
    if value is None:
        return "-"
    if digits == 0:
        return f"{value:,.0f}".replace(",", " ")
    return f"{value:.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


RATIO_COLUMNS = [("onelog", "etcd"), ("onelog", "classic"), ("separated", "etcd"), ("separated", "classic"),
                 ("classic", "etcd")]


def table(rows, digits=0):
    """rows: (label, {mode: value}); prints the values of every contender and the ratios."""
    head = ["figure"] + CONTENDERS + [f"{a} ÷ {b}" for a, b in RATIO_COLUMNS]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for label, values in rows:
        cells = [fmt(values.get(m), digits) for m in CONTENDERS]
        cells += [ratio(values.get(a), values.get(b)) for a, b in RATIO_COLUMNS]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()


def size_tables(results_dir, value_bytes, label):
    results = {}
    for w in WORKLOADS:
        path = os.path.join(results_dir, f"size{value_bytes}-{w}.json")
        if os.path.exists(path):
            results[w] = load(path)
    if not results:
        return
    print(f"### {label} values: throughput (ops/s)\n")
    rows = []
    # Every invocation loads first; Load is the mean over all of them (more samples of the same phase).
    rows.append(
        ("Load", {m: mean([throughput(r, m, "load") for r in results.values()]) for m in CONTENDERS})
    )
    for w, r in results.items():
        rows.append((w.upper(), {m: throughput(r, m, w) for m in CONTENDERS}))
    table(rows)
    total_errors = {m: sum(errors(r, m) for r in results.values()) for m in CONTENDERS}
    print(f"Errors over all phases: {', '.join(f'{m} {e}' for m, e in total_errors.items())}.\n")

    print(f"### {label} values: p99 latency (µs)\n")
    rows = [
        ("Load insert", {m: mean([percentile(r, m, "load", "insert") for r in results.values()])
                         for m in CONTENDERS})
    ]
    for w, r in results.items():
        for op in op_names(r, w):
            rows.append((f"{w.upper()} {op}", {m: percentile(r, m, w, op) for m in CONTENDERS}))
    table(rows)

    print(f"### {label} values: write amplification (mean over the 3 nodes, over Load + the workload)\n")
    rows = []
    for w, r in results.items():
        rows.append((f"{w.upper()} kernel WA", {m: node_mean(r, m, "kernel_wa") for m in CONTENDERS}))
    for w, r in results.items():
        rows.append((f"{w.upper()} engine WA", {m: node_mean(r, m, "engine_wa") for m in CONTENDERS}))
    table(rows, digits=2)
    return results


def thread_sweep(results_dir):
    sweep = {}
    for path in glob.glob(os.path.join(results_dir, "threads*-a.json")):
        threads = int(re.search(r"threads(\d+)-a\.json$", path).group(1))
        sweep[threads] = load(path)
    return dict(sorted(sweep.items()))


def plot_sweep(sweep, out_dir):
    if not sweep:
        return
    threads = list(sweep)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in CONTENDERS:
        ax.plot(threads, [throughput(sweep[t], m, "a") for t in threads], marker="o", label=m,
                color=COLOURS[m])
    ax.set_xscale("log", base=2)
    ax.set_xticks(threads, [str(t) for t in threads])
    ax.set_xlabel("client threads (closed loop)")
    ax.set_ylabel("ops/s")
    ax.set_title("YCSB A (50% read / 50% update), 1 KiB values, 3 replicas")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "threads-throughput.png"), dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, op in zip(axes, ["read", "update"]):
        for m in CONTENDERS:
            ax.plot(threads, [percentile(sweep[t], m, "a", op) for t in threads], marker="o", label=m,
                    color=COLOURS[m])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(threads, [str(t) for t in threads])
        ax.set_xlabel("client threads (closed loop)")
        ax.set_title(f"YCSB A {op} p99, 1 KiB values")
        ax.grid(True, alpha=0.3, which="both")
    axes[0].set_ylabel("p99 latency (µs, log scale)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "threads-p99.png"), dpi=110)
    plt.close(fig)


def sweep_table(sweep):
    if not sweep:
        return
    print("### Thread sweep: workload A, 1 KiB values\n")
    rows = []
    for t, r in sweep.items():
        rows.append((f"{t} threads: ops/s", {m: throughput(r, m, "a") for m in CONTENDERS}))
    for t, r in sweep.items():
        for op in ["read", "update"]:
            rows.append((f"{t} threads: {op} p99 µs", {m: percentile(r, m, "a", op) for m in CONTENDERS}))
    table(rows)


def plot_workloads(results, out_dir, short, label):
    if not results:
        return
    groups = ["load"] + list(results)
    values = {
        m: [mean([throughput(r, m, "load") for r in results.values()])]
        + [throughput(r, m, w) for w, r in results.items()]
        for m in CONTENDERS
    }
    width = 0.8 / len(CONTENDERS)
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for i, m in enumerate(CONTENDERS):
        xs = [g + (i - (len(CONTENDERS) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v or 0 for v in values[m]], width, label=m, color=COLOURS[m])
    ax.set_xticks(range(len(groups)), [g.upper() if g != "load" else "Load" for g in groups])
    ax.set_ylabel("ops/s")
    ax.set_title(f"YCSB Load and A–F, {label} values, 16 client threads, 3 replicas")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, f"workloads-{short}.png"), dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    results_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    for value_bytes, short, label in SIZES:
        results = size_tables(results_dir, value_bytes, label)
        plot_workloads(results, out_dir, short, label)
    sweep = thread_sweep(results_dir)
    sweep_table(sweep)
    plot_sweep(sweep, out_dir)


if __name__ == "__main__":
    main()
