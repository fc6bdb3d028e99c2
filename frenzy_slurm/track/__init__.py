"""Stage 7, track: what happens to submitted jobs. `jobs` (what fsqueue shows), `follow` (`fsqueue --log
--follow`), `progress` (the trainer's progress.json and fsbatch --wait's line; light: the trainer imports it),
`watch` and `watch_journal` (`frenzy-slurm watch`, which moves preemptible jobs).

Importing the package imports nothing, so that `progress` stays light."""
