"""The job directory, which planning, submission, the runtime, track, watch and calibration all share: its paths
and the default jobs folder (`paths`), what is written there (`planfile`: plan.json's schema), its safety
checks, locks and the user's registry (`safety`), the checkpoint a job resumes from (`checkpoints`) and the
`FRENZY_*` variables a script is handed (`scriptenv`).

Importing the package imports nothing: `in_job` (standard library only) reads checkpoints through it."""
