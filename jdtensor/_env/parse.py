"""Strict parsers of one value (booleans, integers, time-outs, hosts, ports,
addresses), naming the variable in every error.

PURE: standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from jdtensor.errors import ConfigError

__all__ = ["MAX_TIMEOUT", "environ_or_default", "parse_bind_address", "parse_bool",
           "parse_host", "parse_int", "parse_port", "parse_timeout", "process_environ",
           "read_bool"]


_TRUE = frozenset({"1", "true", "yes"})
_FALSE = frozenset({"0", "false", "no"})
# ASCII digits only: str.isdigit() accepts '²' and Arabic-Indic digits.
INT_RE = re.compile(r"[+-]?[0-9]{1,18}", re.ASCII)
# Leading zeros are allowed: TF's own multi-client test helper writes
# f"localhost:{port:06d}" and TF accepts it. The value is what is checked.
PORT_RE = re.compile(r"[0-9]{1,16}", re.ASCII)
HOST_RE = re.compile(r"[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.%A-Za-z]+\]", re.ASCII)
# Longest timeout accepted anywhere (a week): JAX's time-outs are C ints of
# seconds, and "wait forever" is never what a run wants.
MAX_TIMEOUT = 7 * 24 * 3600.0


def environ_or_default(environ: Mapping[str, str] | None) -> Mapping[str, str]:
  return os.environ if environ is None else environ


def process_environ() -> Mapping[str, str]:
  """This process's environment (``os.environ``), for code that hands it on."""
  return os.environ


def parse_bool(name: str, raw: str) -> bool:
  """Parses a boolean variable strictly.

  Args:
    name: The variable's name, for the error message.
    raw: Its value.

  Returns:
    True for 1/true/yes and False for 0/false/no, in any case, ignoring
    surrounding blanks.

  Raises:
    ConfigError: For any other value.
  """
  value = raw.strip().lower()
  if value in _TRUE:
    return True
  if value in _FALSE:
    return False
  raise ConfigError(
      f"{name}={raw!r} is not a boolean; use one of true/false, 1/0 or yes/no "
      "(any case), or unset it for the default.")


def parse_int(name: str, raw: str, *, hint: str = "") -> int:
  """Parses a decimal integer variable strictly (no ``int()`` leniency).

  Args:
    name: The variable's name, for the error message.
    raw: Its value.
    hint: What to set it to, appended to the error message.

  Returns:
    The integer.

  Raises:
    ConfigError: If the value is not a decimal integer.
  """
  value = raw.strip()
  if not INT_RE.fullmatch(value):
    shown = raw if len(raw) <= 40 else raw[:20] + "..." + raw[-10:]
    what = ("is too long for an integer" if re.fullmatch(r"[+-]?[0-9]+", value,
                                                        re.ASCII)
            else "is not an integer")
    raise ConfigError(f"{name}={shown!r} {what}" + (f"; {hint}" if hint else "."))
  return int(value)


def parse_timeout(name: str, raw: object) -> float:
  """A time-out in seconds: a number above 0 and at most `MAX_TIMEOUT`.

  Raises:
    ConfigError: Naming `name` and showing the value otherwise.
  """
  if isinstance(raw, bool):
    value = float("nan")
  else:
    try:
      value = float(raw.strip() if isinstance(raw, str) else raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
      value = float("nan")
  if not 0 < value <= MAX_TIMEOUT:
    raise ConfigError(f"{name}={raw!r} must be a number of seconds above 0 and at "
                      f"most {MAX_TIMEOUT:g} (a week).")
  return value


def parse_port(name: str, raw: str, what: str) -> int:
  """A TCP port: ASCII decimal digits (leading zeros allowed), 1..65535.

  Raises:
    ConfigError: ``{name}={raw!r}: {what} has an invalid port ...``.
  """
  if not PORT_RE.fullmatch(raw) or not 1 <= int(raw) <= 65535:
    raise ConfigError(f"{name}={what!r} has an invalid port {raw!r} (expected "
                      "1..65535 in ASCII digits).")
  return int(raw)


def parse_host(name: str, host: str, shown: str) -> str:
  """A host name or address: ASCII, DNS labels of 1-63 characters.

  Raises:
    ConfigError: ``{name}={shown!r} has an invalid host ...``.
  """
  problem = ""
  if not HOST_RE.fullmatch(host):
    problem = "it may hold only ASCII letters, digits, '.', '-' and '_', or be [IPv6]"
  elif not host.startswith("["):
    labels = host.rstrip(".").split(".")
    if len(host) > 253:
      problem = "a host name has at most 253 characters"
    elif any(not 1 <= len(label) <= 63 for label in labels):
      problem = "each dot-separated part of a host name has 1 to 63 characters"
  if problem:
    raise ConfigError(f"{name}={shown!r} has an invalid host {host!r}: {problem}.")
  return host.strip("[]")


def parse_bind_address(name: str, raw: object) -> tuple[str | None, int | None]:
  """``JDTENSOR_COORDINATOR_BIND_ADDRESS``: a host, ``host:port`` or ``:port``.

  Returns:
    (host or None, port or None): what to use instead of DTENSOR_JOBS[0]'s.

  Raises:
    TypeError: If it is not a str.
    ConfigError: For a bad host or a port outside 1..65535 (``:0`` included:
      a random port nobody could find).
  """
  if not isinstance(raw, str):
    raise TypeError(f"{name} must be a str like 'host', 'host:port' or "
                    f"'[::1]:port', got {raw!r} of type {type(raw).__name__}.")
  text = raw.strip()
  if not text:
    raise ConfigError(f"{name}={raw!r} is empty; give a host, host:port or "
                      "[IPv6]:port, or unset it.")
  if text.startswith("["):
    host, sep, rest = text.partition("]")
    host += "]"
    port_text = rest[1:] if rest.startswith(":") else None
    if rest and port_text is None:
      raise ConfigError(f"{name}={raw!r} is not [IPv6] or [IPv6]:port.")
  elif text.count(":") == 1:
    host, _, port_text = text.partition(":")
  elif ":" in text:  # A bare IPv6 address.
    host, port_text = f"[{text}]", None
  else:
    host, port_text = text, None
  port = parse_port(name, port_text, raw) if port_text is not None else None
  return (parse_host(name, host, raw) if host else None), port


def read_bool(name: str, default: bool,
              environ: Mapping[str, str] | None = None) -> bool:
  """Reads a boolean variable with `parse_bool`, or `default` when unset."""
  raw = environ_or_default(environ).get(name)
  return default if raw is None else parse_bool(name, raw)
