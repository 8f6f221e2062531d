"""The main job: a realistic multi-session workload through a real model, kvtier vs recompute."""
