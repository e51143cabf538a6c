"""The collectives one step of a ``--tensor`` split runs, read from the profile's units the
way :func:`psgd.tensor.conv.split_tensor` pairs their layers: a column layer then a row
layer, channel-carrying layers between, a gather where a column has no partner."""
from __future__ import annotations

ELEMENTWISE = {"relu", "leakyrelu", "tanh", "sigmoid"}
CARRY = ELEMENTWISE | {"batchnorm", "maxpool2d", "avgpool2d"}   # act on split conv channels


def tensor_collectives(units) -> list[tuple[str, int]]:
    """``[(kind, bytes per sample)]``, kind ``all-reduce`` or ``all-gather`` (bytes: the whole
    gathered size), forward and backward, for units with the profile's names and sizes.

    A column layer all-reduces its input gradient (none up to the first layer with
    parameters, whose input gradient is never computed), a row
    layer its partial output; an unpartnered dense column all-gathers its output; a split
    conv's channels are all-gathered before the first layer that cannot carry them; a
    residual block all-reduces its second conv's partial sums and its input gradient.
    """
    out: list[tuple[str, int]] = []
    conv = dense = None            # the open column unit of each chain
    first = next((i for i, u in enumerate(units) if u.param_bytes), len(units))
    for i, unit in enumerate(units):
        names = set(unit.name.split("+"))
        if conv is not None and "conv2d" not in names and not names <= CARRY:
            out.append(("all-gather", unit.in_bytes))
            conv = None
        if dense is not None and "dense" not in names and not names <= ELEMENTWISE:
            out.append(("all-gather", dense.out_bytes))
            dense = None
        dx = [] if i <= first else [("all-reduce", unit.in_bytes)]
        if "residual" in names:     # a projection shortcut (the shape changes) gathers its output
            out += [("all-reduce", unit.out_bytes)] + dx \
                + ([("all-gather", unit.out_bytes)] if unit.in_bytes != unit.out_bytes else [])
        elif "conv2d" in names:
            conv = _column_or_row(out, conv, unit, dx)
        elif "dense" in names:
            dense = _column_or_row(out, dense, unit, dx)
    if conv is not None:
        out.append(("all-gather", units[-1].out_bytes))
    if dense is not None:
        out.append(("all-gather", dense.out_bytes))
    return out


def _column_or_row(out: list, column, unit, dx: list):
    """The open column after ``unit``: ``unit`` itself (a new column, which all-reduces its
    input gradient ``dx``) or None (it was the column's row partner)."""
    if column is None:
        out += dx
        return unit
    out.append(("all-reduce", unit.out_bytes))
    return None
