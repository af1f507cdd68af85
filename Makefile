# The two commands a fresh machine needs (see README): `make repro` and `make test`.
.PHONY: setup setup-test repro test

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh test

repro: setup
	. .venv/bin/activate && dvc repro

test: setup-test
	. .venv/bin/activate && python -m pytest -q
