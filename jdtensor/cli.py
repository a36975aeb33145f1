"""The ``jdtensor`` command line (also ``python -m jdtensor``)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "get_parser"]


def get_parser() -> argparse.ArgumentParser:
  """The argument parser of the ``jdtensor`` command."""
  parser = argparse.ArgumentParser(
      prog="jdtensor",
      description="TF DTensor's multi-client runtime on JAX.")
  commands = parser.add_subparsers(dest="command", required=True)
  demo = commands.add_parser(
      "demo", help="train a small data+model parallel MLP on a DTensor mesh")
  demo.add_argument("--steps", type=int, default=30,
                    help="training steps (default 30)")
  return parser


def _demo(args: argparse.Namespace) -> int:
  from jdtensor import demo  # pylint: disable=g-import-not-at-top
  if args.steps < 1:
    print(f"jdtensor demo: --steps must be >= 1, got {args.steps}",
          file=sys.stderr)
    return 2
  ok = demo.report(demo.run_demo(args.steps))
  print("OK" if ok else "FAILED")
  return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
  """Runs the command; returns the exit code."""
  args = get_parser().parse_args(argv)
  return {"demo": _demo}[args.command](args)
