"""`python -m archiver.cli`: the same as the `archiver` command."""

from archiver.cli import main

main()
