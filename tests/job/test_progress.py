"""The progress callback both jobs take, and its silent default."""

from __future__ import annotations

import inspect

from kvtier.job.hf_job import run_job
from kvtier.job.progress import Progress, quiet
from kvtier.job.vllm_job import run_vllm_job


def test_quiet_takes_a_step_and_shows_nothing(capsys):
    progress: Progress = quiet
    assert progress("loading the model", 1, 3) is None
    assert capsys.readouterr() == ("", "")


def test_both_jobs_run_quietly_unless_given_a_progress_bar():
    for job in (run_job, run_vllm_job):
        assert inspect.signature(job).parameters["progress"].default is quiet
