"""`atropos launch RUN.yaml`: a whole run (API, inference servers, environments, trainer) from
one file, on this machine, on a Ray cluster or as one Slurm job.

- `config`: the run file's models (pydantic) and how a file and `--set` overrides load.
- `plan`: the run file resolved into processes: each one's command line, environment, node,
  GPUs, readiness gate, restart policy and stop order (`--dry-run` prints it).
- `ready`: the readiness gates (API `/health`, inference `/health` or `/v1/models`, an env
  registered with the API, the trainer registered).
- `supervise`: one process supervisor (start, readiness, restarts with backoff, ordered stop
  by process group), the same code on every backend.
- `local`, `ray`, `slurm`: the backends; they only place and start supervised processes.
  Slurm's job script is written by `sbatch`; its steps run `slurm_job` (one supervisor each).

Components start through their own command lines (`atropos api serve`, `atropos local serve`,
`atropos env serve`, `atropos train`, or any command), never through their internals, so a
user's own trainer is as first-class as ours. See docs/launch.md.
"""
