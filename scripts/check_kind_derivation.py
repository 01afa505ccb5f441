"""How well a GPU kind derived from its datasheet prices steps: each profiled family derived from
one profiled GPU to another, median and worst step-time error against the target's own profile
over the grid of batch shapes in `workers.plan.derive.VALIDATION_GRID` (issue 41's target:
Llama-2-7B derived from the A30 to the A100 and H100, median error 10 % or less).

Usage::

    python scripts/check_kind_derivation.py [--json]
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from workers.plan.derive import VALIDATION_GRID, derivation_error

#: (family, profiled GPU derived from, profiled GPU compared with).
PAIRS = (("llama-2-7b", "a30", "a100"), ("llama-2-7b", "a30", "h100"),
         ("llama-2-7b", "a100", "h100"), ("llama-2-7b", "h100", "a30"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rows = [{"family": f, "from": base, "to": target, **derivation_error(f, base, target)}
            for f, base, target in PAIRS]
    if args.json:
        print(json.dumps(rows))
        return
    table = Table(title=f"Derived vs profiled step times ({len(VALIDATION_GRID)} batch shapes)")
    for column in ("family", "derived from", "compared with", "median error", "max error"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["family"], row["from"], row["to"], f"{row['median']:.1%}",
                      f"{row['max']:.1%}")
    Console().print(table)


if __name__ == "__main__":
    main()
