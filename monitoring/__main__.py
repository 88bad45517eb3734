"""``python -m monitoring rules``: write the SLO rule file from the SLO file (``monitoring.slo``).

python -m monitoring rules                    # docker/prometheus/slo-rules.yml
python -m monitoring rules --check            # exit 1 if the committed file is stale
python -m monitoring rules --scale 60 --out /tmp/rules.yml   # windows ÷ 60, for a test
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from monitoring import kubernetes, slo


def main(argv: list[str] | None = None) -> int:
    """Render, write or check the rule file; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m monitoring",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # One command so far: a positional word rather than subcommands.
    parser.add_argument("command", choices=["rules"], help="the SLO rules and burn-rate alerts")
    parser.add_argument("--slos", type=Path, default=slo.SLOS, help="default: %(default)s")
    parser.add_argument("--out", type=Path, default=slo.RULES, help="default: %(default)s")
    parser.add_argument("--scale", type=float, default=1, help="divide every window by this")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args(argv)
    outputs = {args.out: slo.dump(slo.render(slo.load(args.slos), args.scale))}
    if args.out == slo.RULES and args.scale == 1:
        # The ConfigMap copies the rule files as they are once slo-rules.yml is written.
        files = {**kubernetes.rule_files(), slo.RULES.name: outputs[args.out]}
        outputs[kubernetes.OUTPUT] = kubernetes.render(files)
    if args.check:
        stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        for path in stale:
            print(f"{path} is not what {args.slos} makes: run python -m monitoring rules")
        return int(bool(stale))
    for path, text in outputs.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
