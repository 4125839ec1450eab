"""The shipped search spaces (one YAML file each), installed with spectune as its data package
``spectune.search_spaces`` and read through ``importlib.resources``: ``--space NAME`` finds them from
any directory. See spectune.space for their format."""
