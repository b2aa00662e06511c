"""Builders of the per-domain RL sets (NeMo-Gym rows): instruction-following
constraint synthesis, structured-output tasks, long-context retrieval tasks,
and the stage mixes (multi-domain, MOPD)."""
