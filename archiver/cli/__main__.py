"""`python -m archiver.cli`: the same as the `archiver` command."""

from archiver.cli.base import main

main()
