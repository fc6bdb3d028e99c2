"""The site: the site file that says which GPU model each partition's GRES type is, with its links and overheads
(`config`), the admin's tools that write and check it (`tools`) and NVML detection on compute nodes (`detect`).
Stage 3, the orchestrator view, is the live cluster read through the Slurm seam (`frenzy_slurm.slurm`, its
`view.ClusterView`) joined with this file.

    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.site.config import load_site
    view = open_backend("auto").load()
"""
