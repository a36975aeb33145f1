"""The command line (`jdtensor.cli`): what it offers. Its commands run for
real in tests/multiprocess (launch, status, demo)."""

from jdtensor import cli


def test_help_lists_only_public_commands(capsys):
  try:
    cli.main(["--help"])
  except SystemExit:
    pass
  text = capsys.readouterr().out
  assert "{launch,demo,env,status,trace}" in text
  assert "demo-client" not in text and "SUPPRESS" not in text
