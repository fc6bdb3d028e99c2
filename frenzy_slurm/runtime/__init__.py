"""What runs in the job, apart from the planning stages: rank set-up (`dist`), the job directory's trust checks
(`trust`), the built-in trainer (`trainer`), checkpoints (`checkpoints`), memory recording (`memory`,
`nvml_sampler`), and each framework's command line (`framework_argv`); `python -m frenzy_slurm.runtime` is the
entry point (`__main__`). Importing the package imports nothing: the sampler and the entry point stay light."""
