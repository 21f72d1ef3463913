"""`python -m speedtronic ...` runs the CLI."""

from speedtronic.cli import main_entry

main_entry()
