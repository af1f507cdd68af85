"""Datasets: the registry (registry.py: where each lives, how its gold answer reads), loading into one
row schema (loading.py), and preparing the train/val/eval files of the prepare stage (prepare.py).

No re-exports: importing the registry does not import the loaders."""
