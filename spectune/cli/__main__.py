"""``python -m spectune.cli``: the ``spectune`` command."""

from spectune.cli import main

main()
