"""sbatch's own option table, and the `--sbatch` / `slurm.extra` check that parses flags as sbatch does.

Each `--sbatch FLAG` (and each `slurm.extra` entry) becomes one `#SBATCH FLAG` line of job.sbatch. sbatch splits
every #SBATCH line into words (quotes group, backslash escapes, `#` starts a comment) and parses all of them
together with getopt_long: short options cluster (`-vt1` is `-v -t 1`), take attached values (`-t1`), and long
options may be abbreviated to any unique prefix (`--ch=/` is `--chdir=/`). A later line overrides an earlier
one, so a pass-through flag could replace what the plan set (the job's tag, its directory, its GPUs). This
module refuses such flags by reading them exactly that way.

The tables are sbatch's options as Slurm defines them: `common_options[]` in src/common/slurm_opt.c, the
entries with a name that sbatch accepts (`set_func` or `set_func_sbatch`), from the Slurm sources vendored in
shared/vendor/slurm: 23.11.11, 24.11.7, 25.05.8, 25.11.7 and 26.05.3 (their union; an option whose argument
kind changed between versions, such as --requeue, is "optional"). SPANK plugins may add long options this table
does not know; those pass, unless they are a prefix of a reserved option.
"""

from __future__ import annotations

from typing import Literal

ArgKind = Literal["no", "required", "optional"]

# long option -> whether it takes an argument (getopt's no_argument / required_argument / optional_argument)
SBATCH_LONG_OPTIONS: dict[str, ArgKind] = {
    "account": "required",
    "acctg-freq": "required",
    "array": "required",
    "autocomplete": "required",
    "batch": "required",
    "bb": "required",
    "bbf": "required",
    "begin": "required",
    "chdir": "required",
    "cluster": "required",
    "cluster-constraint": "required",
    "clusters": "required",
    "comment": "required",
    "consolidate-segments": "no",
    "constraint": "required",
    "container": "required",
    "container-id": "required",
    "container-type": "required",
    "context": "required",
    "contiguous": "no",
    "core-spec": "required",
    "cores-per-socket": "required",
    "cpu-freq": "required",
    "cpus-per-gpu": "required",
    "cpus-per-task": "required",
    "deadline": "required",
    "delay-boot": "required",
    "dependency": "required",
    "distribution": "required",
    "error": "required",
    "exclude": "required",
    "exclusive": "optional",
    "export": "required",
    "export-file": "required",
    "external": "no",
    "extra": "required",
    "extra-node-info": "required",
    "get-user-env": "optional",
    "gid": "required",
    "gpu-bind": "required",
    "gpu-freq": "required",
    "gpus": "required",
    "gpus-per-node": "required",
    "gpus-per-socket": "required",
    "gpus-per-task": "required",
    "gres": "required",
    "gres-flags": "required",
    "help": "no",
    "hint": "required",
    "hold": "no",
    "ignore-pbs": "no",
    "input": "required",
    "job-name": "required",
    "kill-on-invalid-dep": "required",
    "licenses": "required",
    "mail-type": "required",
    "mail-user": "required",
    "mcs-label": "required",
    "mem": "required",
    "mem-bind": "required",
    "mem-per-cpu": "required",
    "mem-per-gpu": "required",
    "mem-update": "required",
    "mincpus": "required",
    "network": "required",
    "nice": "optional",
    "no-kill": "optional",
    "no-requeue": "no",
    "nodefile": "required",
    "nodelist": "required",
    "nodes": "required",
    "ntasks": "required",
    "ntasks-per-core": "required",
    "ntasks-per-gpu": "required",
    "ntasks-per-node": "required",
    "ntasks-per-socket": "required",
    "ntasks-per-tres": "required",
    "oom-kill-step": "optional",
    "open-mode": "required",
    "output": "required",
    "overcommit": "no",
    "oversubscribe": "no",
    "parsable": "no",
    "partition": "required",
    "power": "required",
    "prefer": "required",
    "priority": "required",
    "profile": "required",
    "propagate": "optional",
    "qos": "required",
    "quiet": "no",
    "reboot": "no",
    "requeue": "optional",
    "reservation": "required",
    "resources": "required",
    "resv-ports": "optional",
    "segment": "required",
    "signal": "required",
    "sockets-per-node": "required",
    "spread-job": "no",
    "spread-segments": "no",
    "stepmgr": "no",
    "switches": "required",
    "tasks-per-node": "required",
    "test-only": "no",
    "thread-spec": "required",
    "threads-per-core": "required",
    "time": "required",
    "time-min": "required",
    "tmp": "required",
    "tres-bind": "required",
    "tres-per-task": "required",
    "uid": "required",
    "usage": "no",
    "use-min-nodes": "no",
    "verbose": "no",
    "version": "no",
    "wait": "no",
    "wait-all-nodes": "required",
    "wckey": "required",
    "wrap": "required",
}

# short option -> its long option (the `val` of the entry; those below LONG_OPT_ENUM_START are letters)
SBATCH_SHORT_OPTIONS: dict[str, str] = {
    "A": "account",
    "B": "extra-node-info",
    "C": "constraint",
    "D": "chdir",
    "F": "nodefile",
    "G": "gpus",
    "H": "hold",
    "J": "job-name",
    "L": "licenses",
    "M": "clusters",
    "N": "nodes",
    "O": "overcommit",
    "Q": "quiet",
    "S": "core-spec",
    "V": "version",
    "W": "wait",
    "a": "array",
    "b": "begin",
    "c": "cpus-per-task",
    "d": "dependency",
    "e": "error",
    "h": "help",
    "i": "input",
    "k": "no-kill",
    "m": "distribution",
    "n": "ntasks",
    "o": "output",
    "p": "partition",
    "q": "qos",
    "s": "oversubscribe",
    "t": "time",
    "v": "verbose",
    "w": "nodelist",
    "x": "exclude",
}

# What the rendered script sets itself, and why a pass-through flag must not override it.
RESERVED: dict[str, str] = {
    "comment": "the job's tag frenzy:<submission>, by which fsqueue and the duplicate check find the job",
    "chdir": "the job directory",
    "signal": "the checkpoint signal before the time limit",
    "requeue": "resume after a time-limit checkpoint or node failure",
    "no-requeue": "resume after a checkpoint",
    "partition": "HAS's allocation",
    "gres": "HAS's allocation",
    "nodes": "HAS's allocation",
    "ntasks": "one task per GPU",
    "ntasks-per-node": "one task per GPU",
    "ntasks-per-gpu": "one task per GPU",
    "cpus-per-task": "the site file",
    "gpus": "HAS's allocation",
    "gpus-per-node": "HAS's allocation",
    "gpus-per-task": "HAS's allocation",
    "gpus-per-socket": "HAS's allocation",
    "tres-per-task": "HAS's allocation",
    "time": "use fsbatch -t, which is checked",
    "qos": "use fsbatch -q or slurm.qos: HAS plans within that QOS's GPU limits",
    "dependency": "use fsbatch -d or slurm.dependency, which are checked",
    "job-name": "use fsbatch -J",
    "output": "use fsbatch -o",
    "error": "use fsbatch -e",
    "open-mode": "logs are appended across requeues",
    "wrap": "the job script is frenzy-slurm's",
    "wait": "fsbatch submits and returns; follow the job with fsqueue",
    "test-only": "fsbatch --dry-run plans without submitting",
    "parsable": "fsbatch reads sbatch's answer itself",
}
# Options refused for what they would make of the job, not because the plan sets them: option -> why and the fix.
ARRAYS = (
    "job arrays run one plan as many tasks in one job directory, where they overwrite each other's metrics.json, "
    "checkpoints and records; for many runs use a sweep, `fsbatch model.yaml --set KEY=A,B,C` (fs.sweep in "
    "Python), with `--max-running N` to cap how many run at once"
)
REFUSED: dict[str, str] = {"array": ARRAYS}
_SBATCH_SPECIAL = "\"'\\#"  # quotes group words, a backslash escapes, '#' starts a comment in an #SBATCH line
_SEPARATORS = ("hetjob", "packjob")  # a word sbatch blanks out (a hetjob separator): the next line's word moves up


def _long_candidates(name: str) -> list[str]:
    """The long options `--name` may mean: itself, else every option it abbreviates (getopt_long)."""
    if name in SBATCH_LONG_OPTIONS:
        return [name]
    return [o for o in SBATCH_LONG_OPTIONS if o.startswith(name)]


def _reserved_in(candidates: list[str], given: str) -> str | None:
    hits = [c for c in candidates if c in RESERVED or c in REFUSED]
    if not hits:
        return None
    if given == f"--{hits[0]}":
        spelled = given
    elif len(candidates) == 1:
        spelled = f"{given} (sbatch reads it as --{hits[0]})"
    else:
        spelled = f"{given} (an abbreviation of --{hits[0]}, among others)"
    return _why(spelled, hits[0])


def _why(spelled: str, option: str) -> str:
    if option in REFUSED:
        return f"{spelled} is refused: {REFUSED[option]}"
    return f"{spelled}: frenzy-slurm sets this itself ({RESERVED[option]})"


def refuse_sbatch_flag(flag: str) -> str | None:
    """Why `flag` (one `--sbatch` value, one #SBATCH line's words) may not pass through to sbatch; None if it may.

    Parsed as sbatch parses it: words split on white space; `--name[=value]` with `name` any unique prefix;
    `-abc` a cluster of short options, where one that takes a value takes the rest of the word or the next word.
    """
    if not flag.startswith("-"):
        return f"'{flag}' is not an sbatch flag; each entry must start with '-', e.g. '--reservation=big'"
    bad = next((c for c in flag if c in _SBATCH_SPECIAL), None)
    if bad is not None:
        return (
            f"'{flag}': sbatch reads {bad!r} specially in an #SBATCH line (quotes, escapes, comments), so it "
            "would not get what you wrote; write the flag without quotes, backslashes or '#'"
        )
    words = flag.split()
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            return f"'{flag}': '--' ends sbatch's options; every #SBATCH line after it would be refused"
        if word == "-":
            return f"'{flag}': '-' is not an sbatch flag"
        if not word.startswith("-"):
            if (why := _bad_value(flag, word)) is not None:
                return why
            return (
                f"'{flag}': '{word}' is neither an sbatch flag nor a flag's value; sbatch stops reading "
                "options there and refuses the script"
            )
        why, i = (_long_option if word.startswith("--") else _short_options)(flag, word, words, i)
        if why is not None:
            return why
    return None


def _long_option(flag: str, word: str, words: list[str], i: int) -> tuple[str | None, int]:
    """(why `word`, a `--name[=value]` of `flag`, may not pass, or None; the index of the word after it and the
    value it takes)."""
    name, eq, _ = word[2:].partition("=")
    candidates = _long_candidates(name)
    why = _reserved_in(candidates, word.split("=", 1)[0])
    if why:
        return why, i
    if len(candidates) > 1:
        return (
            f"'{flag}': sbatch cannot tell which option --{name} abbreviates ("
            + ", ".join(f"--{c}" for c in candidates[:6])
            + "); write the option in full"
        ), i
    if not candidates:  # not sbatch's own (a SPANK plugin's?): it passes, a plain word after it as its value
        if not eq and i < len(words) and not words[i].startswith("-"):
            return _bad_value(flag, words[i]), i + 1
        return None, i
    kind = SBATCH_LONG_OPTIONS[candidates[0]]
    if eq and kind == "no":
        return f"'{flag}': --{candidates[0]} takes no value", i
    if not eq and kind == "required":
        if i >= len(words):
            return (
                f"'{flag}': --{candidates[0]} needs a value in the same flag (--{candidates[0]}=VALUE); "
                "sbatch would take the next #SBATCH line's first word as its value"
            ), i
        return _bad_value(flag, words[i]), i + 1  # the value, whatever it looks like (getopt takes the next word)
    return None, i


def _short_options(flag: str, word: str, words: list[str], i: int) -> tuple[str | None, int]:
    """(why `word`, a cluster of short options `-abc` of `flag`, may not pass, or None; the index of the word
    after it and the value it takes): an option that takes a value takes the rest of the word or the next word."""
    for k, letter in enumerate(word[1:], start=2):
        long = SBATCH_SHORT_OPTIONS.get(letter)
        if long is None:
            return f"'{flag}': -{letter} is not an sbatch option", i
        if long in RESERVED or long in REFUSED:
            return _why(f"{word} (sbatch reads -{letter} as --{long})", long), i
        kind = SBATCH_LONG_OPTIONS[long]
        if kind == "no":
            continue
        if word[k:] or kind == "optional":
            break  # the rest of the word is the value (an optional value is only ever attached)
        if i >= len(words):
            return (
                f"'{flag}': -{letter} needs a value in the same flag (-{letter} VALUE); sbatch would take "
                "the next #SBATCH line's first word as its value"
            ), i
        return _bad_value(flag, words[i]), i + 1
    return None, i


def asks_for_array(words: list[str]) -> str | None:
    """The word of an #SBATCH line's `words` that sbatch reads as --array (`--array=1-4`, `--arr 1-4`, `-a1`,
    `-va1`), or None: the check of a whole rendered script (a --templates file may write any line)."""
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            candidates = _long_candidates(word[2:].partition("=")[0])
            if candidates == ["array"]:
                return word
            if len(candidates) == 1 and SBATCH_LONG_OPTIONS[candidates[0]] == "required" and "=" not in word:
                i += 1  # its value
        elif word.startswith("-"):
            for k, letter in enumerate(word[1:], start=2):
                long = SBATCH_SHORT_OPTIONS.get(letter)
                if long == "array":
                    return word
                if long is None or SBATCH_LONG_OPTIONS[long] == "no":
                    continue
                if not word[k:] and SBATCH_LONG_OPTIONS[long] == "required":
                    i += 1  # the next word is its value
                break
    return None


def _bad_value(flag: str, word: str) -> str | None:
    """A separate value word sbatch would not keep: `hetjob` is blanked out, a leading ':' is fatal."""
    if word.lower() in _SEPARATORS or word.startswith(":"):
        return f"'{flag}': sbatch reads '{word}' as a hetjob separator, not as a value; choose another value"
    return None
