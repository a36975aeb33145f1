"""A test module that imports in the pytest process but not in the clients
(run by test_testing.py; the failure is on purpose)."""

import os

from jdtensor.testing import multi_client

if "DTENSOR_CLIENT_ID" in os.environ:  # Only in the clients.
  import a_module_only_the_parent_has  # noqa: F401  # pylint: disable=import-error


@multi_client(num_clients=2)
def test_never_runs():
  raise AssertionError("the body must not run when the module cannot be imported")
