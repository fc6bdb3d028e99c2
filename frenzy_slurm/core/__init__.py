"""What every stage shares and none owns: exit codes and errors (`errors`), units (`units`), the GPU catalog
(`gpus`), the bounded, safe readers of a user's input files (`inputfile`, `yamlfile`) and the one atomic writer
and reader of JSON records (`records`). Imports no other package of frenzy_slurm."""
