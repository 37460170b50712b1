#!/usr/bin/python3
"""Training curves of one or more train_gpt runs, from their log.jsonl files, as one PNG.

    /usr/bin/python3 scripts/plot.py out/run_a/log.jsonl [out/run_b/log.jsonl ...] -o curves.png

Four panels, one colour per run: loss against steps and against tokens seen (the raw training
loss faint, its smoothed curve solid, the validation loss as dashed line with dots), the
learning rate, and the gradient norm (log scale). The image is 1200 x 800 pixels. A run that was
resumed appends to its log, possibly repeating steps after the checkpoint: the last record of a
step wins. Needs matplotlib (Debian's python3-matplotlib; scripts/setup.sh installs it).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

WIDTH_IN, HEIGHT_IN, DPI = 12, 8, 100


def fail(msg):
    print(f"plot.py: {msg}", file=sys.stderr)
    sys.exit(2)


def read_log(path):
    """(train, val): {step: record} of the step records and {step: val_loss}."""
    train, val = {}, {}
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            fail(f"{path}:{i}: not a JSON object")
        if "val_loss" in rec:
            val[rec["step"]] = rec["val_loss"]
        elif "loss" in rec:
            train[rec["step"]] = rec
    if not train:
        fail(f"{path}: no training step records (a train_gpt log.jsonl has one per step)")
    return train, val


def smooth(values, weight):
    """Exponential moving average with bias correction (TensorBoard's smoothing)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight ** i))
    return out


def label_of(path):
    base = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return parent if base == "log.jsonl" else os.path.splitext(base)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="log.jsonl files of train_gpt runs")
    ap.add_argument("-o", "--out", default="curves.png", help="PNG to write (default curves.png)")
    ap.add_argument("--smooth", type=float, default=0.9, help="EMA weight of the smoothed loss, in [0, 1)")
    a = ap.parse_args()
    if not 0 <= a.smooth < 1:
        fail(f"--smooth {a.smooth}: must be in [0, 1)")

    fig, ((ax_step, ax_tok), (ax_lr, ax_norm)) = plt.subplots(2, 2, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, path in enumerate(a.logs):
        train, val = read_log(path)
        c, name = colours[i % len(colours)], label_of(path)
        steps = sorted(train)
        loss = [train[s]["loss"] for s in steps]
        # tokens seen after each step; logs older than the "tokens" field give steps x tokens/step
        per_step = next((train[s]["tokens"] / s for s in steps if "tokens" in train[s] and s > 0), None)
        tokens = [train[s].get("tokens", s * (per_step or 0)) for s in steps]
        vsteps = sorted(val)
        for ax, x, vx in ((ax_step, steps, vsteps), (ax_tok, tokens, [s * (per_step or 0) for s in vsteps])):
            if ax is ax_tok and per_step is None:
                continue
            ax.plot(x, loss, color=c, alpha=0.25, linewidth=0.8)
            ax.plot(x, smooth(loss, a.smooth), color=c, linewidth=1.8, label=f"{name} train (smoothed)")
            if vsteps:
                ax.plot(vx, [val[s] for s in vsteps], color=c, linestyle="--", marker="o", markersize=4,
                        label=f"{name} val")
        ax_lr.plot(steps, [train[s]["lr"] for s in steps], color=c, label=name)
        ax_norm.plot(steps, [train[s]["grad_norm"] for s in steps], color=c, linewidth=1.0, label=name)

    ax_step.set(title="loss", xlabel="step", ylabel="cross-entropy")
    ax_tok.set(title="loss against tokens seen", xlabel="tokens", ylabel="cross-entropy")
    ax_lr.set(title="learning rate", xlabel="step", ylabel="lr")
    ax_norm.set(title="gradient norm (before clipping)", xlabel="step", ylabel="global L2 norm", yscale="log")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    # plain numbers; minor ticks labelled only where the axis spans little more than a decade
    ax_norm.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    ax_norm.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.5)))
    for ax in (ax_step, ax_tok, ax_lr, ax_norm):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=DPI)  # not bbox_inches="tight": the size stays WIDTH_IN x HEIGHT_IN at DPI
    print(a.out)


if __name__ == "__main__":
    main()
