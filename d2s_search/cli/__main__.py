"""``python -m d2s_search.cli`` runs the command line."""

from d2s_search.cli import main

main()
