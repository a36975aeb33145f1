"""The programs the multi-process tests run: clients started by path under
`jdtensor launch` or by hand (`*_client.py`), and the test modules the
`jdtensor.testing` tests run pytest on in a subprocess (`*_examples.py`,
`multi_client_import_error.py`)."""
