"""The report wing: what is read back from finished runs. The leaderboard (leaderboard: `oscar-eval leaderboard`, the
markdown and the README's results section; tables and speed: its tables), its HTML page and charts (html; niah: the
needle-in-a-haystack heat maps), `oscar-eval compare` (compare: the paired tests of two results) and what a whole
benchmark costs (eval_cost).

It reads result files and the bench reference JSONs, never runs a model or the eval loop; nothing outside it imports
it but the command line's table of subcommands (harness.cli).
"""
