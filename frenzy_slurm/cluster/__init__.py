"""Stage 3, the orchestrator view: the live cluster (read through the Slurm seam, `frenzy_slurm.slurm`)
joined with the site file that says which GPU model each partition's GRES type is.

    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.cluster.site import load_site
    view = open_backend("auto").load()
"""
