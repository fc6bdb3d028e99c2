"""The package's version, in one place: pyproject.toml reads it (setuptools' `attr`), `frenzy_slurm.__version__`
re-exports it, and rendered scripts, plan.json, calibration files and the site install record it. Here rather
than in the package root, so that a stage recording it does not import the root, which loads the Python API."""

__version__ = "0.1.0"
