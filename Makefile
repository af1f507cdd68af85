# The two commands a fresh machine needs (see README): `make repro` and `make test`.
.PHONY: setup setup-test repro test

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh test

repro: setup
	. .venv/bin/activate && dvc repro

# --durations: every CI log names its slowest tests (CI must stay well inside 90 min on an AVX2 host)
test: setup-test
	. .venv/bin/activate && python -m pytest -q --durations=25
