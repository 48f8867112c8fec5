"""The freeze stage's figure (Wu et al. 2020, Table 1 as bars) and how it words a change in cost."""

from __future__ import annotations

from layersim.reporting.plots import method_bars

MINUS = "\u2212"  # a real minus sign: "−24 % time" reads as 24 % less


def change_label(change: float | None, what: str) -> str:
    """A relative change as a signed percentage of `what`: -0.24 → "−24 % time" (24 % less), 0.05 →
    "+5 % time" (5 % more), None → "? time". Rounded to whole percents; a change under 0.5 % reads "±0 %"."""
    if change is None:
        return f"? {what}"
    percent = round(100 * change)
    sign = MINUS if percent < 0 else "+" if percent > 0 else "\u00b1"
    return f"{sign}{abs(percent)} % {what}"


def freeze_bars(bars: dict[str, tuple[float, float | None]], unfrozen: tuple[str, float], title: str, metric: str):
    """One bar per frozen configuration: label → (score, share of backward FLOPs saved); the label gains a
    second line with the FLOPs as a change ("−31 % backward FLOPs"), the unfrozen run's score is a line.
    No measured time: the figure is a hashed output (the times are in the stage's timings file)."""
    values = {f"{label}\n{change_label(None if saved is None else -saved, 'backward FLOPs')}": score
              for label, (score, saved) in bars.items()}
    figure = method_bars(values, title, metric, {unfrozen[0]: unfrozen[1]} if unfrozen[1] is not None else None)
    # Two-line labels, some with a not-converged note: wider bars than the alignment methods' short names.
    figure.set_figwidth(max(figure.get_figwidth(), 3.0 + 1.9 * len(values)))
    figure.axes[0].tick_params(axis="x", labelsize=8)
    return figure
