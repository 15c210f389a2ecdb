"""What each training framework can run, and how its files are written.

profile.py      FrameworkProfile (torchtitan, nxd): ZeRO stages, recompute, schedules, HSDP, producible()
torchtitan.py   the torchtitan 0.2.x job config and its command-line overrides
export.py       solve --format torchtitan | nxd | env
launch.py       trnopt launch: env, node order, core binding, the rank map the launch implies
schedulers.py   the torchrun, Slurm and Kubernetes parts of the launch
"""
