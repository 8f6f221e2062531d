"""Run token-id prompts through a real offline vLLM engine, in steps, and write what it generated.

    python -m kvtier.harness.vllm_probe SPEC.json OUT.json

The spec (JSON) says how to build the engine and what to do::

    {"connector": {...kv_connector_extra_config...} | null,
     "prefix_caching": true, "blocks": 64, "max_model_len": 4096,
     "start_when": "/tmp/go", "run_when": "/tmp/turn",
     "lora_rank": 8, "prompt_embeds": true, "tp": 3, "kv_role": "kv_producer",
     "kv_events": "ipc:///tmp/events", "model": "/path/to/folder",
     "steps": [{"prompts": [[1, 2, ...], ...], "max_tokens": 16},
               {"prompts": [...], "lora": {"name": "A", "id": 1, "path": "/dir"},
                "cache_salt": "tenant-a", "embeds": true,
                "kv_transfer_params": {"kvtier_chunks": 4}},
               {"corrupt": "/dir/**/*.kv"}, {"corrupt_writer": "/dir/**/*.slab"},
               {"delete": "/dir/**/*.kv"}, {"kill": "/dir"},
               {"signal": "/tmp/ready", "wait_for": "/tmp/go"}, {"sleep": 3}]}

``model`` serves another model folder than the embedded model, ``connector_module`` and
``connector_class`` name another connector (kvtier's by default), ``lora_rank`` enables LoRA
adapters up to that rank, ``prompt_embeds`` prompts given as embeddings, ``tp`` tensor
parallelism (one worker process per rank), ``kv_role`` the connector's role (default
``kv_both``), ``kv_events`` where vLLM publishes its KV events (a ZMQ endpoint). A prompt step
may name a LoRA adapter (``lora``), a ``cache_salt``, ``kv_transfer_params`` for its requests,
or give its prompts as embeddings (``embeds``: each token id's row of the model's own embedding
table, so the model sees what the ids would give it). Prompt steps run their prompts as one
batch (so they run concurrently and can preempt each other in a small pool); the other steps
damage tiers between prompts (flip bytes in files, or in the slab files of one writer process
only, i.e. one rank's parts with tensor parallelism; delete files; replace a tier's directory
with a file), synchronise with another process, or pause (``sleep``: seconds, e.g. for the
connector's writer threads to finish a promotion).
``start_when`` holds the engine's construction (not vLLM's import) until that file exists,
``run_when`` the first step (engines start up together, then compute one at a time).
The output is ``{"steps": [{"tokens": [[...], ...], "kv_transfer_params": [...], "seconds": s},
...]}``. Tests run each
engine in its own process because vLLM starts its engine processes by spawn and keeps
process-wide state.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kvtier.harness.processes import end_process_group


def _corrupt(paths: list[str]) -> None:
    for path in paths:
        size = os.path.getsize(path)
        if size < 8192:
            continue
        with open(path, "r+b") as f:  # flip bytes in the payload, past the header page
            for at in range(4096 + 512, size, 1 << 16):
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0xFF]) if byte else b"\xff")


def _damage(step: dict) -> None:
    if "corrupt" in step:
        _corrupt(sorted(glob.glob(step["corrupt"], recursive=True)))
    if "corrupt_writer" in step:  # slab files are named WRITER-SIZE.slab: one writer's only
        paths = sorted(glob.glob(step["corrupt_writer"], recursive=True))
        writers = sorted({Path(p).name.split("-")[0] for p in paths})
        if writers:
            _corrupt([p for p in paths if Path(p).name.split("-")[0] == writers[0]])
    if "delete" in step:
        for path in glob.glob(step["delete"], recursive=True):
            os.unlink(path)
    if "kill" in step:
        shutil.rmtree(step["kill"], ignore_errors=True)
        Path(step["kill"]).write_text("this tier is gone\n")
    if "signal" in step:
        Path(step["signal"]).write_text("ready\n")
    if "sleep" in step:
        time.sleep(float(step["sleep"]))
    if "wait_for" in step:
        deadline = time.monotonic() + float(step.get("timeout", 300))
        while not Path(step["wait_for"]).exists() and time.monotonic() < deadline:
            time.sleep(0.2)


class Probe:
    """One engine process running a spec, started now."""

    def __init__(self, spec: dict, workdir: Path, name: str, env: dict | None = None):
        self.spec_path = workdir / f"{name}.spec.json"
        self.out_path = workdir / f"{name}.out.json"
        self.log_path = workdir / f"{name}.log"
        self.spec_path.write_text(json.dumps(spec))
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvtier.harness.vllm_probe", self.spec_path, self.out_path],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its engine processes die with it (killpg)
        )

    def kill(self) -> None:
        """Stop the probe and every engine process it started."""
        end_process_group(self.proc)

    def result(self, timeout: float = 420) -> list[dict]:
        """The steps' outputs (RuntimeError with the log's tail when the engine failed)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = -9
        self._log.close()
        if rc != 0 or not self.out_path.exists():
            tail = self.log_path.read_text()[-4000:]
            raise RuntimeError(f"vLLM probe failed (rc={rc}):\n{tail}")
        return json.loads(self.out_path.read_text())["steps"]


def _prompts(step: dict, folder: Path) -> list:
    """A prompt step's prompts as vLLM takes them: token ids (with a salt) or embeddings."""
    from vllm.inputs import EmbedsPrompt, TokensPrompt

    salt = {"cache_salt": step["cache_salt"]} if step.get("cache_salt") else {}
    if not step.get("embeds"):
        return [TokensPrompt(prompt_token_ids=list(p), **salt) for p in step["prompts"]]
    import torch
    from safetensors import safe_open

    table = None
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            if "model.embed_tokens.weight" in f.keys():  # noqa: SIM118 - safe_open has no `in`
                table = f.get_tensor("model.embed_tokens.weight")
    if table is None:
        raise RuntimeError(f"no embedding table in {folder}")
    return [
        EmbedsPrompt(prompt_embeds=table[torch.tensor(list(p))].clone(), **salt)
        for p in step["prompts"]
    ]


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    one_process = bool(spec.get("one_process", False))
    if one_process:  # the engine core and its worker in this process: one vLLM import, not three
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    from kvtier.engines.embedded import embedded_model_folder
    from kvtier.engines.vllm.dtype import engine_dtype

    folder = Path(spec["model"]) if spec.get("model") else embedded_model_folder()[0]
    if spec.get("start_when"):
        _damage({"wait_for": spec["start_when"], "timeout": 900})
    kw: dict = {}
    if spec.get("connector") is not None:
        kw["kv_transfer_config"] = {
            "kv_connector": spec.get("connector_class", "KVTierConnector"),
            "kv_connector_module_path": spec.get(
                "connector_module", "kvtier.engines.vllm.connector"
            ),
            "kv_role": spec.get("kv_role", "kv_both"),
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": spec["connector"],
        }
    if one_process:
        kw["distributed_executor_backend"] = "uni"
    if spec.get("lora_rank"):
        kw.update(enable_lora=True, max_lora_rank=int(spec["lora_rank"]), max_loras=2)
    if spec.get("prompt_embeds"):
        kw["enable_prompt_embeds"] = True
    if spec.get("blocks"):
        kw["num_gpu_blocks_override"] = int(spec["blocks"])
    if spec.get("kv_events"):
        from vllm.config import KVEventsConfig

        kw["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=spec["kv_events"], topic="kv"
        )
    if int(spec.get("tp", 1)) > 1:
        kw["tensor_parallel_size"] = int(spec["tp"])
    llm = LLM(
        model=str(folder),
        dtype=engine_dtype(spec.get("dtype", "auto")),
        enforce_eager=True,
        max_model_len=int(spec.get("max_model_len", 4096)),
        enable_prefix_caching=bool(spec.get("prefix_caching", True)),
        max_num_seqs=int(spec.get("max_num_seqs", 8)),
        **kw,
    )
    if spec.get("run_when"):
        _damage({"wait_for": spec["run_when"], "timeout": 900})
    out: list[dict] = []
    for step in spec["steps"]:
        if "prompts" not in step:
            _damage(step)
            out.append({})
            continue
        handed = step.get("kv_transfer_params")
        params = SamplingParams(
            temperature=0,
            max_tokens=int(step.get("max_tokens", 16)),
            extra_args={"kv_transfer_params": handed} if handed else None,
        )
        prompts = _prompts(step, folder)
        lora = None
        if step.get("lora"):
            from vllm.lora.request import LoRARequest

            a = step["lora"]
            lora = LoRARequest(str(a["name"]), int(a["id"]), str(a["path"]))
        began = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
        out.append(
            {
                "tokens": [list(r.outputs[0].token_ids) for r in results],
                "kv_transfer_params": [r.kv_transfer_params for r in results],
                "seconds": time.perf_counter() - began,
            }
        )
    Path(argv[1]).write_text(json.dumps({"steps": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
