"""The commands (fsbatch, fsqueue, fsinfo, fscancel, frenzy-slurm): flag parsing and printing only.

A command imports the stages it needs inside the function that runs it, not at the top of its module: each
command's start-up (and its `--help`) is what a user waits for on a login node, and a plain `fsqueue` or
`fsinfo` listing imports no planning stage (tests/test_listing_imports.py, tests/test_command_latency.py).
This is the reason for the imports inside functions throughout this package.
"""
